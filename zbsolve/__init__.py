"""zbsolve: optimal pipeline-parallel training schedules under a memory budget.

Every public name is loaded on first use (``__getattr__``), so that ``import zbsolve`` and a process that runs one
part of it (an executor's rank, a pool's worker) import only what they run."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from zbsolve import configure
    from zbsolve.base.errors import InfeasibleError, InputError, MemoryLimitError, ScheduleError, ZbsolveError
    from zbsolve.configure.predict import Configuration, Prediction
    from zbsolve.configure.result import ConfigureResult
    from zbsolve.core.placement import Placement
    from zbsolve.core.profile import UNIT, Profile
    from zbsolve.core.schedule import Pair, Pass, Schedule
    from zbsolve.core.simulator import Timeline, simulate
    from zbsolve.costmodel.estimate import estimate
    from zbsolve.costmodel.model import Model
    from zbsolve.io.targets import FORMATS
    from zbsolve.optimize.frontier import frontier
    from zbsolve.optimize.result import SolveResult
    from zbsolve.optimize.solve import solve
    from zbsolve.planning.planner import plan
    from zbsolve.planning.result import PlanResult
    from zbsolve.problem.problem_file import Problem

__all__ = [
    "Configuration", "ConfigureResult", "FORMATS", "InfeasibleError", "InputError", "MemoryLimitError", "Model",
    "Pair", "Pass", "Placement", "PlanResult", "Prediction", "Problem", "Profile", "Schedule", "ScheduleError",
    "SolveResult", "Timeline", "UNIT", "ZbsolveError", "configure", "estimate", "export", "frontier", "plan",
    "predict", "simulate", "solve",
]
__version__ = "0.1.0"

_HOMES = {
    "InfeasibleError": "zbsolve.base.errors", "InputError": "zbsolve.base.errors",
    "MemoryLimitError": "zbsolve.base.errors", "ScheduleError": "zbsolve.base.errors",
    "ZbsolveError": "zbsolve.base.errors", "Configuration": "zbsolve.configure.predict",
    "Prediction": "zbsolve.configure.predict", "ConfigureResult": "zbsolve.configure.result",
    "Placement": "zbsolve.core.placement", "UNIT": "zbsolve.core.profile", "Profile": "zbsolve.core.profile",
    "Pair": "zbsolve.core.schedule", "Pass": "zbsolve.core.schedule", "Schedule": "zbsolve.core.schedule",
    "Timeline": "zbsolve.core.simulator", "simulate": "zbsolve.core.simulator",
    "estimate": "zbsolve.costmodel.estimate", "Model": "zbsolve.costmodel.model", "FORMATS": "zbsolve.io.targets",
    "frontier": "zbsolve.optimize.frontier", "SolveResult": "zbsolve.optimize.result",
    "solve": "zbsolve.optimize.solve", "plan": "zbsolve.planning.planner", "PlanResult": "zbsolve.planning.result",
    "Problem": "zbsolve.problem.problem_file",
}
"""Each public name's module: the name is imported from there on first use."""


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use and kept; ``configure`` is the subpackage (callable)."""
    if name == "configure":
        return importlib.import_module("zbsolve.configure")
    if name not in _HOMES:
        raise AttributeError(f"module 'zbsolve' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The module's names, the public ones not yet loaded among them."""
    return sorted({*globals(), *__all__})


def export(document: str | Path | SolveResult | PlanResult, format: str, path: str | Path | None = None, *,
           microbatch_size: int | None = None, renames: Sequence[str] = ()) -> str:
    """Export a schedule document (the path of one, or a ``SolveResult`` or ``PlanResult`` as it is) in ``format``
    (one of ``FORMATS``: torch-csv, torchtitan, megatron) to ``path`` (a file; a folder for torchtitan; megatron
    prints without one), the files ``zbsolve export DOCUMENT --format FORMAT -o PATH`` writes. Returns the main text:
    the CSV, or Megatron's arguments. ``microbatch_size`` and ``renames`` are torchtitan's (``--microbatch-size``,
    ``--rename``)."""
    from zbsolve.io.targets import export_document
    from zbsolve.optimize.result import SolveResult
    from zbsolve.planning.result import PlanResult

    if isinstance(document, (SolveResult, PlanResult)):
        return document.export(format, path, microbatch_size=microbatch_size, renames=renames)
    return export_document(document, format, path, microbatch_size=microbatch_size, renames=renames,
                           taker="zbsolve.export")[1]


def predict(configuration: Configuration | str | Path, **knobs: Any) -> Prediction:
    """One configuration's step time, throughput, memory and where its step goes, as ``zbsolve predict`` prints
    them: ``configuration`` a ``Configuration``, with ``knobs`` replacing its fields, or the path of a model's
    Hugging Face config.json with the configuration's fields as ``knobs`` (``seq_len``, ``microbatch_size``,
    ``global_batch``, ``gpus``, ``tp``, ``pp``, ``device_memory="80GiB"``, ...). An ``InputError`` names a field
    the configuration refuses."""
    from zbsolve.base.errors import InputError
    from zbsolve.configure.predict import Configuration
    from zbsolve.configure.predict import predict as run

    if isinstance(configuration, Configuration):
        c = configuration.replace(**knobs) if knobs else configuration
    elif isinstance(configuration, (str, Path)):
        c = Configuration(config=configuration, **knobs)
    else:
        raise InputError(f"configuration = {configuration!r}: should be a Configuration or a config.json's path")
    return run(c)
