"""The exports launch the run that was planned: the setting the costs are for (``Model.setting``: sequence length,
microbatch size, tp, dp, cp, ep, ZeRO, dtype) travels in the schedule document as "partition.setting", and the Megatron
and torchtitan exports write it by the runtimes' own names, each checked against the runtime's own code: Megatron's
flags against megatron-core's config fields and microbatch calculator (and Megatron-LM's own argument parser where a
checkout is named), torchtitan's keys through torchtitan's ConfigManager and its Trainer.Config checks. A plan whose
recomputation is not one policy for every block goes to torchtitan as zbsolve's PlannedAC, with the document beside
the CSV as plan.json."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import sys
import types
from pathlib import Path

import pytest
from conftest import MEGATRON_CORE_FIELDS, export_toy, load_torchtitan_config, megatron_flags, torchtitan_export
from typer.testing import CliRunner

from zbsolve.app.cli import app
from zbsolve.base.errors import InputError
from zbsolve.costmodel.model import Model, Setting
from zbsolve.io.document import load_document
from zbsolve.io.targets import export_document
from zbsolve.io.targets.megatron import megatron_args
from zbsolve.io.targets.plan import read_plan
from zbsolve.io.targets.torchtitan import OVERRIDE_TARGET, PLAN_NAME, torchtitan_args
from zbsolve.optimize.solve import solve

pytest.importorskip("torch.distributed.pipelining",
                    reason="torch.distributed.pipelining is not available (the torch extra)")

runner = CliRunner()
SETTING = Setting(seq_len=128, microbatch_size=2, tp=2, dp=2, dtype="bf16", gpu="h100")
"""A dense model's setting: tp 2 with sequence parallelism, two data-parallel replicas."""
MEGATRON_LM_DESTS = {"--fp8-format": "fp8"}
"""The flags whose parsed name is not the flag's own."""
MEGATRON_LM_FLAGS = {
    "--seq-length": "megatron/training/arguments.py l.2482 (megatron-core: GPTDatasetConfig.sequence_length)",
    "--micro-batch-size": "megatron/training/training_config.py TrainingConfig.micro_batch_size",
    "--global-batch-size": "megatron/training/training_config.py TrainingConfig.global_batch_size",
    "--use-distributed-optimizer": "megatron/training/arguments.py l.2283 (megatron-core: "
                                   "DistributedDataParallelConfig.use_distributed_optimizer)",
    "--use-megatron-fsdp": "megatron/training/arguments.py (megatron-core: DistributedDataParallelConfig"
                           ".use_megatron_fsdp)",
    "--data-parallel-sharding-strategy": "megatron/training/arguments.py (megatron-core: "
                                         "DistributedDataParallelConfig.data_parallel_sharding_strategy)",
    "--ckpt-format": "megatron/training/arguments.py l.690 (Megatron FSDP saves fsdp_dtensor checkpoints)",
}
"""The export's flags that Megatron-LM (tag core_v0.16.1) declares outside megatron-core, where, and the
megatron-core field each becomes."""


def _model(setting: Setting | None = SETTING, selective: bool = False, experts: bool = False) -> Model:
    """The export toy with ``setting``; blocks with selective figures, or with experts (an all-to-all in F and B)."""
    toy = export_toy()
    extra = {**({"t_sel": 0.1, "mem_sel": 1} if selective else {}), **({"comm_f": 0.5, "comm_b": 0.5} if experts
                                                                       else {})}
    layers = [layer.model_copy(update=extra) if layer.block else layer for layer in toy.layers]
    return Model(name=toy.name, setting=setting, layers=layers)


def _document(tmp_path: Path, model: Model, placement: str = "sequential", recompute: str = "none",
              name: str = "plan") -> Path:
    path = tmp_path / f"{name}.json"
    solve(model, num_devices=2, num_microbatches=4, placement=placement, solver="heuristic",
          recompute=recompute).to_json(path)
    return path


# -- partition.setting in the schedule document -------------------------------------------------------------------

