"""Exports carry the plan's recomputation: Megatron's --recompute-* arguments and torchtitan's activation_checkpoint
policy (or, for some blocks only, zbsolve's PlannedAC through torchtitan's --override.imports) say which blocks
recompute exactly as the document's "partition.recompute" does, or the export is refused in one line; the torch CSV
does not change."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from conftest import export_toy
from typer.testing import CliRunner

from zbsolve.app.cli import app
from zbsolve.base.errors import InputError
from zbsolve.io.document import read_document
from zbsolve.io.targets import export_document
from zbsolve.io.targets.plan import read_plan
from zbsolve.io.torch_csv import torch_csv
from zbsolve.optimize.solve import solve
from zbsolve.problem.partition import stage_profile
from zbsolve.problem.recompute_costs import COSTS

pytest.importorskip("torch.distributed.pipelining",
                    reason="torch.distributed.pipelining is not available (the torch extra)")

runner = CliRunner()
MEGATRON_RECOMPUTE = ("--recompute-granularity", "--recompute-method", "--recompute-num-layers")




def _document(tmp_path: Path, placement: str, recompute: str, partition: str | list[int] = "uniform") -> Path:
    """A plan of the toy model on 2 devices, 4 microbatches, solved with ``recompute``."""
    path = tmp_path / f"{placement}-{recompute.replace(':', '')}.json"
    solve(export_toy(), num_devices=2, num_microbatches=4, placement=placement, solver="heuristic",
          partition=partition, recompute=recompute).to_json(path)
    return path


def _recomputing(doc: Path, recomputed: list[int]) -> Path:
    """``doc`` with ``recomputed`` written by hand into "partition.recompute", its profile summed again to match."""
    plan = read_plan(doc, "megatron")
    data = json.loads(doc.read_text())
    data["partition"]["recompute"] = recomputed
    sums = stage_profile(plan.model, plan.stages, recomputed).model_dump()
    data["profile"] = {**{key: value for key, value in data["profile"].items() if key not in COSTS},
                       **{key: value for key, value in sums.items() if key in COSTS}}
    path = doc.with_name(f"by-hand-{doc.name}")
    path.write_text(json.dumps(data))
    return path


def _megatron(doc: Path) -> dict[str, str]:
    """Megatron's arguments the export prints, by flag."""
    args = shlex.split(export_document(doc, "megatron", None)[1])
    return dict(zip(args[::2], args[1::2]))


def _megatron_checkpoint_units(method: str, n: int, num_layers: int) -> list[list[int]]:
    """The layers megatron-core 0.16.1 checkpoints together in one virtual stage's block of ``num_layers`` layers
    (``TransformerBlock._checkpointed_forward``, megatron/core/transformer/transformer_block.py l.532-565):
    ``uniform`` checkpoints groups of n layers in turn, ``block`` each of the first n layers alone."""
    if method == "uniform":
        return [list(range(i, min(i + n, num_layers))) for i in range(0, num_layers, n)]
    return [[i] for i in range(min(n, num_layers))]


@pytest.mark.parametrize("placement", ["sequential", "interleaved"])
@pytest.mark.parametrize("recompute", ["full", "uniform:1", "uniform:2"])
def test_megatron_recomputes_the_plans_blocks_one_at_a_time(tmp_path: Path, placement: str, recompute: str) -> None:
    """Whatever the arguments, Megatron checkpoints each recomputed block alone (zbsolve's per-block cost model) and
    exactly the blocks the document lists, stage by stage."""
    doc = _document(tmp_path, placement, recompute)
    plan = read_plan(doc, "megatron")
    args = _megatron(doc)
    assert args["--recompute-granularity"] == "full"
    method, n = args["--recompute-method"], int(args["--recompute-num-layers"])
    assert method == "block" or n == 1
    for blocks, chosen in plan.stage_recompute():
        units = _megatron_checkpoint_units(method, n, len(blocks))
        assert all(len(unit) == 1 for unit in units)
        assert [blocks[i] for unit in units for i in unit] == chosen


