"""The torchtitan export: its row of the runtime table, and a plan as torchtitan's pipeline and activation
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
``torchtitan/models/deepseek_v3/mtp.py`` (``MTPDecoder``: "MTP does not support pipeline parallelism yet").
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
from zbsolve.io.exports.plan import Plan, counted
from zbsolve.io.exports.runtime import Runtime
from zbsolve.io.torch_csv import checked_csv

TORCHTITAN_VERSION = "0.3.0"
"""The torchtitan release whose config keys, stage placement and activation checkpointing the torchtitan export
follows."""
TORCHTITAN = Runtime(
    name="torchtitan", label=f"torchtitan {TORCHTITAN_VERSION}",
    placements={"sequential": (1,), "interleaved": None, "vshape": (2,)}, order="planned",
    recompute=("none", "full"), selective=False, auto_recompute=("none", "full"), pairs=True, mtp=False,
    grouped_microbatches=False, layout_only=False,
    source="torchtitan/distributed/pipeline_parallel.py, activation_checkpoint.py, models/deepseek_v3/mtp.py")
"""torchtitan runs the exported CSV (any order, F&B pairs as OVERLAP_F_B) on the stages its schedule's name places
(looped, or a V with two stages per rank), applies one activation-checkpointing policy to every block of every model
part (none or full; its op-level selective policy keeps other tensors than zbsolve's selective choice), and refuses
MTP layers under pipeline parallelism."""
CSV_NAME = "schedule.csv"
"""The torch CSV in a torchtitan export's folder."""
CONFIG_NAME = "torchtitan.json"
"""The config fragment in a torchtitan export's folder: ``{"parallelism": {...}, "training": {...},
"activation_checkpoint": "full" | "none"}``."""
ARGS_NAME = "torchtitan-args.txt"
"""The same settings as torchtitan command-line overrides (``--parallelism.<key> value``, then
``activation-checkpoint:<policy>``), one shell line."""
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
    """The ``activation_checkpoint`` policy that recomputes ``plan``'s blocks in torchtitan: "full" when every block
    recomputes (``FullAC``: each block of every model part recomputed whole), "none" when none does (torchtitan's
    default is per-op selective checkpointing, which zbsolve's cost model does not describe). torchtitan applies
    one policy to every block of every model part, so any other choice is an ``InputError`` naming the stages'
    counts. The runtime table's refusals (``Plan.check``) come first."""
    plan.check(TORCHTITAN)
    if not plan.recomputed:
        return "none"
    stages = plan.stage_recompute()
    if all(chosen == blocks for blocks, chosen in stages):
        return "full"
    raise InputError(f"partition.recompute: {counted(stages)}; torchtitan {TORCHTITAN_VERSION} applies one "
                     "activation_checkpoint policy to every block of every model part (full: all of them, none: "
                     "none)")


def torchtitan_config(plan: Plan, csv_path: str | Path, microbatch_size: int = 1,
                      renames: Sequence[str] = ()) -> TorchtitanConfig:
    """torchtitan's settings for ``plan``: ``{"parallelism": {...}, "training": {"local_batch_size": ...},
    "activation_checkpoint": ...}``, fields of torchtitan's ``Trainer.Config``. ``local_batch_size`` is the
    schedule's microbatches times ``microbatch_size``, so torchtitan cuts each step into the schedule's
    microbatches. ``module_fqns_per_model_part`` lists each stage's layer names, renamed by ``renames``
    (``OLD=NEW``; the default ``HEAD_RENAME`` applies unless a rename of the same layer replaces it).
    ``activation_checkpoint`` is ``torchtitan_checkpointing``'s policy."""
    schedule = plan.schedule
    name = torchtitan_schedule_name(schedule.placement)
    check_count("microbatch_size", microbatch_size)
    fqns = _fqns([layer.name for layer in plan.model.layers], renames)
    return {"parallelism": {"pipeline_parallel_degree": schedule.num_devices,
                            "pipeline_parallel_schedule": name,
                            "pipeline_parallel_schedule_csv": str(csv_path),
                            "pipeline_parallel_microbatch_size": microbatch_size,
                            "module_fqns_per_model_part": [fqns[a:b] for a, b in plan.stages]},
            "training": {"local_batch_size": schedule.num_microbatches * microbatch_size},
            "activation_checkpoint": torchtitan_checkpointing(plan)}


def torchtitan_args(config: TorchtitanConfig) -> list[str]:
    """``config`` as torchtitan command-line overrides: ``--<section>.<key> value``, a list of lists as one
    comma-joined argument per inner list (torchtitan's tyro rule for ``list[str]``); then a subcommand as
    ``<field>:<name>`` (``activation-checkpoint:full``), after every flag, where tyro takes it."""
    flags, subcommands = [], []
    for field, values in config.items():
        if isinstance(values, str):
            subcommands.append(f"{field.replace('_', '-')}:{values}")
            continue
        for key, value in values.items():
            flags.append(f"--{field}.{key}")
            flags.extend([",".join(part) for part in value] if isinstance(value, list) else [str(value)])
    return flags + subcommands


def export_torchtitan(plan: Plan, folder: str | Path, microbatch_size: int = 1, renames: Sequence[str] = (),
                      inputs: Iterable[str | Path] = (), note: Callable[[str], None] | None = None) -> dict[Path, str]:
    """Write ``CSV_NAME``, ``CONFIG_NAME`` and ``ARGS_NAME`` into ``folder`` (made if missing, its parent must
    exist) and return each path written with its text. The config names the CSV by its path relative to the folder
    (``CSV_NAME``), so the folder can be copied to the cluster as it is. Everything is checked before anything is
    written, none of the files may be one of ``inputs``; each file is replaced whole. ``note`` is called with one
    line on the CSV's relative path and, when the export renames the head (``HEAD_RENAME``), one naming the
    rename."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise InputError(f"output = {folder} is a file; format 'torchtitan' writes a folder")
    paths = [folder / CSV_NAME, folder / CONFIG_NAME, folder / ARGS_NAME]
    for path in paths if folder.exists() else [folder]:
        check_output(path, "output", inputs)
    config = torchtitan_config(plan, CSV_NAME, microbatch_size, renames)
    texts = dict(zip(paths, (checked_csv(plan.schedule), json.dumps(config, indent=1) + "\n",
                             shlex.join(torchtitan_args(config)) + "\n")))
    folder.mkdir(exist_ok=True)
    for path, text in texts.items():
        write_atomic(path, text)
    if note is not None:
        note(f"pipeline_parallel_schedule_csv = {CSV_NAME} is relative to the export folder {folder}: start "
             "torchtitan in that folder (wherever it is copied), or override it with the CSV's path there")
        if _head_rename([layer.name for layer in plan.model.layers], renames):
            old, _, new = HEAD_RENAME.partition("=")
            note(f"module_fqns_per_model_part: layer {old!r} is renamed {new!r}, torchtitan {TORCHTITAN_VERSION}'s "
                 f"name of the head (--rename {old}={old} keeps it)")
    return texts


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
