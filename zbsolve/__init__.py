"""zbsolve: optimal pipeline-parallel training schedules under a memory budget."""

from zbsolve.errors import InfeasibleError, InputError, MemoryLimitError, ScheduleError, ZbsolveError
from zbsolve.placement import Placement
from zbsolve.profile import UNIT, Profile
from zbsolve.schedule import Pair, Pass, Schedule
from zbsolve.simulator import Timeline, simulate
from zbsolve.solve import SolveResult, solve
from zbsolve.model import Model
from zbsolve.planner import PlanResult, plan
from zbsolve.frontier import frontier  # zbsolve.frontier is the function; import names from the module

__all__ = [
    "InfeasibleError", "InputError", "MemoryLimitError", "Model", "Pair", "Pass", "Placement", "PlanResult", "Profile",
    "Schedule", "ScheduleError", "SolveResult", "Timeline", "UNIT", "ZbsolveError", "frontier", "plan", "simulate",
    "solve",
]
__version__ = "0.1.0"
