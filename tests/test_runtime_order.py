"""A plan for a runtime that runs its own order (the runtime table's ``order`` "own": Megatron) is timed with that
order: every candidate, and the plan's schedule, are torch's built-in of Megatron's order on the plan's partition."""

from __future__ import annotations

import concurrent.futures as cf

import pytest
from conftest import act_heavy

from zbsolve.base.units import GIB
from zbsolve.core.placement import make_placement
from zbsolve.core.simulator import simulate
from zbsolve.io.targets import TARGETS
from zbsolve.io.targets.megatron import megatron_schedule
from zbsolve.io.targets.target import Target
from zbsolve.planning.planner import plan
from zbsolve.planning.result import OWN_ORDER
from zbsolve.planning.targets import may_take, partition_refusal
from zbsolve.problem.costs import model_costs
from zbsolve.problem.recompute import parse_recompute
from zbsolve.schedulers.builtins import builtin_schedule

P, M = 2, 8


def test_the_order_column_names_the_runtimes_own_schedule():
    assert {name for name, row in TARGETS.items() if row.order == "own"} == {"megatron"}
    dense, none = act_heavy(), parse_recompute("none")
    for row in TARGETS.values():
        assert (row.schedule_of(dense, P, 2, none) is None) == (row.order == "planned")
    megatron = TARGETS["megatron"]
    assert megatron.schedule_of(dense, P, 1, none) == "1F1B"
    assert megatron.schedule_of(dense, P, 3, none) == "Interleaved1F1B"
    with pytest.raises(ValueError, match="own_schedule exactly when it is 'own'"):
        Target(**{**TARGETS["megatron"].__dict__, "own_schedule": None})


def _megatron_order(model, placement, chunks, counts, recompute):
    """Megatron's order on ``counts``, simulated on the plan's costs without a memory limit."""
    profile, costs = model_costs(model, make_placement(placement, P, chunks), counts, 7 * GIB, 0,
                                 parse_recompute(recompute))
    return simulate(builtin_schedule(megatron_schedule(chunks), profile, P, M, chunks)), costs


def test_a_megatron_plan_is_megatrons_own_order_on_its_partition():
    model = act_heavy()
    with cf.ThreadPoolExecutor(1) as pool:
        result = plan(model, num_devices=P, num_microbatches=M, device_memory=7 * GIB, reserve=0, recompute="auto",
                      chunks="auto", target="megatron", time_limit=4, executor=pool)
    schedule = result.timeline.schedule
    own, costs = _megatron_order(model, result.placement, result.chunks, result.counts, result.recompute)
    assert schedule.devices == own.schedule.devices  # pass for pass, on every device
    assert result.step_time == own.makespan == simulate(schedule).makespan
    assert costs.first_over(own.peak_memory) is None
    assert result.source.endswith(OWN_ORDER) or result.source.startswith("baseline")
    assert "Megatron (megatron-core 0.16.1)'s own order" in result.log
    for candidate in result.candidates:  # each timed with Megatron's order, infinite where it does not fit
        timeline, costs = _megatron_order(model, candidate.placement, candidate.chunks, candidate.counts,
                                          candidate.recompute)
        fits = costs.first_over(timeline.peak_memory) is None
        assert candidate.step_time == (timeline.makespan if fits else float("inf"))
    takes = [b.step_time for b in result.baselines
             if b.fits and b.step_time is not None and b.schedule == megatron_schedule(b.chunks)
             and may_take("megatron", "auto", b.recompute, model) and b.counts is not None
             and partition_refusal("megatron", model, b.counts, P) is None]
    assert takes and result.step_time <= min(takes)


def test_a_zbsolve_plan_keeps_its_searched_order():
    with cf.ThreadPoolExecutor(1) as pool:
        result = plan(act_heavy(), num_devices=P, num_microbatches=M, device_memory=7 * GIB, reserve=0,
                      placement="interleaved", time_limit=4, executor=pool)
    assert not result.source.endswith(OWN_ORDER) and OWN_ORDER not in result.log
