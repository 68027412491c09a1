"""Overlap as each runtime runs it: torchtitan 0.3.0 runs an F&B pair's passes one after the other (torch's
``_PipelineScheduleRuntime`` without a function for OVERLAP_F_B; torchtitan removed DualPipeV's expert-parallel
overlap, pytorch/torchtitan #2774), so its plans search no pairs and its DualPipeV baselines are timed without
overlap; zbsolve's executor overlaps them."""

from __future__ import annotations

import concurrent.futures as cf

import pytest

from zbsolve.base.units import GIB
from zbsolve.core.placement import make_placement
from zbsolve.core.schedule import Pair, pair_count, passes_of
from zbsolve.core.simulator import simulate
from zbsolve.core.transforms import unpaired
from zbsolve.costmodel.model import Layer, Model
from zbsolve.io.targets import TARGETS
from zbsolve.io.targets.torchtitan import TORCHTITAN
from zbsolve.planning.baselines import baseline_rows
from zbsolve.planning.planner import plan
from zbsolve.planning.runs import BaselineSetting
from zbsolve.problem.costs import model_costs
from zbsolve.schedulers.builtins import builtin_schedule

P, M = 2, 6


def experts() -> Model:
    """Six blocks with experts, half of each F and B all-to-all, between an embedding and a head."""
    def layer(name: str, comm: float | None) -> Layer:
        return Layer(name=name, block=comm is not None, t_f=1.0, t_b=1.0, t_w=0.5, mem_f=2, mem_b=-1, mem_w=-1,
                     static_bytes=10, out_bytes=1, comm_f=comm, comm_b=comm)

    return Model(name="experts", layers=[layer("tok_embeddings", None), *(layer(f"layers.{i}", 0.5) for i in range(6)),
                                         layer("output", None)])


def test_each_runtime_row_says_whether_it_overlaps_a_pair():
    assert {name for name, row in TARGETS.items() if row.pairs} == {"zbsolve"}
    assert TORCHTITAN.pairs_refusal(0) is None
    assert TORCHTITAN.pairs_refusal(3) == ("the schedule runs 3 overlapped F&B pair(s): torchtitan 0.3.0 runs a "
                                           "pair's passes one after the other, not overlapped (runtime table: "
                                           "torchtitan.pairs)")


def _dualpipev(moe):
    counts = (2, 2, 2, 2)
    profile, _ = model_costs(moe, make_placement("vshape", P, 2), counts, 80 * GIB, 0)
    return builtin_schedule("DualPipeV", profile, P, M), counts


def test_unpaired_runs_each_pair_as_its_f_then_its_b():
    schedule, _ = _dualpipev(experts())
    assert pair_count(schedule) > 0
    flat = unpaired(schedule)
    assert pair_count(flat) == 0
    assert flat.devices == tuple(tuple(p for op in ops for p in passes_of(op)) for ops in schedule.devices)
    assert [ops.index(op.f) + 1 == ops.index(op.b) for d, ops in enumerate(flat.devices)
            for op in schedule.devices[d] if isinstance(op, Pair)] == [True] * pair_count(schedule)
    # the pairs hide communication: run one pass after the other, the step is longer
    assert simulate(flat).makespan > simulate(schedule).makespan


def test_dualpipev_baselines_are_timed_as_the_runtime_runs_pairs():
    moe = experts()
    overlapped, flat = (baseline_rows(BaselineSetting(moe, P, M, 80 * GIB, 0, overlap=overlap))
                        for overlap in (True, False))
    assert [(b.split, b.schedule, b.recompute) for b in overlapped] == [(b.split, b.schedule, b.recompute)
                                                                         for b in flat]
    timed = [(a, b) for a, b in zip(overlapped, flat) if a.step_time is not None]
    assert any(a.schedule == "DualPipeV" for a, _ in timed)
    for a, b in timed:
        if a.schedule == "DualPipeV":  # pairs on every split: longer without overlap
            assert b.step_time > a.step_time
        else:
            assert b == a


def test_a_torchtitan_plan_of_experts_runs_no_pair():
    moe = experts()
    # a search this small ends long before its time limit: every baseline row is timed, under any load
    with cf.ThreadPoolExecutor(1) as pool:  # candidates timed in this process: a worker's start costs more
        titan = plan(moe, num_devices=P, num_microbatches=M, device_memory="80GiB", placement="vshape",
                     time_limit=60, executor=pool, target="torchtitan")
    assert pair_count(titan.timeline.schedule) == 0
    assert simulate(titan.timeline.schedule).makespan == pytest.approx(titan.step_time)
    unpaired_rows = baseline_rows(BaselineSetting(moe, P, M, 80 * GIB, overlap=False))
    assert [b.step_time for b in titan.baselines] == [b.step_time for b in unpaired_rows]
    fitting = [b.step_time for b in titan.baselines if b.fits and b.placement == "vshape" and b.recompute == "none"]
    assert fitting and titan.step_time <= min(fitting) * (1 + 1e-9)
    assert "torchtitan" in titan.runtimes
