"""Selective recomputation (a block's norms and MLP activation function run again inside its B): the estimate's
figures, the costs it gives a stage, documents that record it, the choice in ``solve`` and ``plan``, and the runtimes
that refuse it."""

from __future__ import annotations

import concurrent.futures as cf
import json
import re

import pytest
from typer.testing import CliRunner

from conftest import export_toy

from zbsolve import solve
from zbsolve.app.cli import app
from zbsolve.base.errors import InputError
from zbsolve.base.units import GIB
from zbsolve.core.simulator import simulate
from zbsolve.io.targets import export_document
from zbsolve.planning.planner import plan
from zbsolve.planning.targets import may_take, recompute_choices
from zbsolve.problem.costs import check_fits
from zbsolve.costmodel.estimate import estimate
from zbsolve.costmodel.hf_config import architecture
from zbsolve.costmodel.model import Layer, Model
from zbsolve.problem.recompute import Recompute, described, parse_recompute
from zbsolve.problem.recompute_costs import layer_costs, stage_costs

runner = CliRunner()
LLAMA = "problems/models/configs/llama3-70b.json"


def selective_toy(blocks: int = 4) -> Model:
    """Blocks of F = 1, B = 1, W = 1 keeping 1 GiB a microbatch, all read by W; selective: 0.1 s, 0.5 GiB."""
    return Model(name="sel", layers=[
        Layer(name=n, block=n.startswith("layers."), t_f=1.0, t_b=1.0, t_w=1.0, mem_f=GIB, mem_b=0, mem_w=-GIB,
              static_bytes=GIB // 8, out_bytes=GIB // 64,
              **({"t_sel": 0.1, "mem_sel": GIB // 2} if n.startswith("layers.") else {}))
        for n in ("tok_embeddings", *(f"layers.{i}" for i in range(blocks)), "output")])


def test_selective_choices_are_read_written_and_refused_by_name():
    assert parse_recompute("selective") == Recompute("none", selective=True)
    for text in ("selective", "selective+uniform:2", "selective+per-stage", "selective+per-stage:1,0"):
        assert str(parse_recompute(text)) == text
    assert parse_recompute("selective+per-stage").undecided and not parse_recompute("per-stage:1").undecided
    for bad in ("selective+full", "selective+none", "selective+", "selective+uniform:0"):
        with pytest.raises(InputError, match=re.escape(f"recompute = {bad!r}: should be one of")):
            parse_recompute(bad)


def test_the_estimate_gives_a_block_the_norm_and_activation_outputs_and_their_traffic():
    """Per token over tp: F keeps e·(2·h + f) less (two norm outputs, the gated product) and B reads and writes
    e·(4·h + 3·f) more over HBM at the efficiency."""
    model = estimate(LLAMA, gpu="h100", seq_len=8192, microbatch_size=1, tp=4, efficiency=0.4)
    arch, e, tokens = architecture(LLAMA), 2, 8192
    block = model.layers[1]
    assert block.mem_sel == tokens * e * (2 * arch.hidden + arch.ffn) // 4
    assert block.t_sel == pytest.approx(tokens * e * (4 * arch.hidden + 3 * arch.ffn) / 4 / (3.35e12 * 0.4))
    assert all(layer.mem_sel is None for layer in model.layers if not layer.block)
    costs = layer_costs(model, 1, recomputes=False, selective=True)
    assert costs["t_b"] == block.t_b + block.t_sel and costs["mem_f"] == block.mem_f - block.mem_sel
    assert costs["mem_f"] + costs["mem_b"] + costs["mem_w"] == 0 and costs["mem_r"] == block.mem_sel
    whole = layer_costs(model, 1, recomputes=True, selective=True)  # recomputing whole wins over selective
    assert whole == layer_costs(model, 1, recomputes=True)


def test_a_stage_of_selective_blocks_holds_no_more_inside_b_than_after_it():
    """W reads all a block keeps (M_W = M_B): what B makes again stays, so B raises the level and holds nothing
    above its end."""
    model = selective_toy()
    stage = stage_costs(model, 1, 5, recomputed=(), selective={1, 2, 3, 4})
    assert stage["mem_f"] == 4 * GIB // 2 and stage["mem_b"] == 4 * GIB // 2 and stage["mem_r"] == 0
    assert stage["t_b"] == pytest.approx(4 * 1.1)
    mixed = stage_costs(model, 1, 5, recomputed={1}, selective={2, 3, 4})
    assert mixed["mem_f"] == GIB // 64 + 3 * GIB // 2 and mixed["t_b"] == pytest.approx(4 + 1 + 0.3)
    assert described(model, [(0, 3), (3, 6)], recomputed={1}, selective={2, 3, 4}) == "selective+per-stage:1,0"
    assert described(model, [(0, 3), (3, 6)], recomputed=(), selective={1, 2, 3, 4}) == "selective"
    assert described(model, [(0, 3), (3, 6)], recomputed=(), selective={1}) == "layers"


def test_selective_needs_the_figures_and_names_the_layer():
    with pytest.raises(InputError, match="recompute = 'selective': layer layers.0 has no t_sel and mem_sel"):
        solve(export_toy(), num_devices=2, num_microbatches=4, recompute="selective", solver="heuristic")
    with pytest.raises(ValueError, match="give both t_sel and mem_sel"):
        Layer(name="x", t_f=1, t_b=1, t_w=1, mem_f=2, mem_b=0, mem_w=-2, static_bytes=0, out_bytes=0, t_sel=0.1)


def test_a_selective_document_is_checked_and_its_layers_must_have_the_figures(tmp_path):
    result = solve(selective_toy(), num_devices=2, num_microbatches=4, recompute="selective+per-stage:1,0",
                   solver="heuristic", device_memory=8 * GIB, reserve=0)
    assert result.costs.recomputed == (1,) and result.costs.selective == (2, 3, 4)
    check_fits(result.costs, simulate(result.schedule))
    path = tmp_path / "plan.json"
    result.to_json(path)
    data = json.loads(path.read_text())
    assert data["partition"]["selective"] == [2, 3, 4] and data["partition"]["layers"][1]["mem_sel"] == GIB // 2
    run = runner.invoke(app, ["check", str(path), "--json"])
    assert run.exit_code == 0, run.output
    assert json.loads(run.stdout)["peak_memory_per_device"] == list(simulate(result.schedule).peak_memory)
    for selective, message in (([1, 2], "partition.selective names layer 1, which partition.recompute recomputes "
                                        "whole"),
                               ([2, 3], "profile.t_b[1] = ")):
        bad = {**data, "partition": {**data["partition"], "selective": selective}}
        path.write_text(json.dumps(bad))
        run = runner.invoke(app, ["check", str(path)])
        assert run.exit_code == 2 and message in " ".join(run.output.split())


def test_selective_lets_an_order_fit_that_does_not_fit_without_it():
    """Every layer keeps 1 GiB a microbatch, each stage three layers: within 5.5 GiB less 0.375 GiB of weights a
    device holds one microbatch in flight without recomputation, two with its blocks selective (1F1B fits, its
    fused backward holding the half GiB each selective block makes again for W)."""
    model = selective_toy()
    timelines = {}
    for recompute in ("none", "selective"):
        result = solve(model, num_devices=2, num_microbatches=8, device_memory=11 * GIB // 2, reserve=0,
                       partition=[3, 3], recompute=recompute, solver="heuristic")
        timelines[recompute] = simulate(result.schedule)
        check_fits(result.costs, timelines[recompute])
    assert timelines["selective"].makespan < timelines["none"].makespan


def test_per_stage_on_selective_blocks_recomputes_whole_only_what_selective_cannot_fit():
    """Six blocks on two stages: at 5.5 GiB stage 0 needs one block recomputed whole beside the selective ones (at
    6 GiB and more 1F1B's fused backwards fit it with selective blocks alone); at 16 GiB everything fits as it is,
    and no recomputation is the fastest."""
    model = selective_toy(blocks=6)
    chosen = {}
    for memory in (11 * GIB // 2, 16 * GIB):
        result = solve(model, num_devices=2, num_microbatches=8, device_memory=memory, reserve=0, partition=[4, 4],
                       recompute="selective+per-stage", solver="heuristic", time_limit=30, workers=1)
        timeline = simulate(result.schedule)
        assert timeline.makespan == result.step_time
        check_fits(result.costs, timeline)
        chosen[memory] = described(model, result.costs.ranges, result.costs.recomputed, result.costs.selective)
    assert chosen[11 * GIB // 2] == "selective+per-stage:1,0" and chosen[16 * GIB] == "none"


def test_megatron_refuses_selective_and_torchtitan_runs_it_on_dense_blocks_only(tmp_path):
    dense = selective_toy()
    experts = Model(name="moe", layers=[layer.model_copy(update={"comm_f": 0.1, "comm_b": 0.1}) if layer.block
                                        else layer for layer in dense.layers])
    for target in ("zbsolve", "torchtitan"):
        assert "selective" in recompute_choices(target, "auto", dense)
        assert may_take(target, "auto", "selective+per-stage:1,0", dense)
    assert not any("selective" in c for c in recompute_choices("megatron", "auto", dense))
    with pytest.raises(InputError, match="megatron cannot run zbsolve's selective recomputation"):
        recompute_choices("megatron", "selective")
    assert not may_take("megatron", "auto", "selective")
    assert not any("selective" in c for c in recompute_choices("torchtitan", "auto", experts))
    with pytest.raises(InputError, match=r"runtime table: torchtitan\.selective_experts"):
        recompute_choices("torchtitan", "selective", experts)
    assert not may_take("torchtitan", "auto", "selective", experts) and may_take("zbsolve", "auto", "selective",
                                                                                   experts)
    path = tmp_path / "plan.json"
    solve(dense, num_devices=2, num_microbatches=4, recompute="selective", solver="heuristic",
          device_memory=8 * GIB, reserve=0).to_json(path)
    with pytest.raises(InputError, match="partition.selective = layers.0, layers.1, layers.2, ...: Megatron"):
        export_document(path, "megatron", None)
    written, _ = export_document(path, "torchtitan", tmp_path / "tt")
    assert (tmp_path / "tt" / "plan.json").read_bytes() == path.read_bytes()
    run = runner.invoke(app, ["export", str(path), "--format", "megatron"])
    assert run.exit_code == 2 and "plan with --target megatron" in " ".join(run.output.split())


def test_a_plan_may_choose_selective_and_its_schedule_is_the_simulators():
    with cf.ThreadPoolExecutor(1) as pool:  # candidates timed in this process: a worker's start costs more
        result = plan(selective_toy(blocks=6), num_devices=2, num_microbatches=8, device_memory=4 * GIB, reserve=0,
                      recompute="auto", time_limit=8, executor=pool)
    timeline = simulate(result.timeline.schedule)
    assert timeline.makespan == pytest.approx(result.step_time)
    check_fits(result.costs, timeline)
    assert result.recompute == described(result.costs.model, result.costs.ranges, result.costs.recomputed,
                                         result.costs.selective)
