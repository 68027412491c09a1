"""Tests of zbsolve.execute: schedules run for real on torch.distributed (gloo, CPU), one process per rank.

Each multi-process test runs a tiny model for 1-2 steps; ranks meet through a file in a fresh temporary
directory and gloo picks free ports, so the tests can run in parallel under pytest-xdist.
"""

from __future__ import annotations

import json
import math
import os
import re
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the torch extra)")

from typer.testing import CliRunner

from zbsolve.app.cli import app
from zbsolve.base.errors import InputError
from zbsolve.core.placement import sequential
from zbsolve.core.profile import UNIT
from zbsolve.core.schedule import BW, F, Pass, build, passes_of
from zbsolve.core.simulator import simulate
from zbsolve.core.transforms import torch_actions
from zbsolve.execute import executor
from zbsolve.execute.executor import RunOptions, run_schedule
from zbsolve.execute.launch import LaunchError
from zbsolve.execute.modules import GPTSizes, ModelSpec, build_partitioned, build_stages, load_model
from zbsolve.io.costs_section import document_costs
from zbsolve.io.document import from_document
from zbsolve.present.run_report import REPORT_COLUMNS, report_table
from zbsolve.schedulers.families import make_schedule

USER_MODEL = "zbsolve_test_usermodel"
USER_SOURCE = textwrap.dedent("""
    import os
    import time

    import torch
    import torch.distributed as dist
    from torch import nn


    def make_batch(batch_size, seed):
        gen = torch.Generator().manual_seed(seed)
        return torch.randn(batch_size, 8, generator=gen), torch.randn(batch_size, 8, generator=gen)


    def loss_fn(output, target):
        return ((output - target) ** 2).mean()


    def stages(n):
        torch.manual_seed(0)
        return [nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(n)]


    def three(n):
        return stages(3)


    def dies(n):
        if dist.is_initialized() and dist.get_rank() == 1:
            os._exit(7)
        return stages(n)


    def hangs(n):
        if dist.is_initialized() and dist.get_rank() == 1:
            time.sleep(600)
        return stages(n)
""")


@pytest.fixture
def user_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A user model module importable here and in every rank; returns its module name."""
    (tmp_path / f"{USER_MODEL}.py").write_text(USER_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return USER_MODEL


def _reversed_last_stage() -> object:
    """GPipe on 2 devices with the last stage's forwards in reverse microbatch order."""
    devices = [[Pass(F, 0, 0), Pass(F, 1, 0), Pass(BW, 0, 0), Pass(BW, 1, 0)],
               [Pass(F, 1, 1), Pass(F, 0, 1), Pass(BW, 0, 1), Pass(BW, 1, 1)]]
    return build("reversed", sequential(2), 2, UNIT, devices)


def _check_rows(schedule, rows: list[dict], steps: int) -> None:
    """Every rank ran its passes, the gradients matched, and the report agrees with the simulator."""
    planned = simulate(schedule)
    assert [r["rank"] for r in rows] == list(range(schedule.num_devices))
    for row in rows:
        d = row["rank"]
        assert row["stages"] == sorted(s for _, s in schedule.placement.stages_of(d))
        assert row["grad_check"] == "passed"
        assert set(row["pass_ms"]) == {p.kind for op in schedule.devices[d] for p in passes_of(op)}
        assert all(ms > 0 for ms in row["pass_ms"].values())
        work = sum(schedule.duration(op) for op in schedule.devices[d])
        assert row["sim_bubble"] == pytest.approx(1 - work / planned.makespan)
        assert row["makespan_ms"] >= row["busy_ms"] > 0
        assert row["makespan_ms"] == rows[0]["makespan_ms"]
        assert row["timed_steps"] == len(row["step_ms_each"]) == max(1, steps - 1)
        assert row["cpu_cores"] == os.cpu_count()
        assert row["oversubscribed"] == (schedule.num_devices > os.cpu_count())
        assert row["peak_saved_mib"] > 0
        assert row["peak_saved_mib"] == pytest.approx(row["sim_peak_mib"], rel=0.1)
        if schedule.num_stages - 1 in row["stages"]:
            assert math.isfinite(row["loss"])
    table = report_table(rows)
    assert [line[:2] for line in table] == [[str(r["rank"]), ",".join(map(str, r["stages"]))] for r in rows]
    assert all(len(line) == len(REPORT_COLUMNS) and line[-1] == "passed" for line in table)


@pytest.mark.parametrize("family,p,m", [("1f1b", 2, 4), ("zb-h1", 3, 4), ("zb-v", 2, 4)])
def test_family_runs_with_exact_gradients(family: str, p: int, m: int) -> None:
    """Two ranks, and three for ZB-H1: its middle rank receives from and sends to two peers."""
    schedule = make_schedule(family, UNIT, p, m)
    rows = run_schedule(schedule, RunOptions(ModelSpec(hidden=16, seq_len=8), steps=2, check=True, batch_size=2 * m,
                                             timeout_s=30))
    _check_rows(schedule, rows, 2)


