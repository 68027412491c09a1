"""solve() with several stages per device (V-shape, interleaved) against exhaustive search.

Results are checked for what holds whatever the time limit; a claim of optimality, when made, is checked by
exhaustive search, and "optimal" is asserted only where the warm start meets the bound (no search needed).
"""

from __future__ import annotations

import pytest

from conftest import brute_force, check_result
from zbsolve import UNIT, InputError, Profile, simulate, solve
from zbsolve.optimize.bound import lower_bound
from zbsolve.schedulers.families import make_schedule
from zbsolve.optimize.formulation import Formulation, formulate
from zbsolve.schedulers.heuristic import heuristic
from zbsolve.core.placement import interleaved, sequential, vshape
from zbsolve.problem.memory_factor import reference_peak
from zbsolve.core.schedule import B, F, build

SKEWED = Profile(t_f=[1.0, 1.5], t_b=[1.0, 2.0], t_w=[0.5, 1.0], t_comm=0.25)
UNEVEN_3 = Profile(t_f=[1.0, 1.5, 1.2], t_b=[1.1, 2.0, 1.3], t_w=[0.6, 1.0, 0.9], t_comm=0.2)


def better_exists(form: Formulation, target: int) -> bool:
    """Whether some per-device pass order within the memory limit has a scaled objective below ``target``.

    Exhaustive: the device free soonest picks its next pass among all whose same-device predecessors ran
    (each tuple of per-device orders is reached once, timed as soon as possible); a branch stops when a
    device's free time plus its remaining work reaches ``target``."""
    n, p = len(form.passes), form.num_devices
    preds = form.predecessors()
    local = [[a for a, _ in preds[i] if form.device[a] == form.device[i]] for i in range(n)]
    mine = form.device_passes()
    start: list[int | None] = [None] * n
    free, level, left = [0] * p, [0] * p, list(form.work)
    waiting: list[int | None] = [None] * p

    def resolve() -> list[tuple[int, int, int]]:
        fixed = []
        changed = True
        while changed:
            changed = False
            for d, x in enumerate(waiting):
                if x is not None and all(start[a] is not None for a, _ in preds[x]):
                    start[x] = max([free[d]] + [start[a] + form.duration[a] + lag for a, lag in preds[x]])
                    fixed.append((d, x, free[d]))
                    free[d], left[d], waiting[d], changed = start[x] + form.duration[x], left[d] - form.duration[x], None, True
        return fixed

    def search() -> bool:
        fixed = resolve()
        try:
            if max(f + w - o for f, w, o in zip(free, left, form.offset)) >= target:
                return False
            open_devices = [d for d in range(p) if waiting[d] is None and left[d] > 0]
            if not open_devices:
                return all(x is None for x in waiting) and form.value(start) < target
            d = min(open_devices, key=lambda e: (free[e], e))
            for x in mine[d]:
                if start[x] is None and all(start[a] is not None for a in local[x]):
                    new = level[d] + form.mem_delta[x]
                    if form.limit[d] is not None and new > form.limit[d]:
                        continue
                    waiting[d], level[d] = x, new
                    if search():
                        return True
                    waiting[d], level[d] = None, new - form.mem_delta[x]
            return False
        finally:
            for d, x, f in reversed(fixed):
                waiting[d], left[d], free[d], start[x] = x, left[d] + form.duration[x], f, None

    return search()


COMM = Profile(t_f=[1.0, 1.0], t_b=[1.0, 1.0], t_w=[0.5, 0.5], t_comm=0.5)


@pytest.mark.parametrize("profile, layout, m, limit", [
    (COMM, vshape(2), 3, 1.0), (COMM, vshape(2), 3, 1.5), (SKEWED, vshape(2), 3, 1.0), (COMM, interleaved(2), 3, 1.0),
    (SKEWED, vshape(2), 4, 1.5),
])
def test_multistage_bound_is_valid_and_above_the_work(profile, layout, m, limit):
    """No order beats the bound (exhaustive search), and the bound sees idle time beyond the work."""
    form = formulate(profile.per_chunk(2, 2), layout, m, limit)
    bound = lower_bound(form)
    assert bound > max(form.work)
    assert not better_exists(form, bound)


def test_exhaustive_search_agrees_with_brute_force_on_a_sequential_problem():
    form = formulate(SKEWED, sequential(2), 3, 2.0)
    value, _ = brute_force(form)
    assert not better_exists(form, value) and better_exists(form, value + 1)


