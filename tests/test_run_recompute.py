"""Tests of ``zbsolve run`` on a plan that recomputes blocks: the runtime checkpoints exactly the plan's blocks
(``zbsolve.execute.recompute.checkpoint``), torch's split backward (B, then W) still gives the reference's gradients,
F keeps only the checkpointed blocks' inputs, B recomputes each block once and keeps what W reads until W, and W
recomputes nothing, as the plan says.

The plan is solved from the built-in GPT's own per-layer profile, so its bytes are the runtime's, and the measured
peak is the plan's on every stage but the first, less one block's input, which the plan's ``mem_r`` counts twice
while a recomputing B runs, and the saved logits of any loss computed but not yet backpropagated (torch computes the
loss outside the timed passes, so they are never counted; the heuristic runs the last stage's B right after its F).
torch's B on the first stage computes nothing (its input takes no gradient) and its W runs the whole backward,
recomputing and freeing the blocks' activations within W, where the plan holds them from B's end: only the replay of
the measured passes is compared there, which sees each pass's net change alone but holds here, since W frees the
plain second block's activations before it recomputes the first.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the torch extra)")

from typer.testing import CliRunner

from zbsolve import solve
from zbsolve.app.cli import app
from zbsolve.base.errors import InputError
from zbsolve.core import torch_compat
from zbsolve.core.schedule import B, F
from zbsolve.core.simulator import simulate
from zbsolve.costmodel.model import Model
from zbsolve.execute.layer_profiler import profile_layers
from zbsolve.execute.memory import SavedBytes
from zbsolve.execute.modules import GPTSizes, ModelSpec, build_partitioned, load_layers, load_model
from zbsolve.execute.profiler import ProfileOptions
from zbsolve.io.costs_section import costs_section
from zbsolve.io.document import load_document, write_document
from zbsolve.problem.costs import model_costs

SIZES = {"hidden": 16, "seq_len": 8}
"""The tiny GPT every test here runs."""
GPT_SIZES = ("--hidden", "16", "--seq-len", "8")
"""The same sizes as ``zbsolve run`` options."""


@pytest.fixture
def gpt() -> Model:
    """The GPT of 4 blocks described by its own per-layer profile (one microbatch of 1, as ``zbsolve run`` runs
    with the default batch size): its bytes are what the runtime's saved-tensor accounting counts."""
    spec = ModelSpec(layers=4, **SIZES)
    return profile_layers(load_layers(spec), ProfileOptions(repeats=1, warmup=1, latency=False), name="gpt")


def _plans(gpt: Model, recompute: str, tmp_path: Path) -> tuple[Path, Path]:
    """One schedule (the heuristic's, B and W split) written twice: with ``recompute`` and without."""
    result = solve(gpt, num_microbatches=4, num_devices=2, solver="heuristic", recompute=recompute)
    with_rc, without = tmp_path / "recompute.json", tmp_path / "plain.json"
    result.to_json(with_rc)
    profile, costs = model_costs(gpt, result.schedule.placement)
    write_document(simulate(dataclasses.replace(result.schedule, profile=profile)), without, **costs_section(costs))
    return with_rc, without


