"""Exports of a solved plan for training frameworks (docs/torch.md): torchtitan's pipeline and activation
checkpointing settings beside the torch CSV, and Megatron's pipeline and recomputation arguments.

Both need the schedule document's "partition" section (the model's layers, each stage's layer range and the
recomputed blocks), which ``zbsolve solve`` writes for a model description. Checked against torchtitan 0.3.0 and
megatron-core 0.16.1 from PyPI, neither of which zbsolve needs:

- torchtitan ``torchtitan/config/configs.py`` (``ParallelismConfig``, ``TrainingConfig``) and
  ``torchtitan/distributed/pipeline_parallel.py`` (``_get_pp_rank_to_stage_indices_mapping``: the schedule's name
  decides which stages a rank builds, "v" for ZBVZeroBubble and DualPipeV, looped otherwise;
  ``_build_pipeline_schedule``: with a CSV the schedule is torch's ``_PipelineScheduleRuntime`` whatever the name,
  with ``training.local_batch_size // pipeline_parallel_microbatch_size`` microbatches; ``pipeline_llm``: every
  model part gets the same ``ac_config``). ``torchtitan/distributed/activation_checkpoint.py``
  (``ActivationCheckpointingConfig``: the tyro subcommands selective, full, memory-budget and none;
  ``ActivationCheckpointing.apply``: the policy wraps every child of the part's ``layers``; ``FullAC``: each block
  recomputed whole) and ``torchtitan/trainer.py`` (``Trainer.Config.activation_checkpoint``, selective by default).
  That file is the same on torchtitan main at b5bcd76 (2026-08-21).
- megatron-core ``megatron/core/transformer/pipeline_parallel_layer_layout.py`` (``PipelineParallelLayerLayout``:
  stage i on pipeline rank i % pp, looped only), ``megatron/core/transformer/transformer_block.py``
  (``TransformerBlock._checkpointed_forward``: the recompute methods, per block of one virtual stage) and
  ``megatron/core/transformer/transformer_config.py`` (``recompute_granularity``, ``recompute_method``,
  ``recompute_num_layers``, which Megatron-LM's ``megatron/training/arguments.py`` makes its ``--recompute-*``
  arguments; tag core_v0.16.1, 55ac708).
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from zbsolve.base.checks import check_count
from zbsolve.io.document import load_document, read_document
from zbsolve.base.errors import InputError
from zbsolve.io.torch_csv import checked_csv, export_schedule
from zbsolve.base.files import check_output, write_atomic
from zbsolve.problem.model import Model
from zbsolve.core.placement import Placement, vshape
from zbsolve.core.schedule import Schedule
from zbsolve.problem.splits import megatron_layout

FORMATS = ("torch-csv", "torchtitan", "megatron")
"""Formats ``export_document`` writes."""
TORCHTITAN_VERSION = "0.3.0"
"""The torchtitan release whose config keys, stage placement and activation checkpointing the torchtitan export
follows."""
MEGATRON_CORE_VERSION = "0.16.1"
"""The megatron-core release whose layout parser and recompute methods the Megatron export was checked with."""
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
INDEXED = re.compile(r".+\.\d+")
"""A module FQN that is an entry of a ModuleList or ModuleDict by index (``layers.3``, ``blocks.0``): the blocks of a
partition whose layers do not say."""


@dataclass(frozen=True)
class Plan:
    """A solved plan: its schedule, the model partition the schedule's stages stand for, and the layers that
    recompute."""

    schedule: Schedule
    model: Model
    """The partition's layers; a layer is a block where its record says so, else where its name is ``INDEXED``."""
    stages: tuple[tuple[int, int], ...]
    """Half-open layer ranges per stage, in stage order."""
    recomputed: frozenset[int] = frozenset()
    """The layers that run their forward again inside their B (the document's "partition.recompute")."""
    selective: frozenset[int] = frozenset()
    """The blocks whose norms and MLP activation function run again inside their B ("partition.selective")."""

    def refuse_selective(self, target: str, runtime: str, why: str) -> None:
        """An ``InputError`` naming the selectively recomputed blocks, which ``runtime`` (``plan --target
        target``) cannot run (``why``)."""
        if self.selective:
            names = [self.model.layers[i].name for i in sorted(self.selective)]
            raise InputError(f"partition.selective = {', '.join(names[:3])}{', ...' if len(names) > 3 else ''}: "
                             f"{runtime} cannot recompute just a block's norms and MLP activation function ({why}); "
                             f"plan with --target {target}")

    def stage_recompute(self) -> list[tuple[list[int], list[int]]]:
        """Per stage, its blocks and its recomputed layers (layer indices, in order)."""
        layers = self.model.layers
        return [([i for i in range(a, b) if layers[i].block], [i for i in range(a, b) if i in self.recomputed])
                for a, b in self.stages]