def test_the_setting_travels_in_the_document(tmp_path: Path) -> None:
    doc = _document(tmp_path, _model())
    data = json.loads(doc.read_text())
    assert data["partition"]["setting"] == SETTING.model_dump(exclude_none=True)
    assert load_document(doc).costs.model.setting == SETTING
    assert read_plan(doc, "megatron").model.setting == SETTING
    bare = _document(tmp_path, _model(None), name="bare")
    assert "setting" not in json.loads(bare.read_text())["partition"]
    assert read_plan(bare, "megatron").model.setting is None


@pytest.mark.parametrize("key,value,message", [
    ("tp", 0, r"partition: setting\.tp = 0: .*greater than 0"),
    ("pp", 4, r"partition: setting\.pp = 4: unknown key$"),
    ("zero", 2, r"partition: setting\.zero = 2: "),
    ("seq_len", "long", r"partition: setting\.seq_len = 'long': "),
])
def test_a_bad_setting_is_one_line_naming_the_key(tmp_path: Path, key: str, value: object, message: str) -> None:
    doc = _document(tmp_path, _model())
    data = json.loads(doc.read_text())
    data["partition"]["setting"][key] = value
    doc.write_text(json.dumps(data))
    with pytest.raises(InputError, match=rf"^{doc}: {message}") as bad:
        load_document(doc)
    assert "\n" not in str(bad.value)
    run = runner.invoke(app, ["export", str(doc), "-f", "megatron"], env={"COLUMNS": "100000"})
    assert run.exit_code == 2 and run.stdout == "" and len(run.stderr.strip().splitlines()) == 1


# -- Megatron ------------------------------------------------------------------------------------------------------

def test_megatron_line_carries_the_setting(tmp_path: Path) -> None:
    doc = _document(tmp_path, _model())
    notes: list[str] = []
    text = export_document(doc, "megatron", None, note=notes.append)[1]
    assert text == ("--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --context-parallel-size 1 "
                    "--seq-length 128 --micro-batch-size 2 --global-batch-size 16 --pipeline-model-parallel-layout "
                    "'Et*3|t*3L' --bf16 --sequence-parallel")
    assert notes == ["Megatron takes the data-parallel size from the world size: launch on tp x cp x pp x dp = 2 x 1 "
                     "x 2 x 2 = 8 GPUs, so that --global-batch-size 16 is 4 microbatches of 2 per data-parallel "
                     "rank, the plan's"]


@pytest.mark.parametrize("setting,expected,absent", [
    (Setting(seq_len=64, microbatch_size=1, tp=1, dp=4, ep=4, dtype="fp16"),
     {"--expert-model-parallel-size": "4", "--expert-tensor-parallel-size": "1", "--fp16": True,
      "--global-batch-size": "16", "--moe-token-dispatcher-type": "alltoall"},
     ["--sequence-parallel", "--bf16", "--use-distributed-optimizer"]),
    (Setting(seq_len=64, microbatch_size=1, tp=1, dp=4, ep=4, dispatcher="flex"),
     {"--moe-token-dispatcher-type": "flex", "--moe-flex-dispatcher-backend": "deepep"}, ["--fp16"]),
    (Setting(seq_len=64, microbatch_size=1, tp=1, dp=4, dtype="fp8"),
     {"--fp8-format": "hybrid", "--fp8-recipe": "tensorwise", "--bf16": True}, ["--fp16"]),
    (Setting(seq_len=64, microbatch_size=1, tp=4, dp=2, zero=1, dtype="fp32"),
     {"--use-distributed-optimizer": True, "--sequence-parallel": True, "--global-batch-size": "8"},
     ["--bf16", "--fp16", "--expert-model-parallel-size"]),
    (Setting(seq_len=64, microbatch_size=1, tp=2, dp=2, cp=2),
     {"--context-parallel-size": "2", "--global-batch-size": "8"},
     ["--use-distributed-optimizer", "--use-megatron-fsdp", "--data-parallel-sharding-strategy"]),
    (Setting(seq_len=64, microbatch_size=1, tp=1, dp=4, cp=2, zero=3),
     {"--context-parallel-size": "2", "--use-distributed-optimizer": True, "--use-megatron-fsdp": True,
      "--data-parallel-sharding-strategy": "optim_grads_params"}, ["--sequence-parallel"]),
])
def test_megatron_writes_experts_dtype_and_zero(tmp_path: Path, setting: Setting, expected: dict, absent: list) -> None:
    flags = megatron_flags(megatron_args(read_plan(_document(tmp_path, _model(setting)), "megatron")))
    assert {flag: flags.get(flag) for flag in expected} == expected
    assert not set(absent) & set(flags)


