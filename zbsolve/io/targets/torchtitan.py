"""The torchtitan target: its row of the target table, and its export of a plan as torchtitan's pipeline and activation
checkpointing settings beside the torch CSV (docs/torch.md).

Checked against torchtitan 0.3.0 from PyPI: ``torchtitan/config/configs.py`` (``ParallelismConfig``,
``TrainingConfig``) and ``torchtitan/distributed/pipeline_parallel.py`` (``_get_pp_rank_to_stage_indices_mapping``:
the schedule's name decides which stages a rank builds, "v" for ZBVZeroBubble and DualPipeV, looped otherwise;
``_build_pipeline_schedule``: with a CSV the schedule is torch's ``_PipelineScheduleRuntime`` whatever the name,
with ``training.local_batch_size // pipeline_parallel_microbatch_size`` microbatches; ``pipeline_llm``: every model
part gets the same ``ac_config``). ``torchtitan/distributed/activation_checkpoint.py``
(``ActivationCheckpointingConfig``: the tyro subcommands selective, full, memory-budget and none;
``ActivationCheckpointing.apply``: the policy wraps every child of the part's ``layers``; ``FullAC``: each block
recomputed whole), ``torchtitan/trainer.py`` (``Trainer.Config.activation_checkpoint``, selective by default) and
``torchtitan/models/deepseek_v3/mtp.py`` (``MTPDecoder``: "MTP does not support pipeline parallelism yet"). The
setting's keys: ``ParallelismConfig`` (``tensor_parallel_degree``, ``enable_sequence_parallel``,
``context_parallel_degree``, ``expert_parallel_degree``, ``data_parallel_replicate_degree``,
``data_parallel_shard_degree``) and ``TrainingConfig`` (``seq_len``, ``global_batch_size``,
``mixed_precision_param``, ``disable_cuda_graphs``: ``Trainer.Config._validate_cuda_graphs`` refuses pipeline
parallelism without it), ``torchtitan/distributed/parallel_dims.py`` (expert parallelism borrows its ranks from
dp_shard x cp x tp) and ``torchtitan/config/override.py`` (``OverrideConfig.imports``: a target with its keyword
arguments, ``target={json}`` on the command line), through which ``zbsolve.execute.torchtitan_recompute``'s
``PlannedAC`` recomputes a plan's blocks one by one.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from zbsolve.base.checks import check_count
from zbsolve.base.errors import InputError
from zbsolve.base.files import check_output, write_atomic
from zbsolve.core.placement import Placement
from zbsolve.costmodel.model import OP_POLICY, Setting
from zbsolve.io.targets.export import Export, Request
from zbsolve.io.targets.plan import Plan
from zbsolve.io.targets.target import Target
from zbsolve.io.targets.torchtitan_launch import torchtitan_command
from zbsolve.io.torch_csv import checked_csv

TORCHTITAN_VERSION = "0.3.0"
"""The torchtitan release whose config keys, stage placement and activation checkpointing the torchtitan export
follows."""
TORCHTITAN = Target(
    name="torchtitan", label=f"torchtitan {TORCHTITAN_VERSION}",
    placements={"sequential": (1,), "interleaved": None, "vshape": (2,)}, order="planned",
    own_schedule=None, recompute=("none", "full", "uniform", "per-stage"), selective=True, selective_experts=False,
    auto_recompute=("none", "full", "per-stage", "selective", "selective+per-stage"), pairs=False, mtp=False,
    grouped_microbatches=False, layout_only=False, zero=(3,), modules=(OP_POLICY,),
    source="torchtitan/distributed/pipeline_parallel.py, activation_checkpoint.py, models/deepseek_v3/mtp.py, "
           "config/override.py; torch/distributed/pipelining/schedules.py (_PipelineScheduleRuntime, OVERLAP_F_B); "
           "zbsolve/execute/torchtitan_recompute.py")
"""torchtitan runs the exported CSV (any order) on the stages its schedule's name places (looped, or a V with two
stages per rank) and refuses MTP layers under pipeline parallelism. It overlaps no F&B pair: torch's
``_PipelineScheduleRuntime`` runs an OVERLAP_F_B action's F and B one after the other unless a function is
registered for it, and torchtitan 0.3.0 registers none (it removed DualPipeV's expert-parallel overlap, which did
not compose with selective checkpointing: pytorch/torchtitan #2774), so its plans search no pairs and its DualPipeV
baselines are timed without overlap. Its own policies
recompute every block whole (``FullAC``), none, or every block by its per-op rule (``SelectiveAC``, the choice
``op``: ``costmodel.recompute_modules.op``; it keeps other tensors than zbsolve's selective choice);
zbsolve's ``PlannedAC`` (``zbsolve/execute/torchtitan_recompute.py``, put in place by ``--override.imports``)
recomputes any blocks whole and the others' norms and SwiGLU product, in torchtitan's dense llama3 blocks only.
Its data parallelism is FSDP (ZeRO-3, its default): it has no ZeRO-1, and applies FSDP over the context-parallel
ranks whenever cp > 1 (``torchtitan_notes``)."""
CSV_NAME = "schedule.csv"
"""The torch CSV in a torchtitan export's folder."""
CONFIG_NAME = "torchtitan.json"
"""The config fragment in a torchtitan export's folder: ``{"parallelism": {...}, "training": {...}, "override":
{...} (where PlannedAC recomputes), "activation_checkpoint": "full" | "selective" | "none"}``."""
ARGS_NAME = "torchtitan-args.txt"
"""The same settings as torchtitan command-line overrides (``--parallelism.<key> value``, then
``activation-checkpoint:<policy>``), one shell line: the job's file, as torchtitan 0.3.0 reads no TOML job file (its
``ConfigManager`` takes ``--module``, ``--config`` and these overrides: ``torchtitan_launch``)."""
LAUNCH_NAME = "torchtitan-launch.sh"
"""The ``torchrun ... -m torchtitan.train`` command with those arguments (``torchtitan_launch``), where the document
says what to launch."""
PLAN_NAME = "plan.json"
"""The schedule document in a torchtitan export's folder, which ``PlannedAC`` reads, where the plan's recomputation
is not one policy for every block."""
OVERRIDE_TARGET = "zbsolve.execute.torchtitan_recompute.planned_recompute"
"""The ``override.imports`` target that makes torchtitan recompute with ``PlannedAC``
(``zbsolve.execute.torchtitan_recompute.OVERRIDE``)."""
MIXED_PRECISION = {"bf16": "bfloat16", "fp32": "float32"}
"""``training.mixed_precision_param`` of each ``Setting.dtype`` torchtitan 0.3.0 takes (no fp16)."""
HEAD_RENAME = "output=lm_head"
"""The rename applied by default: zbsolve's models (and torchtitan up to 0.2.2) call the head ``output``,
torchtitan 0.3.0 calls it ``lm_head``."""


def torchtitan_schedule_name(placement: Placement) -> str:
    """The ``parallelism.pipeline_parallel_schedule`` that makes torchtitan build ``placement``'s stages on each
    rank: ``1F1B`` (sequential), ``Interleaved1F1B`` (looped, stage s on rank s mod p) or ``ZBVZeroBubble``
    (V-shape with two stages per rank). With a CSV torchtitan runs the CSV whatever the name; the name only places
    the stages (and picks the rank that logs the loss). A placement ``TORCHTITAN``'s row does not build is an
    ``InputError`` naming it."""
    if placement.num_devices == 1:
        raise InputError("num_devices = 1: torchtitan runs no pipeline with pipeline_parallel_degree 1")
    name, _ = TORCHTITAN.check_placement(placement)
    return {"sequential": "1F1B", "interleaved": "Interleaved1F1B", "vshape": "ZBVZeroBubble"}[name]


TorchtitanConfig = dict[str, dict[str, object] | str]
"""torchtitan settings by ``Trainer.Config`` field: a section's fields and values, or a subcommand's name."""


def torchtitan_checkpointing(plan: Plan) -> str:
    """The ``activation_checkpoint`` policy for ``plan``: "selective" (``SelectiveAC``, torchtitan's per-op
    policy in every block) where the plan recomputes so (``modules`` ("op",): ``--recompute op``); "none" when no
    block recomputes (torchtitan's default is per-op selective checkpointing, so it is said); else "full":
    ``FullAC``, which recomputes every block of every model part whole, or, where ``torchtitan_planned``, the policy
    ``PlannedAC`` replaces. The target table's refusals (``Plan.check``) come first."""
    plan.check(TORCHTITAN)
    if plan.modules == (OP_POLICY,):
        return "selective"
    return "full" if plan.recomputed or plan.selective else "none"


def torchtitan_planned(plan: Plan) -> bool:
    """Whether ``plan``'s recomputation is not one policy for every block (some blocks whole, or selective ones),
    so that torchtitan runs it with ``PlannedAC``."""
    stages = plan.stage_recompute()
    return bool(plan.selective) or (bool(plan.recomputed) and any(chosen != blocks for blocks, chosen in stages))


def torchtitan_config(plan: Plan, csv_path: str | Path, microbatch_size: int | None = None,
                      renames: Sequence[str] = (), plan_path: str | Path = PLAN_NAME) -> TorchtitanConfig:
    """torchtitan's settings for ``plan``: ``{"parallelism": {...}, "training": {...}, "override": {...},
    "activation_checkpoint": ...}``, fields of torchtitan's ``Trainer.Config``. ``local_batch_size`` is the
    schedule's microbatches times ``microbatch_size`` (the setting's, else 1; another than the setting's is an
    ``InputError``), so torchtitan cuts each step into the schedule's microbatches; ``disable_cuda_graphs``, without
    which torchtitan refuses pipeline parallelism; and the setting's keys (``torchtitan_setting``).
    ``module_fqns_per_model_part`` lists each stage's layer names, renamed by ``renames`` (``OLD=NEW``; the default
    ``HEAD_RENAME`` applies unless a rename of the same layer replaces it). ``activation_checkpoint`` is
    ``torchtitan_checkpointing``'s policy; "override" (where ``torchtitan_planned``) imports ``OVERRIDE_TARGET``
    with the schedule document at ``plan_path``."""
    schedule, setting = plan.schedule, plan.model.setting
    name = torchtitan_schedule_name(schedule.placement)
    size = _microbatch_size(setting, microbatch_size)
    fqns = _fqns([layer.name for layer in plan.model.layers], renames)
    policy = torchtitan_checkpointing(plan)
    parallelism, training = torchtitan_setting(setting, schedule.num_microbatches)
    config: TorchtitanConfig = {
        "parallelism": {"pipeline_parallel_degree": schedule.num_devices, "pipeline_parallel_schedule": name,
                        "pipeline_parallel_schedule_csv": str(csv_path), "pipeline_parallel_microbatch_size": size,
                        "module_fqns_per_model_part": [fqns[a:b] for a, b in plan.stages], **parallelism},
        "training": {"local_batch_size": schedule.num_microbatches * size, "disable_cuda_graphs": True, **training}}
    if torchtitan_planned(plan):
        config["override"] = {"imports": [[OVERRIDE_TARGET, {"plan": str(plan_path)}]]}
    config["activation_checkpoint"] = policy
    return config


def torchtitan_setting(setting: Setting | None, num_microbatches: int) -> tuple[dict[str, object], dict[str, object]]:
    """The ``parallelism`` and ``training`` keys of ``setting`` for a step of ``num_microbatches``: the tensor,
    context and, for a model with experts, expert parallel degrees, sequence parallelism where tp > 1 (the cost
    model divides every activation over the tensor-parallel group), the data-parallel degree (``_sharded``),
    ``seq_len``, ``global_batch_size`` (microbatch size x microbatches x dp: one gradient accumulation step) and the
    mixed precision's dtype (``MIXED_PRECISION``); none without a setting. A ``seq_len`` torchtitan cannot split
    over the tensor- and context-parallel ranks (``_seq_len_divisor``) is an ``InputError``."""
    if setting is None:
        return {}, {}
    divisor = _seq_len_divisor(setting)
    if setting.seq_len % divisor:
        raise InputError(f"partition.setting.seq_len = {setting.seq_len}: torchtitan {TORCHTITAN_VERSION} needs it "
                         f"divisible by {divisor} (tp with sequence parallelism x 2 cp; torchtitan/trainer.py)")
    parallelism: dict[str, object] = {"tensor_parallel_degree": setting.tp,
                   **({"enable_sequence_parallel": True} if setting.tp > 1 else {}),
                   "context_parallel_degree": setting.cp or 1,
                   **({} if setting.ep is None else {"expert_parallel_degree": setting.ep}),
                   **dict(zip(("data_parallel_replicate_degree", "data_parallel_shard_degree"),
                              (1, setting.dp) if _sharded(setting) else (setting.dp, 1)))}
    training: dict[str, object] = {"seq_len": setting.seq_len,
                "global_batch_size": setting.global_batch(num_microbatches),
                **({"mixed_precision_param": MIXED_PRECISION[setting.dtype]} if setting.dtype in MIXED_PRECISION
                   else {})}
    return parallelism, training


def _seq_len_divisor(setting: Setting) -> int:
    """What torchtitan's ``Trainer`` needs ``seq_len`` to be divisible by: tp with sequence parallelism (written
    where tp > 1), times 2 cp with context parallelism (each context-parallel rank holds two chunks of a
    sequence)."""
    cp = setting.cp or 1
    return setting.tp * (2 * cp if cp > 1 else 1)


def _sharded(setting: Setting) -> bool:
    """Whether the export puts the data-parallel degree in ``data_parallel_shard_degree`` (FSDP) rather than
    ``data_parallel_replicate_degree`` (every replica holds whole weights, gradients and optimizer states, as the
    costs count them under ZeRO 0): under ZeRO-3 (FSDP over dp x cp, as the costs count it), under ZeRO-1, which
    torchtitan has no closer form of, and where the expert-parallel degree does not divide tp (torchtitan's expert
    parallelism borrows ranks from FSDP and TP)."""
    return setting.zero in (1, 3) or (setting.ep is not None and setting.tp % setting.ep != 0)


def torchtitan_notes(plan: Plan) -> list[str]:
    """Lines for the user on what ``torchtitan_config`` could not write or writes otherwise than the costs say:
    the setting's keys without one, a dtype torchtitan has no mixed precision for, FSDP in place of ZeRO-0 or
    ZeRO-1, an expert-parallel degree torchtitan's ranks cannot hold, and ``PlannedAC``."""
    setting, notes = plan.model.setting, []
    if setting is None:
        notes.append("partition.setting is missing (the model has no setting): torchtitan.json has no "
                     "tensor_parallel_degree, context_parallel_degree, expert_parallel_degree, data_parallel_*_degree, "
                     "seq_len, global_batch_size or mixed_precision_param, and pipeline_parallel_microbatch_size is "
                     "--microbatch-size (default 1); add those of the setting the plan's costs are for")
    else:
        if setting.dtype not in MIXED_PRECISION:
            notes.append(f"partition.setting.dtype = {setting.dtype!r} is not written: torchtitan "
                         f"{TORCHTITAN_VERSION}'s training.mixed_precision_param is bfloat16 or float32")
        cp = setting.cp or 1
        if _sharded(setting) and setting.zero != 3:
            why = ("torchtitan has no ZeRO-1 (optimizer states alone sharded)" if setting.zero == 1 else
                   f"torchtitan's expert parallelism borrows its ranks from FSDP and TP, and ep = {setting.ep} does "
                   f"not divide tp = {setting.tp}")
            notes.append(f"data_parallel_shard_degree = {setting.dp} (FSDP): {why}; FSDP shards the weights and "
                         "gradients too, so each device holds less than the plan's static bytes and gathers weights "
                         "in F and B")
        elif cp > 1 and setting.zero != 3:
            notes.append(f"context_parallel_degree = {cp}: torchtitan applies FSDP over dp_shard x cp whenever cp > 1 "
                         "(torchtitan/distributed/parallel_dims.py), so it shards the weights and gradients over the "
                         f"{cp} context-parallel ranks: each device holds less than the plan's static bytes and "
                         "gathers weights in F and B")
        ranks = setting.tp * cp * (setting.dp if _sharded(setting) else 1)
        if setting.ep is not None and ranks % setting.ep:
            notes.append(f"expert_parallel_degree = {setting.ep} must divide dp_shard x cp x tp = {ranks}: torchtitan "
                         f"{TORCHTITAN_VERSION} builds no mesh for it (torchtitan/distributed/parallel_dims.py)")
    if torchtitan_planned(plan):
        notes.append(f"partition.recompute/selective: {_recomputing(plan)}, which no torchtitan policy does: "
                     f"override.imports {OVERRIDE_TARGET} runs zbsolve's PlannedAC in place of "
                     f"activation_checkpoint (full), reading {PLAN_NAME} (the schedule document, copied into the "
                     "folder) as the CSV is read; zbsolve must be importable on every rank "
                     "(docs/torchtitan-recompute.md)")
    return notes


def _recomputing(plan: Plan) -> str:
    """The blocks each stage recomputes whole and selectively, counted."""
    stages = plan.stage_recompute()
    whole = [len(chosen) for _, chosen in stages]
    selective = [sum(i in plan.selective for i in blocks) for blocks, _ in stages]
    total = [len(blocks) for blocks, _ in stages]
    return (f"stages 0-{len(total) - 1} recompute {whole} of their {total} blocks whole"
            + (f" and {selective} selectively" if plan.selective else ""))


def _microbatch_size(setting: Setting | None, given: int | None) -> int:
    """The sequences per microbatch: ``given``, the setting's, else 1; one other than the setting's is an
    ``InputError``."""
    if given is None:
        return 1 if setting is None else setting.microbatch_size
    check_count("microbatch_size", given)
    if setting is not None and given != setting.microbatch_size:
        raise InputError(f"microbatch_size = {given}: the plan's costs are for partition.setting.microbatch_size = "
                         f"{setting.microbatch_size}")
    return given


def torchtitan_args(config: TorchtitanConfig) -> list[str]:
    """``config`` as torchtitan command-line overrides: ``--<section>.<key> value``; a list of lists as one
    comma-joined argument per inner list (torchtitan's tyro rule for ``list[str]``), an override import as
    ``target={json}`` (its rule for ``override.imports``), a boolean as ``--<section>.<key>`` or
    ``--<section>.no_<key>`` (tyro's flags); then a subcommand as ``<field>:<name>`` (``activation-checkpoint:full``),
    after every flag, where tyro takes it."""
    flags, subcommands = [], []
    for field, values in config.items():
        if isinstance(values, str):
            subcommands.append(f"{field.replace('_', '-')}:{values}")
            continue
        for key, value in values.items():
            if isinstance(value, bool):
                flags.append(f"--{field}.{key}" if value else f"--{field}.no_{key}")
                continue
            flags.append(f"--{field}.{key}")
            flags.extend([_token(item) for item in value] if isinstance(value, list) else [str(value)])
    return flags + subcommands


def _token(item: list) -> str:
    """One command-line argument of a list's ``item``: an override import ``[target, kwargs]`` as
    ``target={json}``, a list of names comma-joined."""
    if len(item) == 2 and isinstance(item[1], dict):
        return f"{item[0]}={json.dumps(item[1])}"
    return ",".join(item)


def torchtitan_launch(plan: Plan, config: TorchtitanConfig | None = None) -> tuple[str, list[str]] | None:
    """The ``torchrun ... -m torchtitan.train`` command of ``plan``'s settings (``config``, default
    ``torchtitan_config``'s from the export folder) where its document says what to launch (``Plan.launch``), with
    its lines for the user (``torchtitan_launch.torchtitan_command``); None otherwise."""
    if plan.launch is None:
        return None
    return torchtitan_command(torchtitan_args(config or torchtitan_config(plan, CSV_NAME)), plan.launch)


def export_torchtitan(plan: Plan, folder: str | Path, microbatch_size: int | None = None,
                      renames: Sequence[str] = (), inputs: Iterable[str | Path] = (),
                      note: Callable[[str], None] | None = None, document: str | None = None) -> dict[Path, str]:
    """Write ``CSV_NAME``, ``CONFIG_NAME`` and ``ARGS_NAME`` into ``folder`` (made if missing, its parent must
    exist), ``PLAN_NAME`` (``document``, the schedule document's text) where ``PlannedAC`` recomputes the plan's
    blocks (``torchtitan_planned``) and ``LAUNCH_NAME`` where the document says what to launch
    (``torchtitan_launch``), and return each path written with its text. The config names the CSV and the
    document by their paths relative to the folder, so the folder can be copied to the cluster as it is. Everything
    is checked before anything is written, none of the files may be one of ``inputs``; each file is replaced whole.
    ``note`` is called with ``_export_notes``'s lines."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise InputError(f"output = {folder} is a file; format 'torchtitan' writes a folder")
    config = torchtitan_config(plan, CSV_NAME, microbatch_size, renames, PLAN_NAME)
    planned = "override" in config
    documents: list[str] = []
    if planned:
        if document is None:
            raise InputError(f"partition.recompute/selective: {_recomputing(plan)}; PlannedAC reads the schedule "
                             f"document, which the export writes as {PLAN_NAME}: export the document, not a Plan")
        documents = [document]
    launch = torchtitan_launch(plan, config)
    paths = [folder / CSV_NAME, folder / CONFIG_NAME, folder / ARGS_NAME, *([folder / PLAN_NAME] if planned else []),
             *([folder / LAUNCH_NAME] if launch else [])]
    for path in paths if folder.exists() else [folder]:
        check_output(path, "output", inputs)
    texts = dict(zip(paths, (checked_csv(plan.schedule), json.dumps(config, indent=1) + "\n",
                             shlex.join(torchtitan_args(config)) + "\n", *documents,
                             *([f"#!/bin/sh\n{launch[0]}\n"] if launch else []))))
    folder.mkdir(exist_ok=True)
    for path, text in texts.items():
        write_atomic(path, text)
    if note is not None:
        for line in _export_notes(plan, folder, renames, launch):
            note(line)
    return texts


def _export_notes(plan: Plan, folder: Path, renames: Sequence[str], launch: tuple[str, list[str]] | None) -> list[str]:
    """The lines for the user of ``export_torchtitan``: the CSV's relative path, the arguments file as the job with
    the launch command (where the document says what to launch), the head's rename, ``torchtitan_notes`` and the
    launch's own lines."""
    notes = [f"pipeline_parallel_schedule_csv = {CSV_NAME} is relative to the export folder {folder}: start "
             "torchtitan in that folder (wherever it is copied), or override it with the CSV's path there",
             f"{ARGS_NAME} is the job: torchtitan {TORCHTITAN_VERSION} reads no TOML job file, its ConfigManager "
             "takes --module, --config and these command-line overrides (torchtitan/config/manager.py)"
             + (f"; {LAUNCH_NAME}: {launch[0]}" if launch else "; the document has no launch section (zbsolve "
                "configure writes one): run torchrun ... -m torchtitan.train --module <model> --config <function> "
                f"with the arguments of {ARGS_NAME}")]
    if _head_rename([layer.name for layer in plan.model.layers], renames):
        old, _, new = HEAD_RENAME.partition("=")
        notes.append(f"module_fqns_per_model_part: layer {old!r} is renamed {new!r}, torchtitan "
                     f"{TORCHTITAN_VERSION}'s name of the head (--rename {old}={old} keeps it)")
    return notes + torchtitan_notes(plan) + (launch[1] if launch else [])


def _fqns(names: list[str], renames: Sequence[str]) -> list[str]:
    """``names`` with ``HEAD_RENAME`` (where the layer exists) and then ``renames`` applied; an ``InputError`` for a
    rename that is not ``OLD=NEW`` of a layer, or that gives two layers one name."""
    mapping: dict[str, str] = {}
    for item in _head_rename(names, renames) + list(renames):
        old, sep, new = item.partition("=")
        if not (sep and old and new):
            raise InputError(f"rename = {item!r} should be OLD=NEW: a layer's name and the module FQN torchtitan "
                             "knows it by")
        if old not in names:
            raise InputError(f"rename = {item!r}: the partition has no layer {old!r}")
        mapping[old] = new
    fqns = [mapping.get(n, n) for n in names]
    twice = sorted({f for f in fqns if fqns.count(f) > 1})
    if twice:
        raise InputError(f"rename = {list(renames)}: module FQN {twice[0]!r} would name two layers")
    return fqns


def _head_rename(names: Sequence[str], renames: Sequence[str]) -> list[str]:
    """``[HEAD_RENAME]`` when ``names`` hold the layer it renames and no item of ``renames`` renames that layer,
    else ``[]``."""
    old = HEAD_RENAME.partition("=")[0]
    return [HEAD_RENAME] if old in names and not any(r.partition("=")[0] == old for r in renames) else []


def write_folder(request: Request) -> tuple[list[Path], str]:
    """The request's plan as ``export_torchtitan``'s folder at its output, with the document as it is (for
    ``PlannedAC`` to read where it recomputes); returns the files written and the CSV."""
    plan = request.plan()
    folder = Path(request.destination())
    files = export_torchtitan(plan, folder, request.microbatch_size, request.renames, request.inputs, request.note,
                              request.text())
    return list(files), files[folder / CSV_NAME]


def takes(plan: Plan) -> object:
    """torchtitan's settings for ``plan`` (``torchtitan_config``), which refuse what torchtitan does not run."""
    return torchtitan_config(plan, CSV_NAME)


EXPORT = Export(target=TORCHTITAN, format="torchtitan", rank=1, write=write_folder, takes=takes, output="folder",
                options=("microbatch_size", "renames"))
"""The torchtitan target in the registry: a folder of the CSV, torchtitan's settings and, where ``PlannedAC``
recomputes, the document."""
