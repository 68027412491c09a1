"""What a target module declares for the registry (``io.targets``): its ``EXPORT``, with its row of the target
table, its format and its exporter, and the request an exporter is handed."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from zbsolve.base.errors import InputError
from zbsolve.core.schedule import Schedule
from zbsolve.io.document import document_of, from_document, load_document, read_document
from zbsolve.io.targets.plan import Plan, read_plan
from zbsolve.io.targets.target import Target

OUTPUTS = ("file", "folder", "optional")
"""What a format writes to (``Export.output``): a file, a folder (checked by its exporter), or a file it may go
without (nothing is then written)."""
OPTIONS = ("microbatch_size", "renames")
"""The export options a format may take (``Export.options``), in the order their misuse is reported."""


@dataclass(frozen=True)
class Request:
    """One export: the schedule document, where it goes and the options given."""

    document: str | Path | dict
    """The document's file, or the document itself, read as its file would be (lists for tuples, JSON's
    numbers)."""
    format: str
    output: str | Path | None
    microbatch_size: int | None = None
    renames: Sequence[str] = ()
    note: Callable[[str], None] | None = None
    """Hears the lines for the user the export has, where given."""
    taker: str = "export_document"
    """What a file of another kind than a schedule document is said to be refused by."""

    @property
    def inputs(self) -> list[str | Path]:
        """The files the export reads, which it may not write."""
        return [] if isinstance(self.document, dict) else [self.document]

    def destination(self) -> str | Path:
        """The output the export writes to; an ``InputError`` where there is none."""
        if self.output is None:
            raise InputError(f"output is missing: format {self.format!r} writes files")
        return self.output

    def schedule(self) -> Schedule:
        """The document's schedule alone: its costs, if any, are not read."""
        if isinstance(self.document, dict):
            return from_document(self.document, taker=self.taker)[0]
        return read_document(self.document, self.taker)[0]

    def plan(self) -> Plan:
        """The document's plan (``read_plan``)."""
        loaded = (document_of(self.document, taker=self.taker) if isinstance(self.document, dict)
                  else load_document(self.document, self.taker))
        return read_plan(loaded, self.format)

    def text(self) -> str:
        """The document's text, as its file holds it."""
        if isinstance(self.document, dict):
            return json.dumps(self.document, indent=1) + "\n"
        return Path(self.document).read_text()


@dataclass(frozen=True)
class Export:
    """A target as its module declares it (``EXPORT``): its row, and how its export writes a plan."""

    target: Target
    """Its row of the target table (``plan --target``)."""
    format: str
    """The format its exporter writes (``zbsolve export --format``)."""
    rank: int
    """Where it stands in the target table and ``FORMATS``: lowest first."""
    write: Callable[[Request], tuple[list[Path], str]]
    """Writes a request (checked by ``export_document``): the files written and the main text."""
    takes: Callable[[Plan], object]
    """What its export makes of a plan, an ``InputError`` where it refuses it."""
    output: str = "file"
    """What it writes to: one of ``OUTPUTS``."""
    options: tuple[str, ...] = ()
    """The ``OPTIONS`` it takes."""

    def __post_init__(self) -> None:
        if self.output not in OUTPUTS or not set(self.options) <= set(OPTIONS):
            raise ValueError(f"{self.format}: output = {self.output!r}, options = {self.options}")