def test_megatron_notes_what_it_cannot_write(tmp_path: Path) -> None:
    notes: list[str] = []
    bare = _document(tmp_path, _model(None), name="bare")
    assert export_document(bare, "megatron", None, note=notes.append)[1] == \
        "--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout 'Et*3|t*3L'"
    assert len(notes) == 1 and notes[0].startswith("partition.setting is missing (the model has no setting): the line "
                                                   "has no --tensor-model-parallel-size, --context-parallel-size")
    assert "--global-batch-size = micro-batch size x 4 microbatches x data-parallel size" in notes[0]
    notes.clear()
    odd = Setting(seq_len=64, microbatch_size=1, tp=1, dp=2, ep=8, dtype="int8")
    export_document(_document(tmp_path, _model(odd)), "megatron", None, note=notes.append)
    assert notes[1:] == ["partition.setting.dtype = 'int8' is not written: Megatron's flags are --bf16, --fp16, "
                         "--fp8-format hybrid --fp8-recipe tensorwise with --bf16 (fp8) or none (fp32)",
                         "--expert-model-parallel-size 8 with --expert-tensor-parallel-size 1 needs tp x cp x dp = 2 "
                         "ranks per pipeline stage to be a multiple of 8 (megatron-core's initialize_model_parallel "
                         "refuses it otherwise)"]
    run = runner.invoke(app, ["export", str(bare), "-f", "megatron"], env={"COLUMNS": "100000"})
    assert run.exit_code == 0 and run.stdout.strip() == "--pipeline-model-parallel-size 2 " \
                                                        "--pipeline-model-parallel-layout 'Et*3|t*3L'"
    assert run.stderr.startswith("note: partition.setting is missing")


SETTINGS = [SETTING, Setting(seq_len=64, microbatch_size=1, tp=2, dp=4, ep=4, dtype="fp16", dispatcher="flex"),
            Setting(seq_len=64, microbatch_size=4, tp=1, dp=2, zero=1, dtype="fp8"),
            Setting(seq_len=64, microbatch_size=1, tp=2, dp=2, cp=2),
            Setting(seq_len=64, microbatch_size=2, tp=1, dp=2, cp=2, zero=3)]
SETTING_IDS = ["dense", "experts-flex", "zero1-fp8", "cp2", "zero3"]


