"""zbsolve: optimal pipeline-parallel training schedules under a memory budget."""

from zbsolve.base.errors import InfeasibleError, InputError, MemoryLimitError, ScheduleError, ZbsolveError
from zbsolve.core.placement import Placement
from zbsolve.core.profile import UNIT, Profile
from zbsolve.core.schedule import Pair, Pass, Schedule
from zbsolve.core.simulator import Timeline, simulate
from zbsolve.optimize.result import SolveResult
from zbsolve.optimize.solve import solve
from zbsolve.planning.frontier import frontier
from zbsolve.planning.planner import plan
from zbsolve.planning.result import PlanResult
from zbsolve.present import forms  # noqa: F401  (registers how results show in Jupyter and rich)
from zbsolve.problem.estimate.formula import estimate
from zbsolve.problem.model import Model

__all__ = [
    "InfeasibleError", "InputError", "MemoryLimitError", "Model", "Pair", "Pass", "Placement", "PlanResult", "Profile",
    "Schedule", "ScheduleError", "SolveResult", "Timeline", "UNIT", "ZbsolveError", "estimate", "frontier", "plan",
    "simulate", "solve",
]
__version__ = "0.1.0"
