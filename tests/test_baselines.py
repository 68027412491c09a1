"""Tests of torch's built-in schedules as baselines (zbsolve.schedulers.builtins, zbsolve.core.torch_compat.schedule_order): valid
under the simulator, torch's orders against zbsolve's families, and one-line errors."""

from __future__ import annotations

import pytest

from zbsolve.core import torch_compat
from zbsolve.schedulers.builtins import BUILTINS, builtin_schedule
from zbsolve.base.errors import InputError
from zbsolve.schedulers.families import make_schedule
from zbsolve.core.placement import make_placement
from zbsolve.core.profile import UNIT, Profile
from zbsolve.core.schedule import BW, B, F, Pair, Pass, W, passes_of
from zbsolve.core.simulator import simulate

CASES = [(2, 4), (4, 8), (8, 32)]
"""(devices, microbatches) that every built-in runs, with torch or with zbsolve's families."""
WITH_FAMILY = [name for name, builtin in BUILTINS.items() if builtin.family]


def uneven(stages: int) -> Profile:
    """A profile whose times and memory differ from stage to stage, with communication."""
    return Profile.from_paper(T_F=[1.0 + 0.3 * (s % 3) for s in range(stages)],
                              T_B=[1.2 + 0.1 * (s % 4) for s in range(stages)],
                              T_W=[0.6 + 0.25 * (s % 2) for s in range(stages)], T_comm=0.05,
                              M_B=[2.0 + s % 3 for s in range(stages)], M_W=[0.5 + 0.1 * s for s in range(stages)])