# megatron-core 0.16.1 warns of its own default cuda_graph_scope ("full") whatever the arguments.
@pytest.mark.filterwarnings("ignore:full scope is deprecated:UserWarning")
@pytest.mark.parametrize("setting", SETTINGS, ids=SETTING_IDS)
def test_megatron_core_takes_every_flag(tmp_path: Path, setting: Setting) -> None:
    """Each flag is a megatron-core config field that takes the value (TransformerConfig's checks run), or one
    Megatron-LM declares itself, whose megatron-core counterpart takes it: the microbatch calculator gives the
    plan's microbatches from the global batch, the micro-batch size and dp, with dp the world size the note
    launches on over tp x cp x pp (``initialize_model_parallel``); ZeRO-3 is Megatron FSDP's ZeRO-3 strategy."""
    config = pytest.importorskip("megatron.core.transformer.transformer_config",
                                 reason="megatron-core is not installed (the dev extra pins 0.16.1)")
    import torch
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.distributed.fsdp.src.megatron_fsdp.fully_shard import ShardingStrategy
    from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator

    doc = _document(tmp_path, _model(setting), recompute="uniform:1")
    notes: list[str] = []
    line = export_document(doc, "megatron", None, note=notes.append)[1]
    flags = megatron_flags(shlex.split(line))
    assert set(flags) <= set(MEGATRON_CORE_FIELDS) | set(MEGATRON_LM_FLAGS)
    values = {MEGATRON_CORE_FIELDS[flag]: int(value) if isinstance(value, str) and value.isdigit() else value
              for flag, value in flags.items() if flag in MEGATRON_CORE_FIELDS}
    made = config.TransformerConfig(num_layers=6, hidden_size=8, num_attention_heads=2, pipeline_dtype=torch.bfloat16,
                                    **({"num_moe_experts": 8} if setting.ep else {}), **values)
    # The layout comes back parsed (PipelineParallelLayerLayout), printed as given.
    assert {name: str(getattr(made, name)) for name in values} == {name: str(value) for name, value in values.items()}
    assert made.sequence_parallel == (setting.tp > 1)
    calculator = ConstantNumMicroBatchesCalculator(int(flags["--global-batch-size"]), int(flags["--micro-batch-size"]),
                                                   setting.dp, False, 0)
    assert calculator.get() == 4
    world = int(notes[0].split(" GPUs")[0].rsplit(" ", 1)[1])
    assert world // (made.tensor_model_parallel_size * made.context_parallel_size
                     * made.pipeline_model_parallel_size) == setting.dp
    assert made.context_parallel_size == (setting.cp or 1)
    assert {"sequence_length"} <= {f.name for f in dataclasses.fields(GPTDatasetConfig)}
    ddp = DistributedDataParallelConfig(
        use_distributed_optimizer="--use-distributed-optimizer" in flags,
        use_megatron_fsdp="--use-megatron-fsdp" in flags,
        data_parallel_sharding_strategy=flags.get("--data-parallel-sharding-strategy", "no_shard"))
    assert ddp.use_distributed_optimizer == (setting.zero > 0) and ddp.use_megatron_fsdp == (setting.zero == 3)
    assert ShardingStrategy[ddp.data_parallel_sharding_strategy.upper()] == (3 if setting.zero == 3 else 0)


@pytest.mark.skipif(not os.environ.get("ZBSOLVE_MEGATRON_LM"),
                    reason="ZBSOLVE_MEGATRON_LM names no Megatron-LM checkout (tag core_v0.16.1)")
@pytest.mark.parametrize("setting", SETTINGS, ids=SETTING_IDS)
def test_megatron_lm_parses_the_line(tmp_path: Path, setting: Setting, monkeypatch) -> None:
    """Megatron-LM's own parser (``add_megatron_arguments`` of ``megatron/training/arguments.py`` in the checkout
    ``ZBSOLVE_MEGATRON_LM`` names) takes the line and reads each value back, and its ``validate_args`` accepts it
    (with the toy's sizes, on tp x pp x dp ranks) and derives the plan's microbatches. ``megatron/training/__init__.py``
    and ``utils.py`` import its tokenizers and training loop, so they are stood in for by the helpers the arguments
    module imports."""
    import argparse
    import warnings

    if setting.zero != 3:  # validate_args asks for it with tensor parallelism, and refuses it with Megatron FSDP
        monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    checkout = Path(os.environ["ZBSOLVE_MEGATRON_LM"])
    saved = {name: sys.modules.get(name) for name in ("megatron.training", "megatron.training.utils",
                                                       "megatron.training.arguments")}
    package = types.ModuleType("megatron.training")
    package.__path__ = [str(checkout / "megatron" / "training")]  # type: ignore[attr-defined]
    utils = types.ModuleType("megatron.training.utils")
    utils.__dict__.update(get_device_arch_version=lambda: 9, print_rank_0=lambda *a, **k: None,
                          warn_rank_0=lambda *a, **k: None, is_rank0=lambda: False,
                          update_use_dist_ckpt=lambda args: setattr(args, "use_dist_ckpt", args.ckpt_format != "torch"))
    sys.modules.update({"megatron.training": package, "megatron.training.utils": utils})
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from megatron.training.arguments import add_megatron_arguments, validate_args

            args = megatron_args(read_plan(_document(tmp_path, _model(setting), recompute="uniform:1"), "megatron"))
            parser = add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
            parsed = parser.parse_args(args)
            sizes = ["--num-layers", "6", "--hidden-size", "64", "--num-attention-heads", "4",
                     "--max-position-embeddings", str(setting.seq_len)]
            experts = ["--num-experts", "8"] if setting.ep else []
            checked = parser.parse_args(args + sizes + experts)
            checked.world_size, checked.rank = setting.tp * (setting.cp or 1) * 2 * setting.dp, 0
            validate_args(checked, {})
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    for flag, value in megatron_flags(args).items():
        assert str(getattr(parsed, MEGATRON_LM_DESTS.get(flag, flag[2:].replace("-", "_")))) == str(value)
    assert checked.data_parallel_size == setting.dp and checked.sequence_parallel == (setting.tp > 1)
    assert checked.global_batch_size // (checked.micro_batch_size * checked.data_parallel_size) == 4


