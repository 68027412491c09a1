"""Step time with and without an optimizer barrier, against closed forms and longer simulations."""

from __future__ import annotations

import pytest

from zbsolve.schedulers.families import make_schedule
from zbsolve.core.profile import UNIT, Profile
from zbsolve.core.simulator import simulate
from zbsolve.core.step_time import step_times
from zbsolve.core.transforms import repeat

SKEWED = Profile(t_f=[1.0, 1.2, 0.9, 1.6], t_b=[1.1, 1.0, 1.3, 1.9], t_w=[0.6, 0.5, 0.7, 0.9], t_comm=0.05)


@pytest.mark.parametrize("p, m", [(4, 8), (3, 12)])
def test_one_f_one_b_cannot_overlap_steps(p, m):
    """Device 0 runs the first F and the last BW, so the next step waits for the whole of this one."""
    times = step_times(simulate(make_schedule("1f1b", UNIT, p, m)))
    assert times.step_time == times.step_time_no_barrier == 3 * (m + p - 1)
    assert times.bubble == pytest.approx((p - 1) / (m + p - 1))


@pytest.mark.parametrize("name, p, m", [("zb-h2", 4, 8), ("zb-v", 4, 8), ("zb-h2", 3, 9)])
def test_zero_bubble_schedules_have_no_bubble_without_the_barrier(name, p, m):
    """The paper's claim for ZB-H2 and ZB-V with post-validation: each step costs only its work."""
    times = step_times(simulate(make_schedule(name, UNIT, p, m)))
    assert times.step_time_no_barrier == pytest.approx(3 * m)
    assert times.bubble_no_barrier == pytest.approx(0.0, abs=1e-12)
    assert times.step_time > times.step_time_no_barrier


@pytest.mark.parametrize("name", ["1f1b", "zb-h1", "zb-h2", "gpipe"])
def test_period_is_what_more_back_to_back_steps_add(name):
    """The steady-state period equals the makespan growth between 7 and 8 back-to-back steps."""
    schedule = make_schedule(name, SKEWED, 4, 8)
    period = step_times(simulate(schedule)).step_time_no_barrier
    growth = simulate(repeat(schedule, 8)).makespan - simulate(repeat(schedule, 7)).makespan
    assert period == pytest.approx(growth)
    one = simulate(schedule)
    assert max(one.span) * (1 - 1e-9) <= period <= one.makespan * (1 + 1e-9)


def test_repeat_keeps_each_steps_orders():
    schedule = make_schedule("zb-h1", UNIT, 2, 3)
    twice = repeat(schedule, 2)
    assert twice.num_microbatches == 6
    for ops, both in zip(schedule.devices, twice.devices):
        assert both[:len(ops)] == ops
        assert [op._replace(mb=op.mb - 3) for op in both[len(ops):]] == list(ops)