@pytest.mark.parametrize("profile, name, m, limit", [
    (UNIT, "vshape", 2, None), (UNIT, "vshape", 2, 1.5), (UNIT, "vshape", 3, 1.5), (UNIT, "vshape", 3, 1.0),
    (SKEWED, "vshape", 2, 2.0), (SKEWED, "vshape", 3, None), (UNIT, "interleaved", 2, 1.5),
    (SKEWED, "interleaved", 2, 2.0),
])
def test_tiny_multichunk_problems_against_exhaustive_search(profile, name, m, limit):
    """Valid, within the limit, never worse than the heuristic; no order beats the proven bound; the result's
    own order is one the exhaustive search reaches; when the solve says "optimal", no order beats it."""
    result = solve(profile, limit, num_microbatches=m, num_devices=2, placement=name, time_limit=5, workers=1,
                   objective="span")
    check_result(result, limit)
    layout = vshape(2) if name == "vshape" else interleaved(2)
    form = formulate(profile.per_chunk(2, 2), layout, m, limit)
    value = round(result.objective * form.time_scale)
    bound = round(result.lower_bound * form.time_scale)
    assert lower_bound(form) <= bound <= value
    assert not better_exists(form, bound), "no order beats a proven bound (nor a claimed optimum)"
    assert better_exists(form, value + 1)
    if result.status == "optimal":
        assert bound == value and result.gap == 0


def test_same_device_stage_transitions_carry_no_communication():
    form = formulate(Profile(t_comm=0.5).per_chunk(3, 2), vshape(3), 2)
    for a, b, lag in form.edges:
        assert lag == (0 if form.device[a] == form.device[b] else 5)
    middle = form.index_of(F, 0, 2), form.index_of(F, 0, 3)
    assert (*middle, 0) in form.edges and (form.index_of(B, 0, 3), form.index_of(B, 0, 2), 0) in form.edges


@pytest.mark.parametrize("factor", [1.0, 0.5, 1 / 3])
def test_never_worse_than_the_warm_starts(factor):
    p, m = 4, 8
    limit = factor * reference_peak(UNIT, p, m)
    result = solve(UNIT, limit, num_microbatches=m, num_devices=p, placement="vshape", time_limit=3, workers=1,
                   objective="span")
    check_result(result, limit)
    starts = [simulate(heuristic(UNIT.per_chunk(p, 2), vshape(p), m, limit))]
    for name in ("zb-v", "v-half", "v-min"):
        s = make_schedule(name, UNIT, p, m)
        if max(simulate(s).peak_memory) <= limit:
            starts.append(simulate(build(name, s.placement, m, s.profile, s.devices, limit)))
    assert len(starts) > 1 or factor < 0.5
    assert all(result.objective <= max(t.span) for t in starts)


def test_zb_v_at_1f1b_memory_is_proven_bubble_free():
    """The warm start (ZB-V, the greedy) meets the lower bound: optimal without search."""
    p, m = 4, 8
    result = solve(UNIT, float(p), num_microbatches=m, num_devices=p, placement="vshape", solver="heuristic",
                   objective="span")
    check_result(result, float(p))
    assert result.status == "optimal" and result.gap == 0
    assert result.paper_bubble == 0 and result.objective == 3 * m


@pytest.mark.parametrize("profile", [UNEVEN_3, Profile(t_comm=0.3)])
def test_bound_never_exceeds_a_feasible_schedule(profile):
    """The V-shape bound (before clamping to the result) is below the solve's schedule and every V family's."""
    result = solve(profile, 2.0, num_microbatches=3, num_devices=3, placement="vshape", time_limit=5, workers=1)
    check_result(result, 2.0)
    form = formulate(profile.per_chunk(3, 2), vshape(3), 3, 2.0)
    bound = lower_bound(form)
    assert bound <= round(result.objective * form.time_scale)
    for name in ("zb-v", "v-half", "v-min"):
        assert bound <= round(max(simulate(make_schedule(name, profile, 3, 3)).span) * form.time_scale)


def test_chunk_profile_and_stage_profile_give_the_same_problem():
    """A p-stage profile split by solve and the same profile given per chunk: the same problem, so the same
    warm start (solver "heuristic": no timed search to differ)."""
    per_stage = solve(UNEVEN_3, None, num_microbatches=3, placement="vshape", solver="heuristic")
    chunked = UNEVEN_3.per_chunk(3, 2)
    per_chunk = solve(chunked, None, num_microbatches=3, num_devices=3, placement="vshape", solver="heuristic")
    assert per_stage.schedule.num_stages == 6 and per_chunk.schedule.profile == chunked
    assert per_stage.schedule == per_chunk.schedule
    assert per_stage.objective == per_chunk.objective and per_stage.lower_bound == per_chunk.lower_bound


@pytest.mark.parametrize("kwargs, message", [
    ({"chunks": 0}, "chunks = 0 .*smallest valid: 1"), ({"chunks": 3}, "chunks = 3 .*even.*smallest valid: 2"),
    ({"chunks": 1.5}, "chunks"), ({"profile": Profile(t_f=[1.0, 1.0, 1.0])}, "3 stages.*give 2 or 4"),
    ({"placement": "bidirectional"}, "placement"),
    ({"placement": "sequential", "profile": Profile(t_f=[1.0] * 4)}, "4 stages.*chunks=2"),
])
def test_bad_multichunk_input_names_the_value(kwargs, message):
    args = {"profile": UNIT, "placement": "vshape", "num_devices": 2, **kwargs}
    with pytest.raises(InputError, match=message):
        solve(args.pop("profile"), 2.0, num_microbatches=2, time_limit=5, workers=1, **args)
