"""zbsolve: optimal pipeline-parallel training schedules under a memory budget."""

from collections.abc import Sequence
from pathlib import Path

from zbsolve import configure  # the package, callable as configure.choose.configure
from zbsolve.base.errors import InfeasibleError, InputError, MemoryLimitError, ScheduleError, ZbsolveError
from zbsolve.configure.result import ConfigureResult
from zbsolve.core.placement import Placement
from zbsolve.core.profile import UNIT, Profile
from zbsolve.core.schedule import Pair, Pass, Schedule
from zbsolve.core.simulator import Timeline, simulate
from zbsolve.costmodel.estimate import estimate
from zbsolve.costmodel.model import Model
from zbsolve.io.targets import FORMATS, export_document
from zbsolve.optimize.frontier import frontier
from zbsolve.optimize.result import SolveResult
from zbsolve.optimize.solve import solve
from zbsolve.planning.planner import plan
from zbsolve.planning.result import PlanResult
from zbsolve.present import forms  # noqa: F401  (registers how results show in Jupyter and rich)

__all__ = [
    "ConfigureResult", "FORMATS", "InfeasibleError", "InputError", "MemoryLimitError", "Model", "Pair", "Pass",
    "Placement", "PlanResult", "Profile", "Schedule", "ScheduleError", "SolveResult", "Timeline", "UNIT",
    "ZbsolveError", "configure", "estimate", "export", "frontier", "plan", "simulate", "solve",
]
__version__ = "0.1.0"


def export(document: str | Path | SolveResult | PlanResult, format: str, path: str | Path | None = None, *,
           microbatch_size: int | None = None, renames: Sequence[str] = ()) -> str:
    """Export a schedule document (the path of one, or a ``SolveResult`` or ``PlanResult`` as it is) in ``format``
    (one of ``FORMATS``: torch-csv, torchtitan, megatron) to ``path`` (a file; a folder for torchtitan; megatron
    prints without one), the files ``zbsolve export DOCUMENT --format FORMAT -o PATH`` writes. Returns the main text:
    the CSV, or Megatron's arguments. ``microbatch_size`` and ``renames`` are torchtitan's (``--microbatch-size``,
    ``--rename``)."""
    if isinstance(document, (SolveResult, PlanResult)):
        return document.export(format, path, microbatch_size=microbatch_size, renames=renames)
    return export_document(document, format, path, microbatch_size=microbatch_size, renames=renames,
                           taker="zbsolve.export")[1]