@pytest.fixture(params=["torch", "families"])
def source(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Where the built-ins' orders come from: torch's schedule classes, or zbsolve's families (torch hidden)."""
    if request.param == "torch":
        pytest.importorskip("torch.distributed.pipelining",
                            reason="torch.distributed.pipelining is not available (the torch extra)")
    else:
        monkeypatch.setattr(torch_compat, "has_pipelining", lambda: False)
    return request.param


def test_builtins_are_torch_names_in_order() -> None:
    assert list(BUILTINS) == ["GPipe", "1F1B", "Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble",
                              "DualPipeV"]
    assert [(b.placement, b.chunks) for b in BUILTINS.values()] == [
        ("sequential", 1), ("sequential", 1), ("interleaved", 2), ("interleaved", 2), ("vshape", 2), ("vshape", 2)]


@pytest.mark.parametrize("uniform", [True, False], ids=["unit", "uneven"])
@pytest.mark.parametrize("p, m", CASES)
@pytest.mark.parametrize("source, name", [(source, name) for source in ("torch", "families") for name in BUILTINS
                                          if source == "torch" or BUILTINS[name].family is not None],
                         indirect=["source"])  # without a family, torch alone: test_interleaved_zero_bubble_needs_torch
def test_every_builtin_is_valid(source: str, name: str, p: int, m: int, uniform: bool) -> None:
    builtin = BUILTINS[name]
    profile = UNIT if uniform else uneven(builtin.chunks * p)
    schedule = builtin_schedule(name, profile, p, m)
    timeline = simulate(schedule)
    assert schedule.name == name and schedule.mem_limit is None
    assert schedule.placement == make_placement(builtin.placement, p, builtin.chunks)
    assert schedule.profile == profile.per_chunk(p, builtin.chunks).expand(builtin.chunks * p)
    assert timeline.makespan > 0


@pytest.mark.parametrize("p, m", CASES)
@pytest.mark.parametrize("name", WITH_FAMILY)
def test_torch_orders_are_the_families(name: str, p: int, m: int) -> None:
    """torch's order of each built-in with a zbsolve family is the family's, pass for pass, so both time the same
    on an uneven profile (a p-stage one, split into chunks for two stages per device)."""
    pytest.importorskip("torch.distributed.pipelining",
                        reason="torch.distributed.pipelining is not available (the torch extra)")
    profile = uneven(p)
    builtin = BUILTINS[name]
    ours = make_schedule(builtin.family, profile, p, m)
    theirs = builtin_schedule(name, profile, p, m)
    assert [list(ops) for ops in theirs.devices] == torch_compat.schedule_order(
        name, num_devices=p, stages_per_rank=builtin.chunks, num_microbatches=m)
    assert theirs.devices == ours.devices
    mine, torch = simulate(ours), simulate(theirs)
    assert torch.makespan == mine.makespan and torch.peak_memory == mine.peak_memory


@pytest.mark.parametrize("name, p, m, torch_runs, family_runs", [
    ("1F1B", 4, 3, False, True),              # torch needs m >= p
    ("Interleaved1F1B", 4, 6, True, False),   # torch: m a multiple of its rounds; zbsolve: of p
    ("Interleaved1F1B", 4, 9, False, False),  # 9 is no multiple of torch's 2 rounds
    ("DualPipeV", 4, 7, False, True),         # torch needs m >= 2p, zbsolve 2p - 1
    ("DualPipeV", 4, 8, True, True),
])
def test_documented_differences(name: str, p: int, m: int, torch_runs: bool, family_runs: bool) -> None:
    """Where torch and zbsolve's family accept different (p, m), as zbsolve.schedulers.builtins' docstring says."""
    pytest.importorskip("torch.distributed.pipelining",
                        reason="torch.distributed.pipelining is not available (the torch extra)")
    family = BUILTINS[name].family
    for runs, make in ((torch_runs, lambda: builtin_schedule(name, UNIT, p, m)),
                       (family_runs, lambda: make_schedule(family, UNIT, p, m))):
        if runs:
            simulate(make())
        else:
            with pytest.raises(InputError) as err:
                make()
            assert "\n" not in str(err.value)


@pytest.mark.parametrize("name, p, m, reason", [
    ("1F1B", 4, 3, r"Number of microbatches \(3\) must be greater than or equal to the number of stages \(4\)"),
    ("Interleaved1F1B", 4, 9, r"multiple of the number of rounds \(2\), but got 9"),
    ("InterleavedZeroBubble", 4, 9, r"multiple of the number of rounds \(2\), but got 9"),
    ("DualPipeV", 4, 7, r"requires at least as many microbatches as stages"),
])
def test_torch_refusal_is_one_line(name: str, p: int, m: int, reason: str) -> None:
    pytest.importorskip("torch.distributed.pipelining",
                        reason="torch.distributed.pipelining is not available (the torch extra)")
    with pytest.raises(InputError, match=rf"^torch's {name} schedule \(ranks = {p}, .*microbatches = {m}\) is "
                                         rf"refused: .*{reason}") as err:
        builtin_schedule(name, UNIT, p, m)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("p, m", CASES)
def test_interleaved_zero_bubble_splits_backward(p: int, m: int) -> None:
    """torch's ZB1P runs B and W apart (no fused BW) and, on unit costs, beats interleaved 1F1B."""
    pytest.importorskip("torch.distributed.pipelining",
                        reason="torch.distributed.pipelining is not available (the torch extra)")
    schedule = builtin_schedule("InterleavedZeroBubble", UNIT, p, m)
    kinds = [q.kind for ops in schedule.devices for op in ops for q in passes_of(op)]
    assert BW not in kinds and kinds.count(B) == kinds.count(W) == 2 * p * m
    interleaved = builtin_schedule("Interleaved1F1B", UNIT, p, m)
    assert simulate(schedule).makespan < simulate(interleaved).makespan


def test_interleaved_zero_bubble_needs_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch_compat, "has_pipelining", lambda: False)
    with pytest.raises(InputError, match=r"^schedule = 'InterleavedZeroBubble' needs torch .*no family") as err:
        builtin_schedule("InterleavedZeroBubble", UNIT, 4, 8)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("name, profile, p, m, message", [
    ("gpipe", UNIT, 4, 8, r"schedule = 'gpipe' is not one of torch's built-in schedules; choose one of GPipe, 1F1B"),
    ("LoopedBFS", UNIT, 4, 8, r"schedule = 'LoopedBFS' is not one of"),
    ("1F1B", UNIT, 0, 8, r"num_devices = 0 must be an integer >= 1"),
    ("GPipe", UNIT, 4, 0, r"num_microbatches = 0 must be an integer >= 1"),
    ("ZBVZeroBubble", uneven(3), 4, 8, r"profile has 3 stages; ZBVZeroBubble on 4 devices needs 4 .* or 8"),
    ("GPipe", uneven(8), 4, 8, r"profile has 8 stages, but the placement needs 4"),
])
def test_bad_input_is_one_line(source: str, name: str, profile: Profile, p: int, m: int, message: str) -> None:
    with pytest.raises(InputError, match=message) as err:
        builtin_schedule(name, profile, p, m)
    assert "\n" not in str(err.value)


