"""Exports of a solved plan for training frameworks (docs/torch.md): torchtitan's pipeline settings beside the
torch CSV, and Megatron's ``--pipeline-model-parallel-layout`` string.

Both need the schedule document's "partition" section (the model's layers and each stage's layer range), which
``zbsolve solve`` writes for a model description. Checked against torchtitan 0.3.0 and megatron-core 0.16.1 from
PyPI, neither of which zbsolve needs:

- torchtitan ``torchtitan/config/configs.py`` (``ParallelismConfig``, ``TrainingConfig``) and
  ``torchtitan/distributed/pipeline_parallel.py`` (``_get_pp_rank_to_stage_indices_mapping``: the schedule's name
  decides which stages a rank builds, "v" for ZBVZeroBubble and DualPipeV, looped otherwise;
  ``_build_pipeline_schedule``: with a CSV the schedule is torch's ``_PipelineScheduleRuntime`` whatever the name,
  with ``training.local_batch_size // pipeline_parallel_microbatch_size`` microbatches).
- megatron-core ``megatron/core/transformer/pipeline_parallel_layer_layout.py`` (``PipelineParallelLayerLayout``:
  stage i on pipeline rank i % pp, looped only).
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
"""The torchtitan release whose config keys and stage placement the torchtitan export follows."""
MEGATRON_CORE_VERSION = "0.16.1"
"""The megatron-core release whose layout parser the Megatron export was checked with."""
CSV_NAME = "schedule.csv"
"""The torch CSV in a torchtitan export's folder."""
CONFIG_NAME = "torchtitan.json"
"""The config fragment in a torchtitan export's folder: ``{"parallelism": {...}, "training": {...}}``."""
ARGS_NAME = "torchtitan-args.txt"
"""The same settings as torchtitan command-line overrides (``--parallelism.<key> value``), one shell line."""
HEAD_RENAME = "output=lm_head"
"""The rename applied by default: zbsolve's models (and torchtitan up to 0.2.2) call the head ``output``,
torchtitan 0.3.0 calls it ``lm_head``."""
INDEXED = re.compile(r".+\.\d+")
"""A module FQN that is an entry of a ModuleList or ModuleDict by index (``layers.3``, ``blocks.0``): the blocks of a
partition whose layers do not say."""


@dataclass(frozen=True)
class Plan:
    """A solved plan: its schedule, and the model partition the schedule's stages stand for."""

    schedule: Schedule
    model: Model
    """The partition's layers; a layer is a block where its record says so, else where its name is ``INDEXED``."""
    stages: tuple[tuple[int, int], ...]
    """Half-open layer ranges per stage, in stage order."""


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
    return Plan(loaded.schedule, Model(name=costs.model.name, layers=layers), costs.ranges)


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


def torchtitan_config(plan: Plan, csv_path: str | Path, microbatch_size: int = 1,
                      renames: Sequence[str] = ()) -> dict[str, dict[str, object]]:
    """torchtitan's settings for ``plan``: ``{"parallelism": {...}, "training": {"local_batch_size": ...}}``, the
    sections and field names of torchtitan's ``Trainer.Config``. ``local_batch_size`` is the schedule's microbatches
    times ``microbatch_size``, so torchtitan cuts each step into the schedule's microbatches.
    ``module_fqns_per_model_part`` lists each stage's layer names, renamed by ``renames`` (``OLD=NEW``; the
    default ``HEAD_RENAME`` applies unless a rename of the same layer replaces it)."""
    schedule = plan.schedule
    name = torchtitan_schedule_name(schedule.placement)
    check_count("microbatch_size", microbatch_size)
    fqns = _fqns([layer.name for layer in plan.model.layers], renames)
    return {"parallelism": {"pipeline_parallel_degree": schedule.num_devices,
                            "pipeline_parallel_schedule": name,
                            "pipeline_parallel_schedule_csv": str(csv_path),
                            "pipeline_parallel_microbatch_size": microbatch_size,
                            "module_fqns_per_model_part": [fqns[a:b] for a, b in plan.stages]},
            "training": {"local_batch_size": schedule.num_microbatches * microbatch_size}}


def torchtitan_args(config: dict[str, dict[str, object]]) -> list[str]:
    """``config`` as torchtitan command-line overrides: ``--<section>.<key> value``, a list of lists as one
    comma-joined argument per inner list (torchtitan's tyro rule for ``list[str]``)."""
    args = []
    for section, values in config.items():
        for key, value in values.items():
            args.append(f"--{section}.{key}")
            args.extend([",".join(part) for part in value] if isinstance(value, list) else [str(value)])
    return args


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


def megatron_export(plan: Plan) -> str:
    """The ``--pipeline-model-parallel-layout`` string of ``plan`` (``zbsolve.problem.splits.megatron_layout``). Megatron
    places stage i on pipeline rank i % pp, so any other placement (a V-shape, DualPipe's two routes) is an
    ``InputError``. The layout gives Megatron the partition and placement; it runs its own schedule on them."""
    placement = plan.schedule.placement
    if not is_looped(placement):
        routes = [list(route) for route in placement.routes]
        p, chunks = placement.num_devices, placement.num_stages // placement.num_devices
        what = "a V-shape" if chunks >= 2 and placement == vshape(p, chunks) else "not looped"
        raise InputError(f"placement routes = {routes} is {what}: Megatron's --pipeline-model-parallel-layout "
                         f"places stage i on pipeline rank i % {p} only (sequential and interleaved placements)")
    return megatron_layout(plan.model, plan.stages, placement.num_devices)


# -- the export command ----------------------------------------------------------------------------------------

def export_document(path: str | Path, fmt: str, output: str | Path | None, *, microbatch_size: int | None = None,
                    renames: Sequence[str] = (), note: Callable[[str], None] | None = None) -> tuple[list[Path], str]:
    """Export the schedule document at ``path`` in format ``fmt`` (one of ``FORMATS``) to ``output``: a file for
    torch-csv and megatron, a folder for torchtitan; megatron alone may go without (nothing is written). Returns the
    files written and the main text: the CSV (torch-csv, torchtitan) or Megatron's layout string. No file written
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