@pytest.mark.parametrize("placement,recompute,method,n", [
    ("sequential", "full", "uniform", 1),
    ("interleaved", "full", "uniform", 1),
    ("sequential", "uniform:1", "block", 1),
    ("sequential", "uniform:2", "block", 2),
    # Stages of 2, 2, 1 and 1 blocks: the first block of each.
    ("interleaved", "uniform:1", "block", 1),
    # uniform:2 recomputes every block of these stages.
    ("interleaved", "uniform:2", "uniform", 1),
])
def test_megatron_recompute_arguments(tmp_path: Path, placement: str, recompute: str, method: str, n: int) -> None:
    args = _megatron(_document(tmp_path, placement, recompute))
    assert {flag: args[flag] for flag in MEGATRON_RECOMPUTE} == {
        "--recompute-granularity": "full", "--recompute-method": method, "--recompute-num-layers": str(n)}


def test_megatron_block_n_covers_stages_with_fewer_blocks(tmp_path: Path) -> None:
    """Stages of 2 and 4 blocks, the first 2 of each recomputed: all of the first stage's, which block 2 does."""
    doc = _document(tmp_path, "sequential", "uniform:2", partition=[3, 6])
    assert [len(blocks) for blocks, _ in read_plan(doc, "megatron").stage_recompute()] == [2, 4]
    assert _megatron(doc)["--recompute-method"] == "block" and _megatron(doc)["--recompute-num-layers"] == "2"


def test_no_recomputation_writes_no_recompute_arguments(tmp_path: Path) -> None:
    doc = _document(tmp_path, "sequential", "none")
    assert export_document(doc, "megatron", None)[1] == \
        "--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout 'Et*3|t*3L'"


@pytest.mark.parametrize("recomputed,message", [
    ([1, 4, 5], "partition.recompute: stages 0-1 recompute [1, 2] of their [3, 3] blocks; Megatron's "
                "--recompute-num-layers N recomputes the first N blocks of every stage, one N for all"),
    ([1, 2, 3, 4], "partition.recompute: stages 0-1 recompute [3, 1] of their [3, 3] blocks; Megatron's "
                   "--recompute-num-layers N recomputes the first N blocks of every stage, one N for all"),
    ([2, 4], "partition.recompute: stage 0 recomputes [layers.1] of its blocks [layers.0, layers.1, layers.2], not "
             "the first ones; Megatron's --recompute-method block recomputes the first N blocks of every stage"),
])
def test_megatron_refuses_what_one_n_cannot_say(tmp_path: Path, recomputed: list[int], message: str) -> None:
    doc = _recomputing(_document(tmp_path, "sequential", "none"), recomputed)
    with pytest.raises(InputError) as refused:
        export_document(doc, "megatron", None)
    assert str(refused.value) == message
    out = tmp_path / "megatron.txt"
    run = runner.invoke(app, ["export", str(doc), "-f", "megatron", "-o", str(out)], env={"COLUMNS": "100000"})
    assert run.exit_code == 2 and run.stdout == "" and run.stderr.strip() == f"error: {message}"
    assert not out.exists()


@pytest.mark.parametrize("placement", ["sequential", "interleaved", "vshape"])
@pytest.mark.parametrize("recompute,policy", [("full", "full"), ("none", "none")])
def test_torchtitan_policy(tmp_path: Path, placement: str, recompute: str, policy: str) -> None:
    folder = tmp_path / "tt"
    export_document(_document(tmp_path, placement, recompute), "torchtitan", folder)
    config = json.loads((folder / "torchtitan.json").read_text())
    assert config["activation_checkpoint"] == policy and "override" not in config
    assert not (folder / "plan.json").exists()
    # tyro takes a subcommand after the flags only.
    args = shlex.split((folder / "torchtitan-args.txt").read_text())
    assert args[-1] == f"activation-checkpoint:{policy}" and not any(a.startswith("activation") for a in args[:-1])


@pytest.mark.parametrize("recompute,recomputed,counts", [("uniform:1", None, [1, 1]), ("none", [1, 4, 5], [1, 2])])
def test_torchtitan_runs_anything_but_all_or_none_through_planned_ac(tmp_path: Path, recompute: str,
                                                                      recomputed: list[int] | None,
                                                                      counts: list[int]) -> None:
    """No torchtitan policy recomputes some blocks only: the export hands them to zbsolve's PlannedAC through
    torchtitan's --override.imports, with the document beside the CSV, in place of a full policy."""
    doc = _document(tmp_path, "sequential", recompute)
    if recomputed is not None:
        doc = _recomputing(doc, recomputed)
    folder, notes = tmp_path / "tt", []
    written, _ = export_document(doc, "torchtitan", folder, note=notes.append)
    assert written[-1] == folder / "plan.json" and (folder / "plan.json").read_text() == doc.read_text()
    config = json.loads((folder / "torchtitan.json").read_text())
    target = "zbsolve.execute.torchtitan_recompute.planned_recompute"
    assert config["override"] == {"imports": [[target, {"plan": "plan.json"}]]}
    assert config["activation_checkpoint"] == "full"
    args = shlex.split((folder / "torchtitan-args.txt").read_text())
    assert args[-3:] == ["--override.imports", f'{target}={{"plan": "plan.json"}}', "activation-checkpoint:full"]
    assert any(note.startswith(f"partition.recompute/selective: stages 0-1 recompute {counts} of their [3, 3] blocks "
                               "whole, which no torchtitan policy does") for note in notes)