# -- torchtitan ----------------------------------------------------------------------------------------------------


def test_torchtitan_config_carries_the_setting(tmp_path: Path) -> None:
    config, args, notes = torchtitan_export(tmp_path, _document(tmp_path, _model()))
    parallelism = config["parallelism"]
    assert {key: parallelism[key] for key in ("tensor_parallel_degree", "enable_sequence_parallel",
                                              "context_parallel_degree", "data_parallel_replicate_degree",
                                              "data_parallel_shard_degree", "pipeline_parallel_microbatch_size")} == {
        "tensor_parallel_degree": 2, "enable_sequence_parallel": True, "context_parallel_degree": 1,
        "data_parallel_replicate_degree": 2, "data_parallel_shard_degree": 1, "pipeline_parallel_microbatch_size": 2}
    assert "expert_parallel_degree" not in parallelism
    assert config["training"] == {"local_batch_size": 8, "disable_cuda_graphs": True, "seq_len": 128,
                                  "global_batch_size": 16, "mixed_precision_param": "bfloat16"}
    assert "--parallelism.enable_sequence_parallel" in args and "--training.disable_cuda_graphs" in args
    assert args == torchtitan_args(config)
    assert not any(note.startswith("partition.setting") for note in notes)
    with pytest.raises(InputError, match=r"^microbatch_size = 1: the plan's costs are for "
                                         r"partition\.setting\.microbatch_size = 2$"):
        export_document(_document(tmp_path, _model()), "torchtitan", tmp_path / "other", microbatch_size=1)
    assert torchtitan_export(tmp_path, _document(tmp_path, _model()), microbatch_size=2)[0] == config


