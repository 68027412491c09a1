"""The split bound's memory terms (``planning.memory_bound``): never above the proven optimum of any partition with
any recomputation the plan may choose, on small memory-tight cases, and above head + work where memory binds."""

from __future__ import annotations

import itertools

import pytest

from zbsolve.base.units import GIB
from zbsolve.core.placement import Placement, interleaved, placement_name, sequential, vshape
from zbsolve.optimize.solve import solve
from zbsolve.planning.memory_terms import memory_terms
from zbsolve.planning.split_bound import split_bound
from zbsolve.costmodel.model import Layer, Model


def blocks(n: int, selective: bool = False) -> Model:
    """``n`` equal blocks (F = B = W = 1 s, 1 GiB of activations and 1 GiB static each, 1 MiB out), 0.1 s a transfer;
    with ``selective``, their norms and MLP activation (0.2 s, half the activations) recomputable."""
    sel = {"t_sel": 0.2, "mem_sel": GIB // 2} if selective else {}
    return Model(name="tight", t_comm=0.1, layers=[
        Layer(name=f"layers.{i}", t_f=1.0, t_b=1.0, t_w=1.0, mem_f=GIB, mem_b=0, mem_w=-GIB, static_bytes=GIB,
              out_bytes=2**20, **sel) for i in range(n)])


def compositions(total: int, parts: int):
    """Every way to cut ``total`` layers into ``parts`` non-empty contiguous stages."""
    for cuts in itertools.combinations(range(1, total), parts - 1):
        ends = (0, *cuts, total)
        yield tuple(b - a for a, b in itertools.pairwise(ends))


def choices(recompute: str, counts: tuple[int, ...], selective: bool) -> list[str]:
    """The recomputations a plan asked for ``recompute`` may take on a partition of blocks only: itself, or with
    "auto" every per-stage count (none and full among them), selective or not."""
    if recompute != "auto":
        return [recompute]
    per_stage = [",".join(map(str, n)) for n in itertools.product(*(range(c + 1) for c in counts))]
    return [f"{prefix}per-stage:{n}" for n in per_stage for prefix in ("", "selective+")[:1 + selective]]


def optimum(model: Model, layout: Placement, m: int, memory: float, recompute: str, selective: bool) -> float:
    """The least step over every partition and recomputation, each proven optimal by CP-SAT (those that cannot fit
    skipped)."""
    name, chunks = placement_name(layout)
    steps = []
    for counts in compositions(len(model.layers), layout.num_stages):
        for choice in choices(recompute, counts, selective):
            try:
                result = solve(model, num_devices=layout.num_devices, num_microbatches=m, placement=name,
                               chunks=chunks, partition=list(counts), device_memory=int(memory * GIB), reserve=0,
                               recompute=choice, time_limit=10, workers=1)
            except Exception as exc:  # noqa: BLE001  (only "does not fit" is expected)
                assert "does not fit" in str(exc) or "fits" in str(exc), exc
                continue
            assert result.status == "optimal", (counts, choice, result.status)
            steps.append(result.step_time)
    assert steps
    return min(steps)


CASES = {
    # one microbatch in flight: one at a time through both stages, the chain is the whole step
    "sequential, one in flight": (blocks(2), sequential(2), 4, 2.5, "none", False),
    "sequential 3, two in flight": (blocks(3), sequential(3), 5, 3.2, "none", False),
    "sequential, recomputation chosen": (blocks(3, selective=True), sequential(2), 4, 5.0, "auto", True),
    "vshape": (blocks(4), vshape(2, 2), 4, 4.5, "none", False),
    "interleaved": (blocks(4), interleaved(2, 2), 4, 4.5, "none", False),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_the_memory_bound_never_exceeds_the_proven_optimum(case):
    model, layout, m, memory, recompute, selective = CASES[case]
    with_memory = split_bound(model, layout, m, memory=memory_terms(model, recompute, "zbsolve", int(memory * GIB)))
    best = optimum(model, layout, m, memory, recompute, selective)
    assert with_memory.optimal and with_memory.bound <= best * (1 + 1e-9)
    assert with_memory.bound >= split_bound(model, layout, m).bound


def test_where_memory_binds_the_bound_rises_above_head_and_work_to_the_optimum():
    """One microbatch fits on each device: every microbatch's F, its round trip, B and W run before the next F on the
    first device, m of them back to back. Head + work (m x 3 s on the last device, after its head) says far less."""
    model, layout, m, memory = blocks(2), sequential(2), 4, 2.5
    head_and_work = split_bound(model, layout, m).bound
    with_memory = split_bound(model, layout, m, memory=memory_terms(model, "none", "zbsolve", int(memory * GIB))).bound
    assert head_and_work == pytest.approx(1.1 + m * 3.0)
    trip = 0.1 + 1 + 1 + 0.1  # to the second device, its F and B, and back
    assert with_memory == pytest.approx(m * (1 + trip + 1 + 1), rel=1e-6)  # F, the trip, B and W
    assert with_memory == pytest.approx(optimum(model, layout, m, memory, "none", False), rel=1e-6)


def test_memory_terms_are_what_a_plan_may_choose_layer_by_layer():
    """A choice asked for gives its layers' options; "auto" every way the runtime's row recomputes a block, less
    those another beats in hold and in B alike."""
    model = blocks(2, selective=True)
    usable = 8 * GIB
    assert [len(o) for o in memory_terms(model, "none", "zbsolve", usable).options] == [1, 1]
    full = memory_terms(model, "full", "zbsolve", usable).options
    assert full[1][0].hold == 2**20 and full[1][0].t_b == 2.0  # keeps its input, runs its forward again
    auto = memory_terms(model, "auto", "zbsolve", usable).options
    assert sorted(o.t_b for o in auto[0]) == [1.0, 1.2, 2.0]  # none, selective, whole
    assert len(memory_terms(model, "selective+uniform:1", "zbsolve", usable).options[0]) == 2


def test_a_device_s_stages_share_one_budget_before_its_first_b():
    """V-shape over 2 devices of 2 blocks, each device's budget two holds: device 0's first B (stage 3) waits for
    microbatch 0's forward through the four stages and two transfers (4.2 s). By then it has run at most two F in
    all, its two stages sharing one budget (each stage alone admits two), so it idles 2.2 s beside its 24 s of work.
    On a model of blocks of one kind, the F a device runs before its first B is at most its budget at their rate."""
    model, layout, m, memory = blocks(4), vshape(2, 2), 4, 4.5
    bound = split_bound(model, layout, m, memory=memory_terms(model, "none", "zbsolve", int(memory * GIB))).bound
    assert bound >= m * 2 * 3.0 + 4.2 - 2.0 - 1e-6