@pytest.mark.parametrize("recompute", ["full", "uniform:1"])
def test_the_torch_csv_is_the_schedules_whatever_recomputes(tmp_path: Path, recompute: str) -> None:
    """Recomputation happens inside a stage's B: the CSV's rows are the schedule's, recomputing or not."""
    doc = _document(tmp_path, "sequential", recompute)
    schedule = read_document(doc)[0]
    expected = torch_csv(schedule)
    assert len(expected.splitlines()) == schedule.num_devices
    assert export_document(doc, "torch-csv", tmp_path / "s.csv")[1] == (tmp_path / "s.csv").read_text() == expected
    if recompute == "full":
        export_document(doc, "torchtitan", tmp_path / "tt")
        assert (tmp_path / "tt" / "schedule.csv").read_text() == expected


def test_torchtitan_takes_the_policy(tmp_path: Path) -> None:
    """torchtitan's command-line parser reads the subcommand as its FullAC policy, which wraps every block of a
    model part and nothing else."""
    ac = pytest.importorskip("torchtitan.distributed.activation_checkpoint",
                             reason="torchtitan is not installed (the dev extra pins 0.3.0)")
    configs = pytest.importorskip("torchtitan.config", reason="torchtitan is not installed (the dev extra pins 0.3.0)")
    manager = pytest.importorskip("torchtitan.config.manager",
                                  reason="torchtitan is not installed (the dev extra pins 0.3.0)")
    import dataclasses

    import torch.nn as nn
    import tyro
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    folder = tmp_path / "tt"
    export_document(_document(tmp_path, "interleaved", "full"), "torchtitan", folder)
    sections = dataclasses.make_dataclass("Sections", [
        ("parallelism", configs.ParallelismConfig, dataclasses.field(default_factory=configs.ParallelismConfig)),
        ("training", configs.TrainingConfig, dataclasses.field(default_factory=configs.TrainingConfig)),
        ("activation_checkpoint", ac.ActivationCheckpointingConfig,
         dataclasses.field(default_factory=ac.SelectiveAC.Config))])
    manager.ConfigManager()
    parsed = tyro.cli(sections, args=shlex.split((folder / "torchtitan-args.txt").read_text()),
                      registry=manager.custom_registry)
    assert isinstance(parsed.activation_checkpoint, ac.FullAC.Config)
    part = nn.Module()
    part.layers = nn.ModuleDict({str(i): nn.Linear(2, 2) for i in (2, 3)})
    part.norm = nn.Linear(2, 2)
    parsed.activation_checkpoint.build().apply(part)
    assert all(isinstance(block, CheckpointWrapper) for block in part.layers.values())
    assert not isinstance(part.norm, CheckpointWrapper)


# megatron-core 0.16.1 warns of its own default cuda_graph_scope ("full") whatever the arguments.
@pytest.mark.filterwarnings("ignore:full scope is deprecated:UserWarning")
def test_megatron_takes_the_arguments(tmp_path: Path) -> None:
    """megatron-core's TransformerConfig (from which Megatron-LM makes its --recompute-* arguments) accepts them."""
    config = pytest.importorskip("megatron.core.transformer.transformer_config",
                                 reason="megatron-core is not installed (the dev extra pins 0.16.1)")
    args = _megatron(_document(tmp_path, "sequential", "uniform:2"))
    fields = {flag[2:].replace("-", "_"): args[flag] for flag in MEGATRON_RECOMPUTE}
    made = config.TransformerConfig(num_layers=6, hidden_size=8, num_attention_heads=2, **{
        **fields, "recompute_num_layers": int(fields["recompute_num_layers"])})
    assert (made.recompute_granularity, made.recompute_method, made.recompute_num_layers) == ("full", "block", 2)
