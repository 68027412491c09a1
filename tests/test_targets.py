"""plan --target keeps the search to what the runtime can run; --baseline-layout adds Megatron's layout rows."""

from __future__ import annotations

import concurrent.futures as cf
import json
from pathlib import Path

import pytest
from conftest import MEGATRON_CORE_FIELDS, act_heavy, load_torchtitan_config, megatron_flags, torchtitan_export
from typer.testing import CliRunner

from zbsolve.app.cli import app
from zbsolve.base.errors import InputError
from zbsolve.base.units import GIB
from zbsolve.core.placement import placement_name
from zbsolve.core.schedule import pair_count
from zbsolve.core.simulator import simulate
from zbsolve.costmodel.model import Model
from zbsolve.io.targets import TARGETS, export_document
from zbsolve.io.targets.megatron import megatron_args
from zbsolve.io.targets.plan import read_plan
from zbsolve.planning.planner import plan
from zbsolve.planning.targets import may_take, recompute_choices
from zbsolve.problem.costs import check_fits
from zbsolve.problem.recompute import parse_recompute

runner = CliRunner()




def test_each_target_runs_only_its_recomputation_choices():
    # torchtitan runs any blocks, whole or selective, through zbsolve's PlannedAC: as zbsolve does.
    assert recompute_choices("torchtitan", "auto") == recompute_choices("zbsolve", "auto") == (
        "none", "full", "per-stage", "selective", "selective+per-stage")
    assert recompute_choices("megatron", "uniform:2") == ("uniform:2",)
    assert recompute_choices("torchtitan", "per-stage") == ("per-stage",)
    assert recompute_choices("torchtitan", "selective+uniform:1") == ("selective+uniform:1",)
    with pytest.raises(InputError, match=r"recompute = 'per-stage:1,2': megatron runs only none, full, uniform"):
        recompute_choices("megatron", "per-stage:1,2")
    with pytest.raises(InputError, match=r"target = 'deepspeed' is unknown"):
        recompute_choices("deepspeed", "none")
    assert may_take("torchtitan", "auto", "full") and may_take("torchtitan", "auto", "uniform:2")
    assert may_take("torchtitan", "auto", "selective") and not may_take("megatron", "auto", "selective")
    assert may_take("megatron", "per-stage", "uniform:3") and not may_take("zbsolve", "none", "full")


def test_torchtitan_recomputes_only_dense_blocks_selectively():
    """A model with experts (an all-to-all in its blocks' F and B): torchtitan's row takes no selective block with
    experts (PlannedAC is built for the dense llama3 block), so neither the choices nor a baseline's may be
    selective; zbsolve's row takes them."""
    moe = Model.load(Path(__file__).parent.parent / "problems" / "models" / "qwen3-30b-a3b.yaml")
    assert recompute_choices("torchtitan", "auto", moe) == ("none", "full", "per-stage")
    assert "selective" in recompute_choices("zbsolve", "auto", moe)
    assert recompute_choices("torchtitan", "auto", act_heavy()) == recompute_choices("torchtitan", "auto")
    with pytest.raises(InputError, match=r"^recompute = 'selective\+per-stage': blocks layers\.0, layers\.1, "
                                         r"layers\.2, \.\.\. have experts: torchtitan 0\.3\.0 recomputes only dense "
                                         r"blocks selectively \(runtime table: torchtitan\.selective_experts\)$"):
        recompute_choices("torchtitan", "selective+per-stage", moe)
    assert not may_take("torchtitan", "auto", "selective", moe) and may_take("torchtitan", "auto", "full", moe)
    assert may_take("zbsolve", "auto", "selective", moe)
    assert TARGETS["torchtitan"].selective and not TARGETS["torchtitan"].selective_experts


@pytest.mark.parametrize("target", ["torchtitan", "megatron"])
def test_a_plan_for_a_runtime_searches_and_returns_only_what_it_runs(target):
    with cf.ThreadPoolExecutor(1) as pool:
        result = plan(act_heavy(), num_devices=2, num_microbatches=8, device_memory=7 * GIB, reserve=0,
                      recompute="auto", target=target, time_limit=10, executor=pool)
    modes = {"torchtitan": {"none", "full", "uniform", "per-stage"}, "megatron": {"none", "full", "uniform"}}[target]
    assert {parse_recompute(c.recompute).mode for c in result.candidates} <= modes
    assert parse_recompute(result.recompute).mode in modes
    if target == "megatron":
        assert "vshape" not in {c.placement for c in result.candidates} and result.placement != "vshape"
    timeline = simulate(result.timeline.schedule)
    assert timeline.makespan == result.step_time
    check_fits(result.costs, timeline)


def test_plan_refuses_what_the_target_cannot_run_in_one_line(tmp_path):
    path = tmp_path / "act.yaml"
    act_heavy().save(path)
    for args, line in ((["--placement", "vshape", "--target", "megatron"],
                        "placement = 'vshape': Megatron (megatron-core 0.16.1) builds sequential x1, interleaved "
                        "(stages per device), not vshape x2 (runtime table: megatron.placements)"),
                       (["--recompute", "per-stage", "--target", "megatron"],
                        "recompute = 'per-stage': megatron runs only none, full, uniform"),
                       (["--baseline-layout", "Et*3|t*4L"], "layout = 'Et*3|t*4L'")):
        out = runner.invoke(app, ["plan", str(path), "-p", "2", "-m", "8", "--device-memory", "7GiB", *args])
        assert out.exit_code == 2, out.output
        assert line in out.output and len(out.output.strip().splitlines()) == 1, out.output


