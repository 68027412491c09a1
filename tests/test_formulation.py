"""The integer formulation, the lower bound and both backends against brute force on tiny problems."""

from __future__ import annotations

import itertools
from fractions import Fraction
from pathlib import Path

import pytest

from zbsolve.backends.cbc import solve_cbc
from zbsolve.backends.cpsat import solve_cpsat
from zbsolve.bound import lower_bound, warmup_bound
from zbsolve.errors import InputError, MemoryLimitError
from zbsolve.families import make_schedule
from zbsolve.formulation import formulate
from zbsolve.heuristic import heuristic
from zbsolve.placement import sequential, vshape
from zbsolve.problem import Problem
from zbsolve.profile import UNIT, Profile
from zbsolve.schedule import B, F, W
from zbsolve.simulator import simulate

ICLR = sorted(Path(__file__).resolve().parent.parent.glob("problems/iclr/*.yaml"))
PROFILE_1_5B = Profile.from_paper(T_F=18522, T_B=18086, T_W=9337, T_comm=601, M_B=201216, M_W=73728)
SKEWED = Profile(t_f=[1.0, 1.5], t_b=[1.0, 2.0], t_w=[0.5, 1.0], t_comm=0.25)


def _interleavings(form, d):
    """Every order of device d's passes that keeps each kind in microbatch order and runs each
    microbatch's F, B, W in that order (the only orders without a deadlock)."""
    stage = form.placement.routes[0].index(d)
    m = form.num_microbatches

    def extend(order, seen):
        if len(order) == 3 * m:
            yield list(order)
        for k, before in ((F, None), (B, F), (W, B)):
            if seen[k] < m and (before is None or seen[k] < seen[before]):
                order.append(form.index_of(k, seen[k], stage))
                seen[k] += 1
                yield from extend(order, seen)
                seen[k] -= 1
                order.pop()

    yield from extend([], {F: 0, B: 0, W: 0})


def _brute_force(form):
    """Smallest objective over all orders (with same-kind passes in microbatch order) and its order."""
    p = form.num_devices
    per_device = [[o for o in _interleavings(form, d) if form.memory_ok([o if e == d else [] for e in range(p)])]
                  for d in range(form.num_devices)]
    best = None
    for combo in itertools.product(*per_device):
        try:
            value = form.value(form.asap(combo))
        except InputError:
            continue
        if best is None or value < best[0]:
            best = (value, [list(o) for o in combo])
    return best


def test_times_and_memory_scale_to_exact_integers():
    form = formulate(PROFILE_1_5B, sequential(4), 4, 4 * 201216)
    assert form.time_scale == 1 and form.exact_time
    mf, mb, mw = (form.mem_delta[form.index_of(k, 0, 0)] for k in (F, B, W))
    assert (mf * form.mem_unit, mb * form.mem_unit, mw * form.mem_unit) == (201216, -127488, -73728)
    assert Fraction(mf).denominator == 1 and abs(mf) > 1
    assert form.limit == (4 * mf,) * 4
    quarter = formulate(Profile(t_f=0.25, t_b=0.5, t_w=0.75, t_comm=0.1), sequential(2), 2)
    assert quarter.time_scale == 100 and quarter.exact_time
    assert quarter.duration[quarter.index_of(F, 0, 0)] == 25
    assert not formulate(Profile(t_f=1 / 3), sequential(2), 2).exact_time


def test_memory_check_agrees_with_the_simulator():
    schedule = make_schedule("zb-h2", UNIT, 4, 8)
    peak = max(simulate(schedule).peak_memory)
    for limit in (peak - 0.5, peak - 1e-12, peak, peak + 0.25):
        form = formulate(UNIT, sequential(4), 8, limit)
        ok = form.memory_ok(form.order_of(schedule))
        try:
            simulate(form.schedule(form.order_of(schedule), "x"))
            assert ok
        except MemoryLimitError:
            assert not ok


@pytest.mark.parametrize("family", ["zb-h1", "zb-h2", "1f1b"])
@pytest.mark.parametrize("profile", [PROFILE_1_5B, UNIT])
def test_asap_matches_the_simulator(family, profile):
    schedule = make_schedule(family, profile, 4, 8)
    form = formulate(profile, sequential(4), 8)
    order = form.order_of(schedule)
    start = form.asap(order)
    timeline = simulate(form.schedule(order, "x"))
    assert timeline.makespan <= simulate(schedule).makespan
    for d, seq in enumerate(order):
        assert [start[i] for i in seq] == [t * form.time_scale for t in timeline.start[d]]
    assert form.value(start) == max(timeline.span) * form.time_scale