def _run(plan: Path) -> list[dict]:
    """``zbsolve run plan --model gpt --check --json``: its report rows."""
    result = CliRunner().invoke(app, ["run", str(plan), "--model", "gpt", *GPT_SIZES, "--steps", "1", "--check",
                                      "--timeout", "30", "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_recomputing_plan_runs_checked_and_keeps_only_block_inputs(gpt: Model, tmp_path: Path) -> None:
    """uniform:1: each stage's first block checkpointed, the other not."""
    with_rc, without = _plans(gpt, "uniform:1", tmp_path)
    loaded, plain = load_document(with_rc), load_document(without)
    assert loaded.costs.recomputed and not plain.costs.recomputed
    rows, base = _run(with_rc), _run(without)
    names = loaded.costs.stage_names()
    for row, ref in zip(rows, base):
        assert row["grad_check"] == ref["grad_check"] == "passed"
        held = [i for s in row["stages"] for i in range(*loaded.costs.ranges[s])]
        assert row["recomputed"] == [gpt.layers[i].name for i in held if i in loaded.costs.recomputed]
        assert ref["recomputed"] == []
        # what F keeps: the plan's saving (each recomputing block keeps its input, not its activations) is measured
        for s in row["stages"]:
            saved = ref["stage_mem"][str(s)][F] - row["stage_mem"][str(s)][F]
            plan_saved = (plain.schedule.profile.stage_value("mem_f", s)
                          - loaded.schedule.profile.stage_value("mem_f", s))
            assert saved == plan_saved > 0, names[s]
        assert 0 < row["peak_saved_bytes"] <= ref["peak_saved_bytes"]
        # the measured per-pass memory, re-simulated, gives the measured peak (the tolerance of tests/test_executor.py)
        assert row["peak_saved_mib"] == pytest.approx(row["sim_peak_mib"], rel=0.1)
        # the plan's prediction is its own simulation: recomputing stages' mem_f and what their B holds (mem_r)
        d = row["rank"]
        assert row["plan_peak_mib"] == pytest.approx(simulate(loaded.schedule).peak_memory[d] / 2 ** 20)
        if 0 not in row["stages"]:  # B recomputes and keeps what W reads until W, as the plan has it
            assert row["peak_saved_mib"] == pytest.approx(row["plan_peak_mib"], rel=0.1)


def test_checkpointed_blocks_recompute_once_in_b_and_w_reuses_it() -> None:
    """Two microbatches through a stage of checkpointed blocks, as torch's pipeline stage runs them (F, F, then B
    and W of each, B keeping the graph for W's autograd call per parameter group), all under the saved-tensor
    accounting: F keeps only the blocks' inputs, B runs each block's forward once more and then holds exactly what
    the same stage without checkpointing holds, W runs no forward and frees everything, and the gradients are the
    plain stage's."""
    partition = (("embed",), ("blocks.0", "blocks.1", "blocks.2"), ("norm", "head"))
    inputs = [torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(seed)) for seed in (1, 2)]
    held, grads = {}, {}
    for recompute in ((), ("blocks.0", "blocks.1", "blocks.2")):
        stage = load_model(ModelSpec(partition=partition, recompute=recompute, **SIZES), 3).stages[1]
        assert stage.recompute == (bool(recompute),) * 3
        assert not any(isinstance(m, torch.nn.Dropout) for m in stage.modules())  # recomputing replays no RNG
        calls = [0] * 3
        for i, block in enumerate(stage.blocks):
            block.register_forward_hook(lambda *_, i=i, calls=calls: calls.__setitem__(i, calls[i] + 1))
        saved = SavedBytes(stage.parameters())
        xs = [x.clone().requires_grad_() for x in inputs]
        with saved.hooks():
            outs = [stage(x) for x in xs]
        held[recompute, F] = saved.current
        assert calls == [2] * 3
        groups = []
        for x, out in zip(xs, outs):
            with saved.hooks():
                groups.append(torch_compat.backward_input([out], [torch.ones_like(out)], [x], stage.parameters()))
        held[recompute, B] = saved.current
        assert calls == [4 if recompute else 2] * 3
        for group in groups:
            with saved.hooks():
                torch_compat.backward_weight(stage.parameters(), group)
        assert calls == [4 if recompute else 2] * 3
        del outs, groups
        assert saved.current == 0
        grads[recompute] = [*(x.grad for x in xs), *(p.grad for p in stage.parameters())]
    plain, checkpointed = grads.values()
    assert all(g is not None and torch.allclose(g, h, rtol=1e-5, atol=1e-7) for g, h in zip(plain, checkpointed))
    full = ("blocks.0", "blocks.1", "blocks.2")
    # each block's input is a distinct (2, 8, 16) float tensor: the first's, and the outputs of the others
    assert held[full, F] == len(inputs) * 3 * inputs[0].untyped_storage().nbytes()
    assert held[full, B] == held[(), B] == held[(), F] > held[full, F]


def test_recompute_names_blocks_of_the_gpt_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    partition = (("embed", "blocks.0"), ("norm", "head"))
    with pytest.raises(InputError, match=r"^recompute names layer 'norm', which is not one of the GPT's 1 blocks"):
        build_partitioned(partition, GPTSizes(vocab=64, heads=2, **SIZES), layers=None, seed=0, recompute=("norm",))
    (tmp_path / "zbsolve_test_recompute_user.py").write_text("def stages(n):\n    return []\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(InputError, match=r"recompute = blocks\.0, but only the built-in gpt's blocks can be "):
        load_model(ModelSpec("zbsolve_test_recompute_user:stages", recompute=("blocks.0",)), 2)


def test_selective_plan_runs_checked_and_drops_norm_and_gelu_outputs(gpt: Model, tmp_path: Path) -> None:
    """recompute selective: every block keeps all but its norms' and GELU's outputs (``mem_sel``: 2·h + 4·h fp32
    elements a token), and the runtime drops exactly those, as the plan says, with the reference's gradients."""
    tokens, hidden = SIZES["seq_len"], SIZES["hidden"]
    described = gpt.model_copy(update={"layers": [
        layer.model_copy(update={"t_sel": layer.t_f / 10, "mem_sel": 6 * hidden * tokens * 4} if layer.block else {})
        for layer in gpt.layers]})
    with_sel, without = _plans(described, "selective", tmp_path)
    loaded, plain = load_document(with_sel), load_document(without)
    assert loaded.costs.selective and not loaded.costs.recomputed
    rows, base = _run(with_sel), _run(without)
    for row, ref in zip(rows, base):
        assert row["grad_check"] == ref["grad_check"] == "passed"
        held = [i for s in row["stages"] for i in range(*loaded.costs.ranges[s])]
        assert row["selective"] == [gpt.layers[i].name for i in held if gpt.layers[i].block]
        for s in row["stages"]:
            saved = ref["stage_mem"][str(s)][F] - row["stage_mem"][str(s)][F]
            plan_saved = (plain.schedule.profile.stage_value("mem_f", s)
                          - loaded.schedule.profile.stage_value("mem_f", s))
            assert saved == plan_saved > 0
