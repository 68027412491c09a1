"""Exports of a solved plan for the runtimes that run it (docs/torch.md), and the runtime table they read: one
exporter a format, each runtime's row declared beside its exporter (``runtime.Runtime``). ``plan --target``, the
baselines and the exports all read ``RUNTIMES``, so no plan for a target is refused by that target's export."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

from zbsolve.base.errors import InputError
from zbsolve.base.files import check_output, write_atomic
from zbsolve.io.document import document_of, from_document, load_document, read_document
from zbsolve.io.exports.megatron import MEGATRON, MEGATRON_CORE_VERSION, megatron_args, megatron_export, \
    megatron_notes, megatron_recompute, megatron_schedule, megatron_setting
from zbsolve.io.exports.plan import Plan, read_plan
from zbsolve.io.exports.runtime import ZBSOLVE, Runtime
from zbsolve.io.exports.torchtitan import ARGS_NAME, CONFIG_NAME, CSV_NAME, HEAD_RENAME, OVERRIDE_TARGET, PLAN_NAME, \
    TORCHTITAN, TORCHTITAN_VERSION, export_torchtitan, torchtitan_args, torchtitan_checkpointing, torchtitan_config, \
    torchtitan_notes, torchtitan_planned, torchtitan_schedule_name, torchtitan_setting
from zbsolve.io.torch_csv import export_schedule

RUNTIMES: dict[str, Runtime] = {row.name: row for row in (ZBSOLVE, TORCHTITAN, MEGATRON)}
"""The runtime table: what each target of ``plan --target`` runs."""
FORMATS = ("torch-csv", "torchtitan", "megatron")
"""Formats ``export_document`` writes: torch's CSV for any torch runtime, and one per runtime of the table."""

__all__ = ["ARGS_NAME", "CONFIG_NAME", "CSV_NAME", "FORMATS", "HEAD_RENAME", "MEGATRON", "MEGATRON_CORE_VERSION",
           "Exportable", "OVERRIDE_TARGET", "PLAN_NAME", "RUNTIMES", "TORCHTITAN", "TORCHTITAN_VERSION", "ZBSOLVE",
           "Plan", "Runtime", "check_target", "export_document", "export_torchtitan", "megatron_args",
           "megatron_export", "megatron_notes", "megatron_recompute", "megatron_schedule", "megatron_setting",
           "read_plan", "runs_as_planned", "torchtitan_args", "torchtitan_checkpointing", "torchtitan_config",
           "torchtitan_notes", "torchtitan_planned", "torchtitan_schedule_name", "torchtitan_setting"]


class Exportable:
    """A result that exports the schedule document its ``to_json()`` gives, from memory."""

    def export(self, format: str, path: str | Path | None = None, *, microbatch_size: int | None = None,
               renames: Sequence[str] = ()) -> str:
        """Export the schedule in ``format`` (one of ``FORMATS``: torch-csv, torchtitan, megatron) to ``path`` (a
        file; a folder for torchtitan; megatron prints without one), byte for byte as ``zbsolve export`` exports the
        document ``to_json(path)`` writes (no document is written). Returns the main text: the CSV, or Megatron's
        arguments. ``microbatch_size`` and ``renames`` are torchtitan's."""
        document = self.to_json()  # type: ignore[attr-defined]
        return export_document(document, format, path, microbatch_size=microbatch_size, renames=renames,
                               taker=f"{type(self).__name__}.export")[1]


_TAKES: dict[str, Callable[[Plan], object]] = {"zbsolve": lambda plan: plan.check(ZBSOLVE),
                                               "torchtitan": lambda plan: torchtitan_config(plan, CSV_NAME),
                                               "megatron": megatron_args}
"""Per runtime of ``RUNTIMES``, what its export makes of a plan (an ``InputError`` where it refuses it)."""


def runs_as_planned(plan: Plan) -> tuple[str, ...]:
    """The runtimes of ``RUNTIMES`` whose export takes ``plan`` as it is; the others refuse it."""
    taken = []
    for name, take in _TAKES.items():
        try:
            take(plan)
        except InputError:
            continue
        taken.append(name)
    return tuple(taken)


def check_target(target: str) -> Runtime:
    """The row of ``target`` in ``RUNTIMES``; an ``InputError`` naming it otherwise."""
    if target not in RUNTIMES:
        raise InputError(f"target = {target!r} is unknown; choose one of {', '.join(RUNTIMES)}")
    return RUNTIMES[target]


def export_document(document: str | Path | dict, fmt: str, output: str | Path | None, *,
                    microbatch_size: int | None = None, renames: Sequence[str] = (),
                    note: Callable[[str], None] | None = None,
                    taker: str = "export_document") -> tuple[list[Path], str]:
    """Export a schedule document in format ``fmt`` (one of ``FORMATS``) to ``output``: a file for torch-csv and
    megatron, a folder for torchtitan; megatron alone may go without (nothing is written). The document is the file
    at ``document``, or ``document`` itself (a result's ``to_json()``), exported as its file would be. Returns the
    files written and the main text: the CSV (torch-csv, torchtitan) or Megatron's arguments. No file written may be
    the document. ``microbatch_size`` (default: the setting's, else 1) and ``renames`` apply to torchtitan only;
    ``note`` hears the lines for the user of torchtitan's export (``export_torchtitan``) and Megatron's
    (``megatron_notes``); a file of another kind than a schedule document is an ``InputError`` saying what
    ``taker`` takes."""
    if fmt not in FORMATS:
        raise InputError(f"format = {fmt!r} is unknown; choose one of {', '.join(FORMATS)}")
    if fmt != "torchtitan" and (microbatch_size is not None or renames):
        given = f"microbatch_size = {microbatch_size}" if microbatch_size is not None else f"rename = {renames[0]!r}"
        raise InputError(f"{given} applies to format 'torchtitan' only, not {fmt!r}")
    if output is None and fmt != "megatron":
        raise InputError(f"output is missing: format {fmt!r} writes files")
    inputs = [] if isinstance(document, dict) else [document]
    if output is not None and fmt != "torchtitan":  # a file; torchtitan's folder is checked by its export
        check_output(output, "output", inputs)
    if isinstance(document, dict):  # read as its file would be: lists for tuples, JSON's numbers
        document = json.loads(json.dumps(document))
    if fmt == "torch-csv":  # the schedule alone: its costs, if any, are not read
        schedule = (from_document(document, taker=taker) if isinstance(document, dict)
                    else read_document(document, taker))[0]
        return [Path(output)], export_schedule(schedule, output)  # type: ignore[arg-type]
    loaded = document_of(document, taker=taker) if isinstance(document, dict) else load_document(document, taker)
    plan = read_plan(loaded, fmt)
    if fmt == "torchtitan":  # the document as it is, for PlannedAC to read where it recomputes
        text = json.dumps(document, indent=1) + "\n" if isinstance(document, dict) else Path(document).read_text()
        files = export_torchtitan(plan, output, microbatch_size, renames, inputs, note, text)  # type: ignore[arg-type]
        return list(files), files[Path(output) / CSV_NAME]  # type: ignore[arg-type]
    text = megatron_export(plan)
    if output is not None:
        write_atomic(output, text + "\n")
    for line in megatron_notes(plan) if note is not None else ():
        note(line)
    return ([] if output is None else [Path(output)]), text