def _counts(stages: Sequence[tuple[list[int], list[int]]]) -> str:
    """The recomputed blocks of every stage, counted: ``stages 0-3 recompute [1, 2, 2, 2] of their [2, 2, 2, 2]
    blocks``."""
    return (f"stages 0-{len(stages) - 1} recompute {[len(chosen) for _, chosen in stages]} of their "
            f"{[len(blocks) for blocks, _ in stages]} blocks")


def read_plan(path: str | Path, fmt: str) -> Plan:
    """The plan in the schedule document at ``path``; a document without a "partition" section is an
    ``InputError`` naming it and the format ``fmt`` that needs it."""
    loaded = load_document(path)
    section, costs = loaded.data.get("partition"), loaded.costs
    if section is None:
        raise InputError(f"{path}: partition is missing; format {fmt!r} needs the model's layers and stages (solve "
                         "a model description, e.g. problems/models/llama3-8b.yaml)")
    assert costs is not None and costs.model is not None  # the partition section is there
    records = section["layers"]
    layers = [layer if "block" in record else layer.model_copy(update={"block": bool(INDEXED.fullmatch(layer.name))})
              for layer, record in zip(costs.model.layers, records)]
    return Plan(loaded.schedule, Model(name=costs.model.name, layers=layers), costs.ranges,
                frozenset(costs.recomputed), frozenset(costs.selective))


# -- torchtitan ------------------------------------------------------------------------------------------------

def torchtitan_schedule_name(placement: Placement) -> str:
    """The ``parallelism.pipeline_parallel_schedule`` that makes torchtitan build ``placement``'s stages on each
    rank: ``1F1B`` (sequential), ``Interleaved1F1B`` (looped, stage s on rank s mod p) or ``ZBVZeroBubble``
    (V-shape with two stages per rank). With a CSV torchtitan runs the CSV whatever the name; the name only places
    the stages (and picks the rank that logs the loss). Any other placement is an ``InputError``."""
    p, num_stages = placement.num_devices, placement.num_stages
    if p == 1:
        raise InputError("num_devices = 1: torchtitan runs no pipeline with pipeline_parallel_degree 1")
    if is_looped(placement):
        return "1F1B" if num_stages == p else "Interleaved1F1B"
    if placement == vshape(p, 2):
        return "ZBVZeroBubble"
    routes = [list(route) for route in placement.routes]
    raise InputError(f"placement routes = {routes} is neither looped (stage s on device s mod {p}) nor a V-shape "
                     "with two stages per device: torchtitan places stages only these ways")


TorchtitanConfig = dict[str, dict[str, object] | str]
"""torchtitan settings by ``Trainer.Config`` field: a section's fields and values, or a subcommand's name."""


