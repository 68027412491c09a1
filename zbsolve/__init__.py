"""zbsolve: optimal pipeline-parallel training schedules under a memory budget.

The names below load on first use (PEP 562), so the command line starts, and can be interrupted, before the
solver's and torch's modules are imported."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from zbsolve.optimize.result import SolveResult
    from zbsolve.planning.result import PlanResult

_HOMES = {
    "InfeasibleError": "zbsolve.base.errors", "InputError": "zbsolve.base.errors",
    "MemoryLimitError": "zbsolve.base.errors", "ScheduleError": "zbsolve.base.errors",
    "ZbsolveError": "zbsolve.base.errors", "Placement": "zbsolve.core.placement", "UNIT": "zbsolve.core.profile",
    "Profile": "zbsolve.core.profile", "Pair": "zbsolve.core.schedule", "Pass": "zbsolve.core.schedule",
    "Schedule": "zbsolve.core.schedule", "Timeline": "zbsolve.core.simulator", "simulate": "zbsolve.core.simulator",
    "FORMATS": "zbsolve.io.exports", "SolveResult": "zbsolve.optimize.result", "solve": "zbsolve.optimize.solve",
    "frontier": "zbsolve.planning.frontier", "plan": "zbsolve.planning.planner",
    "PlanResult": "zbsolve.planning.result", "estimate": "zbsolve.problem.estimate.formula",
    "Model": "zbsolve.problem.model",
}
"""Where each public name is defined."""

__all__ = sorted([*_HOMES, "export"])
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """A public name, its module imported on first use (with how results show in Jupyter and rich)."""
    if name not in _HOMES:
        raise AttributeError(f"module 'zbsolve' has no attribute {name!r}")
    importlib.import_module("zbsolve.present.forms")  # registers how results show
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])


def export(document: str | Path | SolveResult | PlanResult, format: str, path: str | Path | None = None, *,
           microbatch_size: int | None = None, renames: Sequence[str] = ()) -> str:
    """Export a schedule document (the path of one, or a ``SolveResult`` or ``PlanResult`` as it is) in ``format``
    (one of ``FORMATS``: torch-csv, torchtitan, megatron) to ``path`` (a file; a folder for torchtitan; megatron
    prints without one), the files ``zbsolve export DOCUMENT --format FORMAT -o PATH`` writes. Returns the main text:
    the CSV, or Megatron's arguments. ``microbatch_size`` and ``renames`` are torchtitan's (``--microbatch-size``,
    ``--rename``)."""
    from zbsolve.io.exports import export_document
    from zbsolve.optimize.result import SolveResult
    from zbsolve.planning.result import PlanResult

    if isinstance(document, (SolveResult, PlanResult)):
        return document.export(format, path, microbatch_size=microbatch_size, renames=renames)
    return export_document(document, format, path, microbatch_size=microbatch_size, renames=renames,
                           taker="zbsolve.export")[1]
