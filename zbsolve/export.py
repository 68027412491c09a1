"""Export a schedule to torch.distributed.pipelining's compute-only CSV (docs/torch.md).

One row per rank, one cell per action: ``{stage}F{mb}`` forward, ``{stage}I{mb}`` zbsolve's B
(input gradient), ``{stage}W{mb}`` weight gradient, ``{stage}B{mb}`` zbsolve's fused BW, and
``({f};{b})OVERLAP_F_B`` an F&B pair. Torch's runtime rules are enforced here: one copy of each
stage (no bidirectional placement), every rank holds a stage, and the last stage runs its forwards
in microbatch order (repaired by renumbering the microbatches, which leaves the gradients the same).
This module does not need torch; ``check_with_torch`` imports it when called.
"""

from __future__ import annotations

import csv
import io
import tempfile
from pathlib import Path

from zbsolve.document import read_document
from zbsolve.errors import InputError
from zbsolve.schedule import BW, B, F, Op, Pair, Pass, Schedule, W, passes_of
from zbsolve.simulator import simulate

FORMATS = ("torch-csv",)
"""Export formats ``export_command`` writes."""

TORCH_KIND = {F: "F", B: "I", W: "W", BW: "B"}
"""zbsolve pass kind -> torch computation type."""


def check_exportable(schedule: Schedule) -> None:
    """Raise ``InputError`` when torch's runtime cannot run ``schedule``'s placement."""
    placement = schedule.placement
    if len(placement.routes) != 1:
        raise InputError(f"placement routes = {[list(r) for r in placement.routes]} is bidirectional (DualPipe: two "
                         "weight copies of each stage per rank); torch's _PipelineScheduleRuntime holds one copy of "
                         "each stage, so it cannot run this schedule (dualpipev's V-shape placement can)")
    idle = [d for d in range(placement.num_devices) if not placement.stages_of(d)]
    if idle:
        raise InputError(f"placement routes = {list(placement.routes[0])} gives device {idle[0]} no stage; "
                         "torch needs at least one stage per rank")


def microbatch_order(schedule: Schedule) -> dict[int, int]:
    """Renumbering old -> new microbatch that puts the last stage's forwards in microbatch order."""
    last = schedule.num_stages - 1
    device = schedule.placement.device(0, last)
    order = [p.mb for op in schedule.devices[device] for p in passes_of(op) if p.kind == F and p.stage == last]
    return {mb: i for i, mb in enumerate(order)}


def _cell(p: Pass, renumber: dict[int, int]) -> str:
    return f"{p.stage}{TORCH_KIND[p.kind]}{renumber[p.mb]}"


def _op_cell(op: Op, renumber: dict[int, int]) -> str:
    if isinstance(op, Pair):
        return f"({_cell(op.f, renumber)};{_cell(op.b, renumber)})OVERLAP_F_B"
    return _cell(op, renumber)


def torch_actions(schedule: Schedule) -> list[list[str]]:
    """Per rank, torch's compute-only action strings for ``schedule`` (validated by the simulator first)."""
    check_exportable(schedule)
    simulate(schedule)
    renumber = microbatch_order(schedule)
    return [[_op_cell(op, renumber) for op in ops] for ops in schedule.devices]


def torch_csv(schedule: Schedule) -> str:
    """The compute-only CSV text torch's ``_PipelineScheduleRuntime._load_csv`` reads."""
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows(torch_actions(schedule))
    return buffer.getvalue()


def check_with_torch(path: str | Path, schedule: Schedule) -> dict[int, list]:
    """Load a CSV with torch's own loader (parse, validate, lower to send/recv) without a process group;
    return torch's per-rank actions with communication. Raise ``InputError`` if torch rejects it."""
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

    runtime = _PipelineScheduleRuntime.__new__(_PipelineScheduleRuntime)
    runtime._n_microbatches = schedule.num_microbatches
    runtime._num_stages = schedule.num_stages
    runtime.pp_group_size = schedule.num_devices
    runtime._stages = []
    runtime._defer_pp_recv = False
    runtime.pipeline_order = {}
    try:
        runtime._load_csv(str(path), format="compute_only")
    except (AssertionError, RuntimeError, ValueError, KeyError) as exc:
        raise InputError(f"torch rejects {path}: {str(exc).splitlines()[0]}") from None
    return runtime.pipeline_order_with_comms


def write_torch_csv(schedule: Schedule, output: str | Path) -> None:
    """Write ``schedule`` as torch's CSV to ``output``; when torch is installed, its loader checks it first."""
    text = torch_csv(schedule)
    try:
        import torch.distributed.pipelining  # noqa: F401
    except ImportError:
        torch_ready = False
    else:
        torch_ready = True
    if torch_ready:
        with tempfile.TemporaryDirectory() as tmp:
            probe = Path(tmp) / "schedule.csv"
            probe.write_text(text)
            check_with_torch(probe, schedule)
    try:
        Path(output).write_text(text)
    except OSError as exc:
        raise InputError(f"cannot write {output}: {exc.strerror}") from None


def export_command(schedule_path: Path, fmt: str, output: Path) -> None:
    """``zbsolve export``: read a schedule document and write it in format ``fmt`` to ``output``."""
    if fmt not in FORMATS:
        raise InputError(f"format = {fmt!r} is unknown; choose one of {', '.join(FORMATS)}")
    schedule, _ = read_document(schedule_path)
    write_torch_csv(schedule, output)
