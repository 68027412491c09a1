"""Export a schedule to torch.distributed.pipelining's compute-only CSV (docs/torch.md).

One row per rank, one cell per action (``zbsolve.core.transforms.torch_actions``). Torch's runtime rules are enforced
here: one copy of each stage (no bidirectional placement), every rank holds a stage, and the last stage runs its
forwards in microbatch order (``zbsolve.core.transforms.renumber_last_stage``). When torch is installed, its own loader
checks the CSV before it is written. This module does not need torch.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from zbsolve.base.errors import InputError
from zbsolve.base.files import check_output, write_atomic
from zbsolve.core import torch_compat
from zbsolve.core.schedule import Schedule
from zbsolve.core.simulator import simulate
from zbsolve.core.transforms import renumber_last_stage, torch_actions

FORMATS = ("torch-csv",)
"""Formats ``export_schedule`` writes."""


def check_exportable(schedule: Schedule) -> None:
    """Raise ``InputError`` when torch's runtime cannot run ``schedule``'s placement."""
    placement = schedule.placement
    if len(placement.routes) != 1:
        raise InputError(f"placement routes = {[list(r) for r in placement.routes]} is bidirectional (DualPipe: two "
                         "weight copies of each stage per rank); torch's pipeline runtime holds one copy of each "
                         "stage, so it cannot run this schedule (dualpipev's V-shape placement can)")
    idle = [d for d in range(placement.num_devices) if not placement.stages_of(d)]
    if idle:
        raise InputError(f"placement routes = {list(placement.routes[0])} gives device {idle[0]} no stage; "
                         "torch needs at least one stage per rank")


def torch_csv(schedule: Schedule) -> str:
    """The compute-only CSV text torch's runtime loads for ``schedule``, which is checked exportable and
    validated by the simulator first."""
    check_exportable(schedule)
    simulate(schedule)
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows(torch_actions(renumber_last_stage(schedule)))
    return buffer.getvalue()


def checked_csv(schedule: Schedule) -> str:
    """``torch_csv(schedule)``, loaded by torch's own loader first when torch is installed (an ``InputError`` if it
    refuses the text)."""
    text = torch_csv(schedule)
    if torch_compat.has_pipelining():
        torch_compat.lower_csv(text, num_stages=schedule.num_stages, num_microbatches=schedule.num_microbatches,
                               num_devices=schedule.num_devices)
    return text


def export_schedule(schedule: Schedule, output: str | Path, fmt: str = "torch-csv") -> str:
    """Write ``schedule`` in format ``fmt`` to ``output`` and return the text written. The path is checked first;
    when torch is installed its loader checks the text; the file is replaced whole, never left half-written."""
    if fmt not in FORMATS:
        raise InputError(f"format = {fmt!r} is unknown; choose one of {', '.join(FORMATS)}")
    check_output(output, "output")
    text = checked_csv(schedule)
    write_atomic(output, text)
    return text
