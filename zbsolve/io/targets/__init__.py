"""The targets a plan is for (``plan --target``) and their exports (``zbsolve export --format``, docs/torch.md):
one module a target (``zbsolve``: torch's CSV, which zbsolve's own executor runs; ``torchtitan``; ``megatron``),
each declaring its ``EXPORT`` (``export.Export``: its row of the target table, ``target.Target``, and its
exporter). The registry finds them by walking this package, so a new target is one new module. ``plan --target``,
the baselines and the exports all read ``TARGETS``, so no plan for a target is refused by that target's export."""

from __future__ import annotations

import importlib
import json
import pkgutil
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Protocol

from zbsolve.base.errors import InputError
from zbsolve.base.files import check_output
from zbsolve.io.targets.export import OPTIONS, Export, Request
from zbsolve.io.targets.plan import Plan
from zbsolve.io.targets.target import Target

__all__ = ["EXPORTS", "FORMATS", "TARGETS", "Exportable", "check_target", "discover", "export_document",
           "runs_as_planned"]


def discover(paths: Iterable[str] | None = None) -> dict[str, Export]:
    """The ``EXPORT`` of every module of this package (of ``paths``, its folders, where given) that declares one,
    by format, in rank order."""
    found = []
    for module in pkgutil.iter_modules(list(__path__ if paths is None else paths)):
        export = getattr(importlib.import_module(f"{__name__}.{module.name}"), "EXPORT", None)
        if isinstance(export, Export):
            found.append(export)
    return {export.format: export for export in sorted(found, key=lambda export: export.rank)}


EXPORTS: dict[str, Export] = discover()
"""Each target's export, by format (``discover``)."""
TARGETS: dict[str, Target] = {export.target.name: export.target for export in EXPORTS.values()}
"""The target table: what each target of ``plan --target`` runs, by name."""
FORMATS = tuple(EXPORTS)
"""Formats ``export_document`` writes: torch's CSV for any torch runtime, and one per other target of the table."""


class _Documented(Protocol):
    """A result that gives its schedule document."""

    def to_json(self) -> dict:
        """The schedule document, as its file would hold it."""


class Exportable:
    """A result that exports the schedule document its ``to_json()`` gives, from memory."""

    def export(self: _Documented, format: str, path: str | Path | None = None, *, microbatch_size: int | None = None,
               renames: Sequence[str] = ()) -> str:
        """Export the schedule in ``format`` (one of ``FORMATS``: torch-csv, torchtitan, megatron) to ``path`` (a
        file; a folder for torchtitan; megatron prints without one), byte for byte as ``zbsolve export`` exports the
        document ``to_json(path)`` writes (no document is written). Returns the main text: the CSV, or Megatron's
        arguments. ``microbatch_size`` and ``renames`` are torchtitan's."""
        document = self.to_json()
        return export_document(document, format, path, microbatch_size=microbatch_size, renames=renames,
                               taker=f"{type(self).__name__}.export")[1]


def runs_as_planned(plan: Plan) -> tuple[str, ...]:
    """The targets of ``TARGETS`` whose export takes ``plan`` as it is; the others refuse it."""
    taken = []
    for export in EXPORTS.values():
        try:
            export.takes(plan)
        except InputError:
            continue
        taken.append(export.target.name)
    return tuple(taken)


def check_target(target: str) -> Target:
    """The row of ``target`` in ``TARGETS``; an ``InputError`` naming it otherwise."""
    if target not in TARGETS:
        raise InputError(f"target = {target!r} is unknown; choose one of {', '.join(TARGETS)}")
    return TARGETS[target]


def _check_options(export: Export, given: dict[str, str | None]) -> None:
    """An ``InputError`` for the first of ``given`` (each option's value as a refusal names it, None where not
    given) that ``export``'s format does not take, naming the formats that do."""
    for option in OPTIONS:
        if given[option] is not None and option not in export.options:
            takers = [repr(e.format) for e in EXPORTS.values() if option in e.options]
            raise InputError(f"{given[option]} applies to format{'s' * (len(takers) > 1)} {', '.join(takers)} only, "
                             f"not {export.format!r}")


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
    if fmt not in EXPORTS:
        raise InputError(f"format = {fmt!r} is unknown; choose one of {', '.join(EXPORTS)}")
    export = EXPORTS[fmt]
    _check_options(export, {"microbatch_size": None if microbatch_size is None else f"microbatch_size = "
                            f"{microbatch_size}", "renames": f"rename = {renames[0]!r}" if renames else None})
    if output is None and export.output != "optional":
        raise InputError(f"output is missing: format {fmt!r} writes files")
    request = Request(json.loads(json.dumps(document)) if isinstance(document, dict) else document, fmt, output,
                      microbatch_size, renames, note, taker)
    if output is not None and export.output != "folder":  # a folder is checked by its exporter
        check_output(output, "output", request.inputs)
    return export.write(request)