def test_a_layout_given_is_a_baseline_row_checked_by_the_simulator():
    with cf.ThreadPoolExecutor(1) as pool:
        result = plan(act_heavy(), num_devices=2, num_microbatches=8, device_memory=7 * GIB, reserve=0,
                      placement="interleaved", time_limit=10, executor=pool, baseline_layout="Et*2|t*2|t*2|t*2L")
    rows = [b for b in result.baselines if b.split == "layout"]
    assert rows and all(b.chunks == 2 for b in rows)
    assert result.step_time <= min(b.step_time for b in rows if b.fits) * (1 + 1e-9)


MODELS = sorted((Path(__file__).parent.parent / "problems" / "models").glob("*.yaml"))
FORMAT = {"zbsolve": "torch-csv", "torchtitan": "torchtitan", "megatron": "megatron"}
"""The export that carries a plan for each target to its runtime (zbsolve's executor reads the document itself)."""


# megatron-core 0.16.1 warns of its own default cuda_graph_scope ("full") whatever the arguments.
@pytest.mark.filterwarnings("ignore:full scope is deprecated:UserWarning")
@pytest.mark.parametrize("target", list(TARGETS))
@pytest.mark.parametrize("path", MODELS, ids=[path.stem for path in MODELS])
def test_a_plan_for_a_target_is_one_its_export_accepts(tmp_path, target, path):
    model = Model.load(path)
    row = TARGETS[target]
    if any(layer.mtp for layer in model.layers) and not row.mtp:
        with pytest.raises(InputError, match=rf"runtime table: {target}\.mtp\)$"):
            plan(model, num_devices=4, num_microbatches=8, chunks="auto", target=target, device_memory="4TiB",
                 time_limit=2, jobs=1)
        return
    # two stages per device (sequential x1, interleaved x2, V-shape x2): a split bound each, not twelve; timed in
    # this process (a worker process would spend more starting than timing)
    with cf.ThreadPoolExecutor(1) as pool:
        result = plan(model, num_devices=4, num_microbatches=8, chunks=2, target=target, device_memory="4TiB",
                      time_limit=2, executor=pool)
    schedule = result.timeline.schedule
    assert simulate(schedule).makespan == result.step_time
    name = placement_name(schedule.placement)
    assert name is not None and row.placement_refusal(*name) is None
    assert row.pairs or pair_count(schedule) == 0 or schedule.name in row.paired_orders
    assert target in result.runtimes and result.summary()["target"] == target
    assert "zbsolve" in result.runtimes and (name[0] != "vshape" or "megatron" not in result.runtimes)
    doc = tmp_path / "plan.json"
    result.to_json(doc)
    assert json.loads(doc.read_text())["plan"]["runs as planned on"] == ", ".join(result.runtimes)
    read_plan(doc, FORMAT[target]).check(row)
    written, text = export_document(doc, FORMAT[target], tmp_path / "export")
    assert written and text
    RUNTIME_CHECKS.get(target, lambda *_: None)(model, doc, tmp_path)


def _megatron_core_takes(model: Model, doc: Path, tmp_path: Path) -> None:
    """megatron-core's TransformerConfig takes every flag of the export that is one of its fields, the layout
    validated against the model's blocks and MTP layers."""
    pytest.importorskip("megatron.core", reason="megatron-core is not installed (the dev extra pins 0.16.1)")
    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig

    flags = megatron_flags(megatron_args(read_plan(doc, "megatron")))
    values = {MEGATRON_CORE_FIELDS[flag]: int(v) if isinstance(v, str) and v.isdigit() else v
              for flag, v in flags.items() if flag in MEGATRON_CORE_FIELDS}
    tp, mtp = values.get("tensor_model_parallel_size", 1), len(model.mtp_layers)
    made = TransformerConfig(num_layers=sum(layer.block for layer in model.layers), hidden_size=64 * tp,
                             num_attention_heads=tp, pipeline_dtype=torch.bfloat16,
                             **({"num_moe_experts": 64} if "expert_model_parallel_size" in values else {}),
                             **({"mtp_num_layers": mtp} if mtp else {}), **values)
    assert str(made.pipeline_model_parallel_layout) == flags["--pipeline-model-parallel-layout"]


def _torchtitan_takes(model: Model, doc: Path, tmp_path: Path) -> None:
    """torchtitan's ConfigManager parses the export's arguments into its Trainer.Config (its checks run), holding
    the pipeline's keys."""
    config, args, _ = torchtitan_export(tmp_path, doc)
    parsed = load_torchtitan_config(args)
    for key, value in config["parallelism"].items():
        assert getattr(parsed.parallelism, key) == value, key


RUNTIME_CHECKS = {"megatron": _megatron_core_takes, "torchtitan": _torchtitan_takes}
"""Each runtime's own check of an export: its config class or config loader."""


def test_a_placement_the_target_does_not_run_is_named_not_dropped_silently():
    from zbsolve.planning.targets import runnable

    notes: list[str] = []
    kept = runnable("torchtitan", act_heavy(), [("vshape", 2), ("vshape", 4), ("interleaved", 3)], "auto", 2, 8,
                    notes.append)
    assert kept == [("vshape", 2), ("interleaved", 3)]
    assert notes == ["vshape x4: not searched for --target torchtitan: torchtitan 0.3.0 builds sequential x1, "
                     "interleaved, vshape x2 (stages per device), not vshape x4 (runtime table: "
                     "torchtitan.placements)"]