@pytest.mark.parametrize("setting,replicate,shard,expected", [
    (Setting(seq_len=64, microbatch_size=1, tp=4, dp=2, zero=1), 1, 2,
     "data_parallel_shard_degree = 2 (FSDP): torchtitan has no ZeRO-1 (optimizer states alone sharded); FSDP shards "
     "the weights and gradients too, so each device holds less than the plan's static bytes and gathers weights in F "
     "and B"),
    (Setting(seq_len=64, microbatch_size=1, tp=1, dp=4, ep=4, dtype="fp16"), 1, 4,
     "data_parallel_shard_degree = 4 (FSDP): torchtitan's expert parallelism borrows its ranks from FSDP and TP, and "
     "ep = 4 does not divide tp = 1; FSDP shards the weights and gradients too, so each device holds less than the "
     "plan's static bytes and gathers weights in F and B"),
    (Setting(seq_len=64, microbatch_size=1, tp=4, dp=2, ep=2), 2, 1, None),
    (Setting(seq_len=64, microbatch_size=1, tp=1, dp=4, zero=3), 1, 4, None),
    (Setting(seq_len=64, microbatch_size=1, tp=1, dp=4, ep=4, cp=2, zero=3), 1, 4, None),
    (Setting(seq_len=64, microbatch_size=1, tp=2, dp=2, cp=2), 2, 1,
     "context_parallel_degree = 2: torchtitan applies FSDP over dp_shard x cp whenever cp > 1 "
     "(torchtitan/distributed/parallel_dims.py), so it shards the weights and gradients over the 2 context-parallel "
     "ranks: each device holds less than the plan's static bytes and gathers weights in F and B"),
])
def test_torchtitan_data_parallel_choice(tmp_path: Path, setting: Setting, replicate: int, shard: int,
                                         expected: str | None) -> None:
    config, _, notes = torchtitan_export(tmp_path, _document(tmp_path, _model(setting)))
    parallelism = config["parallelism"]
    assert (parallelism["data_parallel_replicate_degree"], parallelism["data_parallel_shard_degree"]) == \
        (replicate, shard)
    assert parallelism.get("expert_parallel_degree") == setting.ep
    assert parallelism["context_parallel_degree"] == (setting.cp or 1)
    assert [note for note in notes if note.startswith(("data_parallel", "context_parallel"))] == \
        ([] if expected is None else [expected])
    if setting.dtype == "fp16":
        assert "mixed_precision_param" not in config["training"]
        assert "partition.setting.dtype = 'fp16' is not written: torchtitan 0.3.0's training.mixed_precision_param " \
               "is bfloat16 or float32" in notes


@pytest.mark.parametrize("setting,divisor", [
    (Setting(seq_len=66, microbatch_size=1, tp=4, dp=1), 4),
    (Setting(seq_len=68, microbatch_size=1, tp=2, dp=1, cp=2), 8),
])
def test_torchtitan_refuses_a_sequence_it_cannot_split(tmp_path: Path, setting: Setting, divisor: int) -> None:
    doc = _document(tmp_path, _model(setting))
    with pytest.raises(InputError) as refused:
        export_document(doc, "torchtitan", tmp_path / "tt")
    assert str(refused.value) == (f"partition.setting.seq_len = {setting.seq_len}: torchtitan 0.3.0 needs it divisible "
                                  f"by {divisor} (tp with sequence parallelism x 2 cp; torchtitan/trainer.py)")
    assert not (tmp_path / "tt").exists()


def test_torchtitan_notes_a_bare_plan(tmp_path: Path) -> None:
    config, _, notes = torchtitan_export(tmp_path, _document(tmp_path, _model(None)))
    assert config["training"] == {"local_batch_size": 4, "disable_cuda_graphs": True}
    assert "tensor_parallel_degree" not in config["parallelism"]
    assert notes[-1].startswith("partition.setting is missing (the model has no setting): torchtitan.json has no "
                                "tensor_parallel_degree")


@pytest.mark.parametrize("setting", SETTINGS, ids=SETTING_IDS)
def test_torchtitan_takes_every_key(tmp_path: Path, setting: Setting) -> None:
    """torchtitan's ConfigManager parses the arguments file into its Trainer.Config, whose checks pass (pipeline
    parallelism with CUDA graphs disabled, sequence length divisible by tp), holding every key of the JSON; its
    ParallelDims take the degrees on tp x dp x pp ranks; the pipeline runs the plan's microbatches in one gradient
    accumulation step (trainer.py: global // (local x dp) steps, local // microbatch size microbatches)."""
    config, args, _ = torchtitan_export(tmp_path, _document(tmp_path, _model(setting), placement="interleaved"))
    parsed = load_torchtitan_config(args)
    for section in ("parallelism", "training"):
        for key, value in config[section].items():
            assert getattr(getattr(parsed, section), key) == value, (section, key)
    from torchtitan.distributed.parallel_dims import ParallelDims

    p = config["parallelism"]
    ParallelDims(dp_replicate=p["data_parallel_replicate_degree"], dp_shard=p["data_parallel_shard_degree"],
                 cp=p["context_parallel_degree"], tp=p["tensor_parallel_degree"], pp=p["pipeline_parallel_degree"],
                 ep=p.get("expert_parallel_degree", 1), world_size=setting.tp * (setting.cp or 1) * setting.dp * 2)
    training = parsed.training
    assert training.global_batch_size // (training.local_batch_size * setting.dp) == 1
    assert training.local_batch_size // parsed.parallelism.pipeline_parallel_microbatch_size == 4


