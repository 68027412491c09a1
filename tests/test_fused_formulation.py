"""The formulation against the simulator where a fused backward (BW) needs less memory than B then W (blocks that
recompute): on small random problems every order the formulation accepts simulates within its limit at the value
it gives it, every schedule the simulator accepts is feasible for the formulation that fuses, and the least memory
of one microbatch alone is a lower bound on every schedule's."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zbsolve.base.errors import ZbsolveError
from zbsolve.core.memory import fits, peak
from zbsolve.core.placement import sequential, vshape
from zbsolve.core.profile import Profile
from zbsolve.core.schedule import Schedule
from zbsolve.core.simulator import simulate
from zbsolve.core.transforms import with_limit
from zbsolve.optimize.formulation import Formulation, formulate
from zbsolve.schedulers.families import PLACEMENT_FAMILIES, make_schedule
from zbsolve.schedulers.one_at_a_time import min_feasible_limits


@st.composite
def stages(draw: st.DrawFn) -> dict[str, float | None]:
    """One stage's costs in whole units: F holds what its blocks keep, B may raise the memory (a recomputing
    stage), a recomputing B holds more while it runs, its fused BW held block by block."""
    mem_f = draw(st.integers(1, 4))
    mem_w = -draw(st.integers(0, 8))
    return {"t_f": draw(st.integers(1, 3)), "t_b": draw(st.integers(1, 4)), "t_w": draw(st.integers(1, 3)),
            "mem_f": mem_f, "mem_b": -mem_f - mem_w, "mem_w": mem_w, "mem_r": draw(st.integers(0, 4)),
            "mem_rw": draw(st.integers(0, 2))}


@st.composite
def problems(draw: st.DrawFn) -> tuple[Profile, str, int, int, float]:
    """A profile, its placement, devices, microbatches and a memory limit: one microbatch's least memory, a family's
    peak (where that family fits tightly), or between them."""
    placement = draw(st.sampled_from(("sequential", "vshape")))
    p = draw(st.integers(2, 3))
    m = draw(st.integers(p, 2 * p))
    n = p * (2 if placement == "vshape" else 1)
    costs = [draw(stages()) for _ in range(n)]
    rw = [c["mem_rw"] for c in costs] if draw(st.booleans()) else None  # a BW's own peak, or as B then W
    fields = {name: [float(c[name]) for c in costs] for name in ("t_f", "t_b", "t_w", "mem_f", "mem_b", "mem_w",
                                                                  "mem_r")}
    profile = Profile(**fields, mem_rw=rw and [float(x) for x in rw], t_comm=draw(st.integers(0, 1)))
    layout = _placement(placement, p)
    least = max(min_feasible_limits(profile, layout))
    peaks = [max(simulate(_family(name, profile, p, m)).peak_memory) for name in PLACEMENT_FAMILIES[placement]]
    limit = draw(st.sampled_from([least, *peaks]) | st.integers(int(least), int(max(least, *peaks)) + 1))
    return profile, placement, p, m, max(float(limit), least)


def _placement(name: str, p: int):
    return sequential(p) if name == "sequential" else vshape(p)


def _family(name: str, profile: Profile, p: int, m: int) -> Schedule:
    return make_schedule(name, profile, p, m)


def _accepted_orders_simulate_at_their_value(form: Formulation, schedule: Schedule) -> None:
    order = form.order_of(schedule)
    if not form.memory_ok(order):
        return
    timeline = simulate(form.schedule(order, "formulation"))  # raises where a device goes over its limit
    assert timeline.objective(form.objective) == form.to_time(form.value(form.asap(order)))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_the_formulation_agrees_with_the_simulator_on_fused_backwards(case):
    profile, placement, p, m, limit = case
    layout = _placement(placement, p)
    split = formulate(profile, layout, m, limit, "makespan")
    fused = formulate(profile, layout, m, limit, "makespan", fuse=True)
    least = min_feasible_limits(profile, layout)
    for name in PLACEMENT_FAMILIES[placement]:
        try:
            schedule = with_limit(_family(name, profile, p, m), limit) if fits(
                _family(name, profile, p, m), [limit] * p) else _family(name, profile, p, m)
        except ZbsolveError:
            continue
        for d in range(p):  # one microbatch alone needs no more than any schedule
            assert least[d] <= peak(schedule, d) + 1e-9
        for form in (split, fused):
            _accepted_orders_simulate_at_their_value(form, schedule)
        if schedule.mem_limit is not None:  # the simulator accepts it: the formulation that fuses does too
            assert fused.memory_ok(fused.order_of(schedule)), (name, schedule)