def test_user_model_and_last_stage_order_repair(user_model: str) -> None:
    schedule = _reversed_last_stage()
    rows = run_schedule(schedule, RunOptions(ModelSpec(f"{user_model}:stages"), steps=1, check=True, timeout_s=30))
    _check_rows(schedule, rows, 1)


def test_check_catches_wrong_gradients(user_model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def unrepaired(schedule) -> str:
        return "".join(",".join(row) + "\n" for row in torch_actions(schedule))

    monkeypatch.setattr(executor, "torch_csv", unrepaired)
    with pytest.raises(LaunchError, match="GradientCheckError: rank [01] step 0: stage [01] parameter"):
        run_schedule(_reversed_last_stage(), RunOptions(ModelSpec(f"{user_model}:stages"), steps=1, check=True,
                                                        timeout_s=30))


def test_dead_rank_stops_the_run(user_model: str) -> None:
    with pytest.raises(LaunchError, match=r"rank 1 died \(exit code 7\)"):
        run_schedule(make_schedule("1f1b", UNIT, 2, 2), RunOptions(ModelSpec(f"{user_model}:dies"), steps=1,
                                                                   timeout_s=30))


def test_silent_peer_times_out(user_model: str) -> None:
    with pytest.raises(LaunchError, match="rank 0: PeerTimeoutError: no answer from a peer within the process-group "
                                          "timeout of 2 s"):
        run_schedule(make_schedule("1f1b", UNIT, 2, 2), RunOptions(ModelSpec(f"{user_model}:hangs"), steps=1,
                                                                   timeout_s=2))


def test_bad_runs_are_input_errors(user_model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    schedule = make_schedule("zb-h1", UNIT, 2, 4)
    with pytest.raises(InputError, match="returned 3 stages, but the schedule's placement has 2"):
        run_schedule(schedule, RunOptions(ModelSpec(f"{user_model}:three")))
    with pytest.raises(InputError, match="layers = 1 must be >= num_stages = 2"):
        run_schedule(schedule, RunOptions(ModelSpec(layers=1)))
    with pytest.raises(InputError, match="cannot import 'no_such_module'"):
        run_schedule(schedule, RunOptions(ModelSpec("no_such_module:stages")))
    with pytest.raises(InputError, match="batch_size = 6 must be a positive multiple of num_microbatches = 4"):
        run_schedule(schedule, RunOptions(batch_size=6))
    with pytest.raises(InputError, match="steps = 0 must be >= 1"):
        RunOptions(steps=0)
    with pytest.raises(InputError, match="device = 'tpu' is unknown"):
        RunOptions(device="tpu")
    with pytest.raises(InputError, match="timeout = 0 must be > 0 seconds"):
        RunOptions(timeout_s=0)
    with pytest.raises(InputError, match="is bidirectional"):
        run_schedule(make_schedule("dualpipe", UNIT, 2, 4))
    if not torch.cuda.is_available():
        with pytest.raises(InputError, match=r"device = 'cuda' but torch.cuda.is_available\(\) is False"):
            run_schedule(schedule, RunOptions(device="cuda"))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(InputError, match="torchrun started 3 ranks, but the schedule has 2 devices"):
        run_schedule(schedule)


def test_build_stages_is_deterministic_and_complete() -> None:
    sizes = GPTSizes(hidden=16, heads=2, vocab=32, seq_len=8)
    a, b = build_stages(3, sizes, layers=5, seed=3), build_stages(3, sizes, layers=5, seed=3)
    assert [len(s.blocks) for s in a] == [2, 2, 1]
    for x, y in zip(a, b):
        assert all(torch.equal(p, q) for p, q in zip(x.parameters(), y.parameters()))
    tokens = torch.randint(0, 32, (2, 8))
    out = tokens
    for stage in a:
        out = stage(out)
    assert out.shape == (2, 8, 32)
    with pytest.raises(InputError, match="hidden = 15 must be a positive multiple of heads = 2"):
        build_stages(2, GPTSizes(hidden=15, heads=2, vocab=32, seq_len=8), layers=2, seed=0)


def test_load_user_model(user_model: str) -> None:
    model = load_model(ModelSpec(f"{user_model}:stages"), 4)
    assert len(model.stages) == 4
    x, y = model.make_batch(3, 0)
    assert model.loss_fn(model.stages[0](x), y).ndim == 0
    with pytest.raises(InputError, match="must be 'gpt' or 'module:function'"):
        load_model(ModelSpec("stages"), 2)
    with pytest.raises(InputError, match="has no function 'nothing'"):
        load_model(ModelSpec(f"{user_model}:nothing"), 2)


def test_gpt_model_defaults_to_one_block_per_stage() -> None:
    model = load_model(ModelSpec(hidden=16, seq_len=8, vocab=32), 3)
    assert [len(s.blocks) for s in model.stages] == [1, 1, 1]
    x, y = model.make_batch(2, 5)
    assert x.shape == y.shape == (2, 8) and torch.equal(x[:, 1:], y[:, :-1])
    assert torch.equal(model.make_batch(2, 5)[0], x)



# -- a schedule document's partition: the GPT cut unevenly as the plan says ---------------------------------------
GPT_SIZES = ("--hidden", "16", "--seq-len", "8")


def _gpt_plan(tmp_path: Path, blocks: int, counts: str, *placement: str) -> Path:
    """A plan solved from a GPT-shaped model description (the names ``zbsolve profile --per-layer`` gives, made-up
    costs) with ``--partition counts``; returns the document's path."""
    names = ["embed", *(f"blocks.{i}" for i in range(blocks)), "norm", "head"]
    layers = [{"name": name, "block": name.startswith("blocks."), "t_f": 1e-3 * (i + 1), "t_b": 1e-3, "t_w": 5e-4,
               "mem_f": 1000 + i, "mem_b": 0, "mem_w": -1000 - i, "static_bytes": 4096, "out_bytes": 512}
              for i, name in enumerate(names)]
    model, plan = tmp_path / "gpt.json", tmp_path / "plan.json"
    model.write_text(json.dumps({"name": "gpt", "layers": layers}))
    result = CliRunner().invoke(app, ["solve", str(model), "-p", "2", "-m", "4", "--partition", counts, *placement,
                                      "--solver", "heuristic", "-o", str(plan), "-q"])
    assert result.exit_code == 0, result.output
    return plan


def _run_plan(plan: Path) -> list[dict]:
    """``zbsolve run plan --check --json`` on the tiny GPT: its report rows."""
    result = CliRunner().invoke(app, ["run", str(plan), "--model", "gpt", *GPT_SIZES, "--steps", "1", "--check",
                                      "--timeout", "30", "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.parametrize("blocks,counts,placement,held", [
    (4, "2,5", (), ["E1", "3NH"]),                                     # sequential: 1 block, then 3 blocks
    (3, "2,2,1,1", ("--placement", "vshape"), ["E1", "2", "N", "H"]),  # V-shape: a stage of only norm, one of only head
])
def test_uneven_partition_runs_with_exact_gradients(tmp_path: Path, blocks: int, counts: str,
                                                    placement: tuple[str, ...], held: list[str]) -> None:
    """Each stage holds what the plan's partition names (E embed, blocks, N norm, H head) and the run checks out."""
    plan = _gpt_plan(tmp_path, blocks, counts, *placement)
    data = json.loads(plan.read_text())
    schedule = from_document(data)[0]
    costs = document_costs(data, schedule, "plan")
    names = tuple(tuple(layer.name for layer in costs.model.layers[a:b]) for a, b in costs.ranges)
    stages = load_model(ModelSpec(partition=names, hidden=16, seq_len=8), schedule.num_stages).stages
    assert ["E" * (s.embed is not None) + str(len(s.blocks) or "") + "N" * (s.norm is not None)
            + "H" * (s.head is not None) for s in stages] == held
    rows = _run_plan(plan)
    _check_rows(schedule, rows, 1)
    for row in rows:
        assert row["plan_makespan_ms"] == pytest.approx(1e3 * data["figures"]["makespan"])
        assert row["plan_peak_mib"] == pytest.approx(row["sim_peak"] / 2 ** 20)


def test_partition_and_layers_mismatch_is_one_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["run", str(_gpt_plan(tmp_path, 4, "2,5")), "--model", "gpt", "--layers", "5"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.output.strip().splitlines()[-1] == ("error: layers = 5, but the partition holds 4 GPT blocks; leave "
                                                      "layers out or give 4")


def test_gpt_cut_by_a_partition_keeps_its_weights() -> None:
    sizes = GPTSizes(hidden=16, heads=2, vocab=32, seq_len=8)
    even = build_stages(2, sizes, layers=3, seed=3)
    cut = build_partitioned([["embed"], ["blocks.0", "blocks.1"], ["blocks.2", "norm"], ["head"]], sizes, layers=None,
                            seed=3)
    assert [len(s.blocks) for s in cut] == [0, 2, 1, 0] and cut[2].head is None and cut[3].norm is None
    assert all(torch.equal(p, q) for p, q in zip((p for s in even for p in s.parameters()),
                                                 (p for s in cut for p in s.parameters())))
    tokens = torch.randint(0, 32, (2, 8))
    out = tokens
    for stage in cut:
        out = stage(out)
    assert torch.allclose(out, even[1](even[0](tokens)))
    for partition, needle in [
        ([["blocks.0", "embed"], ["norm", "head"]], "partition stage 0 starts with layer 'blocks.0', but the GPT's"),
        ([["embed", "blocks.0"], ["head", "norm"]], "partition stage 1 ends with layer 'norm', but the GPT's last"),
        ([["embed", "blocks.1"], ["norm", "head"]], "partition layer 1 = 'blocks.1', but the GPT's layers are"),
        ([["embed", "blocks.0", "norm"], ["norm", "head"]], "partition layer 3 = 'norm'"),
        ([["embed"], []], "partition stage 1 holds no layers"),
    ]:
        with pytest.raises(InputError, match=re.escape(needle)):
            build_partitioned(partition, sizes, layers=None, seed=3)
    with pytest.raises(InputError, match="partition has 2 stages, but the schedule's placement has 3"):
        load_model(ModelSpec(partition=(("embed", "blocks.0"), ("norm", "head"))), 3)
