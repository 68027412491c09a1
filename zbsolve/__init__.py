"""zbsolve: optimal pipeline-parallel training schedules under a memory budget."""

from zbsolve.base.errors import InfeasibleError, InputError, MemoryLimitError, ScheduleError, ZbsolveError
from zbsolve.core.placement import Placement
from zbsolve.core.profile import UNIT, Profile
from zbsolve.core.schedule import Pair, Pass, Schedule
from zbsolve.core.simulator import Timeline, simulate
from zbsolve.optimize.solve import SolveResult, solve
from zbsolve.problem.model import Model
from zbsolve.planning.planner import PlanResult, plan
from zbsolve.planning.frontier import frontier  # zbsolve.planning.frontier is the function; import names from the module

__all__ = [
    "InfeasibleError", "InputError", "MemoryLimitError", "Model", "Pair", "Pass", "Placement", "PlanResult", "Profile",
    "Schedule", "ScheduleError", "SolveResult", "Timeline", "UNIT", "ZbsolveError", "frontier", "plan", "simulate",
    "solve",
]
__version__ = "0.1.0"