def torchtitan_checkpointing(plan: Plan) -> str:
    """The ``activation_checkpoint`` policy that recomputes ``plan``'s blocks in torchtitan: "full" when every block
    recomputes (``FullAC``: each block of every model part recomputed whole), "none" when none does (torchtitan's
    default is per-op selective checkpointing, which zbsolve's cost model does not describe). torchtitan applies
    one policy to every block of every model part, so any other choice is an ``InputError`` naming the stages'
    counts, and so are selectively recomputed blocks (its op-level policy keeps other tensors)."""
    plan.refuse_selective("torchtitan", f"torchtitan {TORCHTITAN_VERSION}", "its op-level selective policy saves "
                          "matmul outputs and recomputes others, a different choice")
    if not plan.recomputed:
        return "none"
    stages = plan.stage_recompute()
    if all(chosen == blocks for blocks, chosen in stages):
        return "full"
    raise InputError(f"partition.recompute: {_counts(stages)}; torchtitan {TORCHTITAN_VERSION} applies one "
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


# -- Megatron --------------------------------------------------------------------------------------------------

def is_looped(placement: Placement) -> bool:
    """Whether ``placement`` is one route with stage s on device s mod p (sequential or interleaved)."""
    p = placement.num_devices
    return len(placement.routes) == 1 and all(d == s % p for s, d in enumerate(placement.routes[0]))


def megatron_recompute(plan: Plan) -> list[str]:
    """Megatron's recomputation arguments for ``plan``'s recomputed blocks: none when no block recomputes;
    ``--recompute-granularity full --recompute-method uniform --recompute-num-layers 1`` when every block does;
    ``... --recompute-method block --recompute-num-layers N`` when every stage recomputes its first N blocks (all
    of them where it has N or fewer).

    In megatron-core's ``TransformerBlock._checkpointed_forward`` (one block per virtual stage), ``block``
    checkpoints each of the stage's first N layers alone and ``uniform`` checkpoints groups of N layers; with N = 1
    both keep each layer's input and recompute one layer's forward inside its backward, zbsolve's per-block cost
    model. ``uniform`` with N > 1 keeps only each group's input and holds the whole group's recomputed activations
    at once, which the cost model does not describe, so it is never written. Megatron takes one N for every stage:
    recomputed blocks that are not the first of their stage, or a different N per stage, are an ``InputError``
    naming the stages' counts, and so are selectively recomputed blocks."""
    plan.refuse_selective("megatron", f"Megatron (megatron-core {MEGATRON_CORE_VERSION})", "--recompute-modules has "
                          "layernorm and the whole dense mlp, no MLP activation function alone")
    if not plan.recomputed:
        return []
    stages = plan.stage_recompute()
    names = [layer.name for layer in plan.model.layers]
    for s, (blocks, chosen) in enumerate(stages):
        if chosen != blocks[:len(chosen)]:
            shown = [", ".join(names[i] for i in indices) for indices in (chosen, blocks)]
            raise InputError(f"partition.recompute: stage {s} recomputes [{shown[0]}] of its blocks [{shown[1]}], not "
                             "the first ones; Megatron's --recompute-method block recomputes the first N blocks of "
                             "every stage")
    counts = [(len(chosen), len(blocks)) for blocks, chosen in stages]
    partial = {n for n, total in counts if n < total}
    if not partial:
        return ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    n = max(partial)
    if len(partial) > 1 or any(total > n for m, total in counts if m == total):
        raise InputError(f"partition.recompute: {_counts(stages)}; Megatron's --recompute-num-layers N recomputes the "
                         "first N blocks of every stage, one N for all")
    return ["--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", str(n)]


def megatron_args(plan: Plan) -> list[str]:
    """Megatron's arguments for ``plan``: ``--pipeline-model-parallel-size`` p, ``--pipeline-model-parallel-layout``
    (``zbsolve.problem.splits.megatron_layout``) and ``megatron_recompute``'s. Megatron places stage i on pipeline
    rank i % p, so any other placement (a V-shape, DualPipe's two routes) is an ``InputError``. The arguments give
    Megatron the partition, placement and recomputation; it runs its own schedule on them."""
    placement = plan.schedule.placement
    if not is_looped(placement):
        routes = [list(route) for route in placement.routes]
        p, chunks = placement.num_devices, placement.num_stages // placement.num_devices
        what = "a V-shape" if chunks >= 2 and placement == vshape(p, chunks) else "not looped"
        raise InputError(f"placement routes = {routes} is {what}: Megatron's --pipeline-model-parallel-layout "
                         f"places stage i on pipeline rank i % {p} only (sequential and interleaved placements)")
    layout = megatron_layout(plan.model, plan.stages, placement.num_devices)
    return ["--pipeline-model-parallel-size", str(placement.num_devices), "--pipeline-model-parallel-layout", layout,
            *megatron_recompute(plan)]


def megatron_export(plan: Plan) -> str:
    """``megatron_args`` as one shell line (the layout quoted)."""
    return shlex.join(megatron_args(plan))


# -- the export command ----------------------------------------------------------------------------------------

def export_document(path: str | Path, fmt: str, output: str | Path | None, *, microbatch_size: int | None = None,
                    renames: Sequence[str] = (), note: Callable[[str], None] | None = None) -> tuple[list[Path], str]:
    """Export the schedule document at ``path`` in format ``fmt`` (one of ``FORMATS``) to ``output``: a file for
    torch-csv and megatron, a folder for torchtitan; megatron alone may go without (nothing is written). Returns the
    files written and the main text: the CSV (torch-csv, torchtitan) or Megatron's arguments. No file written
    may be the document. ``microbatch_size`` (default 1), ``renames`` and ``note`` (``export_torchtitan``'s lines
    for the user) apply to torchtitan only."""
    if fmt not in FORMATS:
        raise InputError(f"format = {fmt!r} is unknown; choose one of {', '.join(FORMATS)}")
    if fmt != "torchtitan" and (microbatch_size is not None or renames):
        given = f"microbatch_size = {microbatch_size}" if microbatch_size is not None else f"rename = {renames[0]!r}"
        raise InputError(f"{given} applies to format 'torchtitan' only, not {fmt!r}")
    if output is None:
        if fmt != "megatron":
            raise InputError(f"output is missing: format {fmt!r} writes files")
        return [], megatron_export(read_plan(path, fmt))
    if fmt == "torchtitan":
        files = export_torchtitan(read_plan(path, fmt), output, 1 if microbatch_size is None else microbatch_size,
                                  renames, [path], note)
        return list(files), files[Path(output) / CSV_NAME]
    check_output(output, "output", [path])
    if fmt == "torch-csv":
        return [Path(output)], export_schedule(read_document(path)[0], output)
    text = megatron_export(read_plan(path, fmt))
    write_atomic(output, text + "\n")
    return [Path(output)], text
