"""Megatron's combined 1F1B as zbsolve runs it: the order megatron-core 0.16.1 runs with
--overlap-moe-expert-parallel-comm (one more warm-up forward, each steady-state forward and backward as one pair),
timed by the overlap rule, chosen exactly where ``combined_refusal`` allows it, for the plan, the baselines and the
export alike."""

from __future__ import annotations

import concurrent.futures as cf
import shlex
from dataclasses import replace
from types import SimpleNamespace

import pytest
from conftest import COMBINED_CASES, combined_toy

from zbsolve.base.errors import InputError
from zbsolve.base.units import GIB
from zbsolve.core.placement import make_placement
from zbsolve.core.profile import Profile
from zbsolve.core.schedule import BW, F, Op, Pair, Pass, pair_count
from zbsolve.core.simulator import simulate
from zbsolve.io.targets.megatron import MEGATRON, megatron_args
from zbsolve.io.targets.megatron.layout import layout_counts
from zbsolve.io.targets.megatron.overlap import COMBINED_FLAGS, combined_refusal
from zbsolve.io.targets.plan import Plan
from zbsolve.planning.baselines import baseline_rows
from zbsolve.planning.planner import plan
from zbsolve.planning.runs import BaselineSetting, builtin_run
from zbsolve.problem.partition import partition
from zbsolve.problem.recompute import FULL, NONE, Recompute
from zbsolve.schedulers.builtins import COMBINED, builtin_schedule, megatron_builtin


def _megatron_core_order(p: int, v: int, m: int, d: int, overlap: bool) -> list[Op]:
    """Rank ``d``'s passes as megatron-core's ``forward_backward_pipelining_with_interleaving`` runs them: its warm-up
    count (``get_pp_rank_microbatches``), its table of (microbatch, chunk) per virtual microbatch
    (``get_schedule_table``, groups of p), backwards' chunks reversed; each steady-state step's forward and backward
    together (a pair) where ``overlap`` (``forward_backward_helper_wrapper``'s combined 1F1B path)."""
    schedules = pytest.importorskip("megatron.core.pipeline_parallel.schedules",
                                    reason="megatron-core is not installed (the dev extra pins 0.16.1)")
    group = SimpleNamespace(size=lambda: p, rank=lambda: d)
    total, _, warm, remaining = schedules.get_pp_rank_microbatches(
        m, v, p, overlap_moe_expert_parallel_comm=overlap,
        p2p_communicator=SimpleNamespace(pp_group=group, virtual_pipeline_model_parallel_size=v))
    table = schedules.get_schedule_table(m, v, p)

    def f(k: int) -> Pass:
        return Pass(F, table[k][0], table[k][1] * p + d)

    def b(k: int) -> Pass:
        return Pass(BW, table[k][0], (v - 1 - table[k][1]) * p + d)

    ops: list[Op] = [f(k) for k in range(warm)]
    for k in range(remaining):
        ops += [Pair(f(warm + k), b(k))] if overlap else [f(warm + k), b(k)]
    return ops + [b(k) for k in range(remaining, total)]


@pytest.mark.parametrize("p, v, m", [(2, 2, 4), (2, 2, 8), (4, 2, 8), (2, 3, 6), (4, 3, 4)])
def test_the_combined_order_is_megatron_cores(p, v, m):
    plain, combined = (builtin_schedule(name, Profile(), p, m, v) for name in (megatron_builtin(v), COMBINED))
    for d in range(p):
        assert list(plain.devices[d]) == _megatron_core_order(p, v, m, d, overlap=False)
        assert list(combined.devices[d]) == _megatron_core_order(p, v, m, d, overlap=True)
    assert pair_count(combined) > 0 and combined.name == COMBINED
    simulate(combined)  # dependencies hold


def test_without_pipeline_it_is_megatron_cores_combined_1f1b_without_pipelining():
    """combined_1f1b_schedule_for_no_pipelining: the first forward alone, then each next forward with the backward
    before it, the last backward alone."""
    m = 4
    ops = builtin_schedule(COMBINED, Profile(), 1, m, 1).devices[0]
    assert list(ops) == [Pass(F, 0, 0), *(Pair(Pass(F, j + 1, 0), Pass(BW, j, 0)) for j in range(m - 1)),
                         Pass(BW, m - 1, 0)]


def _setting(comm: float) -> BaselineSetting:
    model = combined_toy()
    layers = [layer.model_copy(update={"comm_f": comm, "comm_b": comm}) if layer.experts else layer
              for layer in model.layers]
    return BaselineSetting(model.model_copy(update={"layers": layers}), 2, 8, 80 * GIB, 0, overlap=False)


COUNTS = (3, 2, 2, 2)
"""The export toy's nine layers over two devices of two stages each."""


def test_the_combined_order_hides_a_large_all_to_all_and_fits_its_memory():
    slow = _setting(0.8)
    plain, _ = builtin_run(slow, "Interleaved1F1B", 2, COUNTS, NONE)
    combined, costs = builtin_run(slow, COMBINED, 2, COUNTS, NONE, limited=True)  # raises where over the budgets
    assert combined.makespan < plain.makespan
    assert costs.first_over(combined.peak_memory) is None
    # one more forward held in the warm-up
    assert max(combined.peak_memory) > max(plain.peak_memory)