def test_schedule_order_is_what_torch_runs() -> None:
    """1F1B's order is what its ``_step_microbatches`` runs (its last rank starts at microbatch 0, unlike torch's
    ``_get_pipeline_order``); DualPipeV's overlapped actions are F&B pairs of F and a fused BW."""
    pytest.importorskip("torch.distributed.pipelining",
                        reason="torch.distributed.pipelining is not available (the torch extra)")
    order = torch_compat.schedule_order("1F1B", num_devices=4, stages_per_rank=1, num_microbatches=8)
    assert order[3][:3] == [Pass(F, 0, 3), Pass(BW, 0, 3), Pass(F, 1, 3)]
    assert order[0][:5] == [Pass(F, j, 0) for j in range(4)] + [Pass(BW, 0, 0)]
    dual = torch_compat.schedule_order("DualPipeV", num_devices=4, stages_per_rank=2, num_microbatches=8)
    pairs = [op for ops in dual for op in ops if isinstance(op, Pair)]
    assert pairs and all(op.f.kind == F and op.b.kind == BW for op in pairs)
    assert pairs[0] == Pair(Pass(F, 7, 0), Pass(BW, 3, 7))


@pytest.mark.parametrize("name, stages_per_rank, message", [
    ("1F1B", 2, r"Schedule1F1B runs one stage per rank"),
    ("ZBVZeroBubble", 3, r"ZBV requires exactly 2 stages per rank"),
    ("PipelineScheduleMulti", 2, r"PipelineScheduleMulti gives no order for every rank"),
    ("nope", 1, r"Unknown schedule name 'nope'"),
])
def test_schedule_order_refusals_are_one_line(name: str, stages_per_rank: int, message: str) -> None:
    pytest.importorskip("torch.distributed.pipelining",
                        reason="torch.distributed.pipelining is not available (the torch extra)")
    with pytest.raises(InputError, match=rf"^torch's {name} schedule .* is refused: {message}") as err:
        torch_compat.schedule_order(name, num_devices=4, stages_per_rank=stages_per_rank, num_microbatches=8)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("name", [name for name, builtin in BUILTINS.items() if builtin.chunks > 1])
def test_multi_stage_orders_are_torch_classes_own(name: str) -> None:
    """Leaving torch's FSDP lowering out changes no compute action of a multi-stage class's order, and the lowering
    is put back after."""
    pytest.importorskip("torch.distributed.pipelining",
                        reason="torch.distributed.pipelining is not available (the torch extra)")
    from torch.distributed.pipelining import schedules

    lowering = schedules._add_unshard_reshard
    whole = schedules.get_schedule_class(name)([torch_compat._StageStandIn(i, 8, 4) for i in range(2)],
                                               8).pipeline_order
    order = torch_compat.schedule_order(name, num_devices=4, stages_per_rank=2, num_microbatches=8)
    assert order == [[torch_compat._op(a) for a in whole[rank] if a is not None and a.is_compute_op]
                     for rank in range(4)]
    assert schedules._add_unshard_reshard is lowering