# -- torchtitan: per-block recomputation through PlannedAC ---------------------------------------------------------

@pytest.mark.parametrize("recompute,whole,selective", [
    ("uniform:1", [1, 1], None),
    ("per-stage:1,2", [1, 2], None),
    ("selective+per-stage:1,0", [1, 0], [2, 3]),
    ("selective", [0, 0], [3, 3]),
])
def test_torchtitan_runs_per_block_recomputation_with_planned_ac(tmp_path: Path, recompute: str, whole: list[int],
                                                                  selective: list[int] | None) -> None:
    doc = _document(tmp_path, _model(selective=True), recompute=recompute, name=recompute.replace(":", "-"))
    folder = tmp_path / "tt"
    written, _ = export_document(doc, "torchtitan", folder)
    assert folder / PLAN_NAME in written and (folder / PLAN_NAME).read_text() == doc.read_text()
    config, args, notes = torchtitan_export(tmp_path, doc)
    assert config["override"] == {"imports": [[OVERRIDE_TARGET, {"plan": PLAN_NAME}]]}
    assert config["activation_checkpoint"] == "full"
    assert args[-3:] == ["--override.imports", f'{OVERRIDE_TARGET}={{"plan": "{PLAN_NAME}"}}',
                         "activation-checkpoint:full"]
    counted = f"stages 0-1 recompute {whole} of their [3, 3] blocks whole" + (
        f" and {selective} selectively" if selective else "")
    assert notes[-1].startswith(f"partition.recompute/selective: {counted}, which no torchtitan policy does: "
                                f"override.imports {OVERRIDE_TARGET} runs zbsolve's PlannedAC")
    tr = pytest.importorskip("zbsolve.execute.torchtitan_recompute")
    assert tr.OVERRIDE == OVERRIDE_TARGET
    plan = read_plan(doc, "torchtitan")
    assert tr.planned_blocks(folder / PLAN_NAME) == tr.planned_blocks(plan)


def test_torchtitan_puts_planned_ac_in_place_from_the_export(tmp_path: Path, monkeypatch) -> None:
    """torchtitan's own parser and override mechanism, started in the export folder, give PlannedAC reading the
    copied document."""
    doc = _document(tmp_path, _model(selective=True), recompute="selective+per-stage:1,0")
    config, args, _ = torchtitan_export(tmp_path, doc)
    parsed = load_torchtitan_config(args)
    from torchtitan.config.override import apply_overrides

    from zbsolve.execute import torchtitan_recompute as tr

    monkeypatch.chdir(tmp_path / "tt")
    apply_overrides(parsed.override, parsed)
    assert isinstance(parsed.activation_checkpoint, tr.PlannedAC.Config)
    assert parsed.activation_checkpoint.plan == PLAN_NAME
    assert tr.planned_blocks(parsed.activation_checkpoint.plan) == tr.planned_blocks(doc)


def test_torchtitan_refuses_selective_expert_blocks(tmp_path: Path) -> None:
    doc = _document(tmp_path, _model(selective=True, experts=True), recompute="selective")
    with pytest.raises(InputError) as refused:
        export_document(doc, "torchtitan", tmp_path / "tt")
    assert str(refused.value) == ("partition.selective: blocks layers.0, layers.1, layers.2, ... have experts: "
                                  "torchtitan 0.3.0 recomputes only dense blocks selectively (runtime table: "
                                  "torchtitan.selective_experts); plan with --target torchtitan")
    assert not (tmp_path / "tt").exists()
    config, _, _ = torchtitan_export(tmp_path, _document(tmp_path, _model(selective=True, experts=True),
                                                   recompute="per-stage:1,2", name="whole"))
    assert config["override"]["imports"][0][0] == OVERRIDE_TARGET