def test_megatrons_rows_run_the_order_megatron_runs():
    setting = _setting(0.5)
    model = setting.model
    assert MEGATRON.schedule_of(model, 2, 2, NONE) == COMBINED
    assert MEGATRON.schedule_of(model, 2, 2, FULL) == "Interleaved1F1B"
    assert MEGATRON.schedule_of(model, 2, 2, Recompute("none", modules=("moe",))) == "Interleaved1F1B"
    assert MEGATRON.schedule_of(model, 2, 1, NONE) == "1F1B"
    assert MEGATRON.schedule_of(combined_toy(experts=False), 2, 2, NONE) == "Interleaved1F1B"
    rows = baseline_rows(BaselineSetting(model, 2, 8, 80 * GIB, 0, layout="Ett|tt|t|tL", overlap=False))
    megatron = [row for row in rows if row.split == "layout"]
    for row in megatron:  # combined 1F1B without blocks recomputed whole, and without the moe module recomputed
        combined = row.recompute == "none" or (row.recompute.startswith("modules:") and "moe" not in row.recompute)
        assert row.schedule == (COMBINED if combined else "Interleaved1F1B")
    assert any(row.schedule == COMBINED and row.fits for row in megatron)
    # torch's own Interleaved1F1B rows stay torch's
    assert not any(row.schedule == COMBINED for row in rows if row.split != "layout")


def _plan(case: str) -> tuple[Plan, str | None]:
    """A plan of ``COMBINED_CASES[case]`` with the order Megatron runs on a layout of the toy, and why Megatron would
    not run combined 1F1B for it."""
    arguments, devices, chunks, full, modules = COMBINED_CASES[case]
    toy = combined_toy(**arguments)  # its MTP layers moved to right after the blocks, where Megatron's layout has them
    mtp = [layer for layer in toy.layers if layer.mtp]
    rest = [layer for layer in toy.layers if not layer.mtp]
    model = toy.model_copy(update={"layers": rest[:7] + mtp + rest[7:]})
    stages = devices * chunks
    layout = {1: "Etttttt" + "m" * len(model.mtp_layers) + "L", 2: "Ettt|ttt" + "m" * len(model.mtp_layers) + "L",
              4: "Et|tt|tt|t" + "m" * len(model.mtp_layers) + "L"}[stages]
    counts = layout_counts(model, layout, devices).counts
    recompute = FULL if full else Recompute("none", modules=modules)
    name = MEGATRON.schedule_of(model, devices, chunks, recompute)
    assert name is not None
    placement = make_placement("interleaved" if chunks > 1 else "sequential", devices, chunks)
    schedule = builtin_schedule(name, Profile(), devices, 4, chunks)
    assert schedule.placement == placement
    ranges = tuple(map(tuple, partition(model, stages, list(counts))))
    blocks = frozenset(i for i, layer in enumerate(model.layers) if layer.block) if full else frozenset()
    return Plan(schedule, model, ranges, blocks, frozenset(), modules), combined_refusal(model, devices, chunks,
                                                                                          full, modules)


@pytest.mark.parametrize("case", list(COMBINED_CASES))
def test_the_export_has_the_flags_exactly_where_megatron_runs_combined_1f1b(case):
    planned, why = _plan(case)
    args = megatron_args(planned)
    written = [flag for flag in COMBINED_FLAGS if flag in args]
    assert written == (list(COMBINED_FLAGS) if why is None else [])
    assert (planned.schedule.name == COMBINED) == (why is None)
    if why is None:
        assert " ".join(COMBINED_FLAGS) in " ".join(args)
    else:  # a combined order where Megatron does not run it is refused
        with pytest.raises(InputError, match=f"schedule {COMBINED}: Megatron runs combined 1F1B only where"):
            megatron_args(replace(planned, schedule=replace(planned.schedule, name=COMBINED)))


def test_a_megatron_plan_of_experts_runs_combined_1f1b_and_exports_its_flags():
    setting = _setting(0.5)
    with cf.ThreadPoolExecutor(1) as pool:
        result = plan(setting.model, num_devices=2, num_microbatches=8, device_memory=80 * GIB, reserve=0,
                      placement="interleaved", chunks=2, target="megatron", time_limit=2, executor=pool)
    schedule = result.timeline.schedule
    assert schedule.name == COMBINED and pair_count(schedule) > 0
    assert simulate(schedule).makespan == result.step_time
    own, _ = builtin_run(setting, COMBINED, result.chunks, result.counts, NONE)
    assert own.makespan == result.step_time
    plain, _ = builtin_run(setting, "Interleaved1F1B", result.chunks, result.counts, NONE)
    assert result.step_time < plain.makespan
    args = shlex.split(result.export("megatron"))
    assert args[-len(COMBINED_FLAGS) - 1:-1] == list(COMBINED_FLAGS) and args[-1] == "--bf16"
    assert "megatron" in result.runtimes and "torchtitan" not in result.runtimes