def test_order_of_splits_bw_and_first_last_passes():
    form = formulate(UNIT, sequential(3), 4)
    order = form.order_of(make_schedule("1f1b", UNIT, 3, 4))
    assert sorted(i for seq in order for i in seq) == list(range(len(form.passes)))
    for d in range(3):
        assert form.passes[form.first[d]] == (F, 0, d) and [form.passes[i] for i in form.last[d]] == [(W, 3, d)]
        assert order[d][0] == form.first[d] and order[d][-1] in form.last[d]


def test_earliest_and_latest_bracket_every_schedule():
    form = formulate(SKEWED, sequential(2), 4)
    for family in ("zb-h1", "zb-h2", "1f1b"):
        start = form.asap(form.order_of(make_schedule(family, SKEWED, 2, 4)))
        latest = form.latest(form.value(start))
        assert all(e <= s <= lt for e, s, lt in zip(form.earliest, start, latest))


def test_bad_input():
    with pytest.raises(InputError, match="objective"):
        formulate(UNIT, sequential(2), 2, objective="area")
    with pytest.raises(InputError, match="num_microbatches"):
        formulate(UNIT, sequential(2), 0)
    with pytest.raises(InputError, match="mem_limit"):
        formulate(UNIT, sequential(2), 2, [1.0, 2.0, 3.0])


SKEWED_3 = Profile(t_f=[1.0, 1.5, 1.0], t_b=[1.0, 2.0, 1.5], t_w=[0.5, 1.0, 1.0], t_comm=0.25)


@pytest.mark.parametrize("profile, p, m, limit, objective", [
    (UNIT, 2, 3, None, "span"), (UNIT, 2, 3, 1.5, "span"), (SKEWED, 2, 3, None, "span"),
    (SKEWED, 2, 3, 2.0, "makespan"), (SKEWED, 2, 3, 2.0, "span"), (PROFILE_1_5B, 2, 3, 1.7 * 201216, "span"),
    (SKEWED_3, 3, 2, 1.5, "span"), (SKEWED_3, 3, 2, None, "makespan"),
])
def test_backends_match_brute_force(profile, p, m, limit, objective):
    form = formulate(profile, sequential(p), m, limit, objective)
    value, order = _brute_force(form)
    simulate(form.schedule(order, "brute force"))
    bound = lower_bound(form)
    assert bound <= warmup_bound(form, 5.0, 1) <= value
    serial = [sorted(ps, key=lambda i: (form.passes[i].mb, "FBW".index(form.passes[i].kind)))
              for ps in form.device_passes()]
    assert form.value(form.asap(serial)) > value
    for result in (solve_cpsat(form, serial, time_limit=20, workers=1, seed=0, lower=bound),
                   solve_cbc(form, serial, time_limit=20, workers=1, lower=bound)):
        assert result.optimal
        timeline = simulate(form.schedule(result.order, "x"))
        got = max(timeline.span) if objective == "span" else timeline.makespan
        assert got * form.time_scale == value


@pytest.mark.parametrize("p", [2, 3, 4, 6])
def test_bound_is_zb_h1_bubble_at_1f1b_memory(p):
    form = formulate(UNIT, sequential(p), 3 * p, float(p))
    assert lower_bound(form) == 9 * p + (p - 1) * (1 + 1 - 1)


@pytest.mark.parametrize("path", ICLR, ids=lambda path: path.stem)
def test_bound_meets_published_zb_1p(path):
    problem = Problem.load(path)
    p, m = problem.num_devices, problem.num_microbatches
    profile = problem.profile.expand(p)
    form = formulate(profile, sequential(p), m, p * profile.stage_value("mem_f", 0))
    bound, work = lower_bound(form), max(form.work)
    assert round((bound - work) / bound, 4) == problem.published["zb-1p"]


def test_multi_stage_devices_use_the_reservoir():
    placement = vshape(2)
    form = formulate(UNIT, placement, 3, 2.5)
    warm = heuristic(UNIT, placement, 3, 2.5)
    result = solve_cpsat(form, form.order_of(warm), time_limit=20, workers=1, seed=0, lower=lower_bound(form))
    timeline = simulate(form.schedule(result.order, "x"))
    assert result.optimal and max(timeline.peak_memory) <= 2.5
    assert max(timeline.span) <= max(simulate(warm).span)


def test_warmup_relaxation_bound_beats_earliest_starts_at_twice_1f1b_memory():
    problem = Problem.load(ICLR[0].parent / "1.5b-p8-m32.yaml")
    p, m = problem.num_devices, problem.num_microbatches
    profile = problem.profile.expand(p)
    limit = 2 * p * profile.stage_value("mem_f", 0)
    form = formulate(profile, sequential(p), m, limit)
    warm = simulate(heuristic(profile, sequential(p), m, limit))
    cheap, relaxed = lower_bound(form), warmup_bound(form, 10.0, 1)
    assert cheap == max(form.work) < relaxed <= max(warm.span) * form.time_scale
