"""The periodic formulation: one pattern valid for every microbatch count, the least period where it is known, the
memory rule over every repetition, and its schedule kept by a solve where it beats the warm starts."""

import math
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zbsolve import UNIT, Profile, simulate
from zbsolve.core.memory import fits
from zbsolve.core.spec import make_spec
from zbsolve.optimize.periodic import periodic
from zbsolve.optimize.solve import solve
from zbsolve.schedulers.families import make_schedule

SECONDS = 30.0
"""A deadline these problems (a few dozen passes, solved in milliseconds) never reach on any machine."""


def _pattern(profile, limit, p, m, placement="sequential", warm=None):
    spec = make_spec(profile, limit, num_microbatches=m, num_devices=p, placement=placement)
    return spec, periodic(spec, time.monotonic() + SECONDS, 1, warm)


@pytest.mark.parametrize("placement", ["sequential", "interleaved", "vshape"])
def test_unit_period_is_the_work_of_a_device(placement):
    """Without a memory limit the least period there is (a device's work per microbatch) is found, and the schedule
    of m microbatches ends by (m - 1) periods and one microbatch's span."""
    spec, found = _pattern(UNIT, None, 4, 16, placement)
    assert found.to_time(found.period) == pytest.approx(3.0)
    timeline = simulate(found.schedule(spec))
    assert timeline.makespan <= found.to_time(found.makespan(16)) + 1e-9


def test_one_pattern_serves_every_microbatch_count():
    """The pattern found for 8 microbatches, repeated for 1 to 200, gives valid schedules within the memory limit,
    each ending by (m - 1) periods and one microbatch's span."""
    profile = Profile(t_f=1.0, t_b=1.5, t_w=0.7, t_comm=0.1)
    spec, found = _pattern(profile, 3.0, 4, 8)
    for m in (1, 2, 7, 50, 200):
        longer = make_spec(profile, 3.0, num_microbatches=m, num_devices=4)
        schedule = found.schedule(longer)
        assert fits(schedule, longer.limits)
        assert simulate(schedule).makespan <= found.to_time(found.makespan(m)) + 1e-9


def test_memory_lengthens_the_period():
    """At 2.5 microbatches' activations a first device cannot hold the 3 microbatches that a period of 3 keeps
    between an F and its B (8 unit passes apart), so the period is longer, and the schedule stays within 2.5."""
    spec, found = _pattern(UNIT, 2.5, 4, 32)
    assert found.to_time(found.period) > 3.0
    schedule = found.schedule(spec)
    assert simulate(schedule).peak <= 2.5
    assert fits(schedule, spec.limits)


def test_a_warm_schedule_that_repeats_is_a_pattern_of_its_period():
    """ZB-V's steady state repeats every device's work; from its middle microbatch the pattern of that period is
    found at once, and its schedule is valid."""
    profile = Profile(t_f=1.013, t_b=2.11, t_w=0.97, t_comm=0.013)
    warm = simulate(make_schedule("zb-v", profile, 4, 16))
    spec, found = _pattern(profile, None, 4, 16, "vshape", warm)
    assert found.to_time(found.period) == pytest.approx(1.013 + 2.11 + 0.97)
    simulate(found.schedule(spec))


def test_a_solve_keeps_the_periodic_schedule_where_memory_binds_the_heuristic():
    """Unit costs, 4 devices, 32 microbatches, 2.5 microbatches' memory: the heuristic's schedule takes 195, the
    pattern's 133; the solve returns the faster, named periodic."""
    result = solve(UNIT, 2.5, num_microbatches=32, num_devices=4, solver="heuristic", time_limit=SECONDS)
    assert "heuristic: objective 195" in result.solver_log
    assert result.schedule.name == "periodic"
    assert simulate(result.schedule).makespan == result.step_time == 133.0


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p=st.integers(1, 4), m=st.integers(1, 12), placement=st.sampled_from(["sequential", "interleaved", "vshape"]),
       times=st.tuples(*(st.integers(1, 9),) * 3), comm=st.integers(0, 3), room=st.floats(0.0, 3.0),
       recompute=st.booleans())
def test_patterns_are_valid_schedules(p, m, placement, times, comm, room, recompute):
    """On random costs, and limits from one microbatch's need upwards or none, every pattern found is a valid
    schedule within the limit whose makespan is at most (m - 1) periods and one microbatch's span; without a limit
    one is always found."""
    t_f, t_b, t_w = times
    mem = dict(mem_f=0.25, mem_b=0.5, mem_w=-0.75, mem_r=0.75) if recompute else {}
    profile = Profile(t_f=t_f, t_b=t_b, t_w=t_w, t_comm=comm / 2, **mem)
    chunks = 1 if placement == "sequential" else 2
    one = simulate(make_schedule("1f1b", profile, 1, 1)).peak * chunks
    limit = None if room > 2.5 else one + room
    spec, found = _pattern(profile, limit, p, m, placement)
    if found is None:
        assert limit is not None  # without a limit a period of a device's work per microbatch, or a longer, holds
        return
    schedule = found.schedule(spec)
    assert fits(schedule, spec.limits)
    assert simulate(schedule).makespan <= found.to_time(found.makespan(m)) + 1e-9
    assert found.period >= max(math.ceil(w / found.quantum) for w in found.form.work)
