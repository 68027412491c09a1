"""Memory limits from memory factors: a factor K is K times 1F1B's peak activation memory."""

from __future__ import annotations

from collections.abc import Sequence

from zbsolve.base.errors import InputError
from zbsolve.schedulers.families import make_schedule
from zbsolve.core.placement import CHUNKS
from zbsolve.problem.problem_file import Problem
from zbsolve.core.profile import Profile
from zbsolve.core.simulator import simulate


def reference_peak(profile: Profile, num_devices: int, num_microbatches: int, chunks: int = CHUNKS) -> float:
    """1F1B's peak activation memory for this problem, the unit of a memory factor: on the profile with one stage
    per device (a profile of ``chunks`` stages per device has them merged)."""
    merged = profile.merge_chunks(num_devices, chunks)
    return simulate(make_schedule("1f1b", merged, num_devices, num_microbatches)).peak


def resolve_limit(profile: Profile, num_devices: int, num_microbatches: int,
                  mem_limit: float | Sequence[float] | None, mem_factor: float | None,
                  chunks: int = CHUNKS) -> float | Sequence[float] | None:
    """The memory limit in profile units: ``mem_limit`` as given, or ``mem_factor`` x 1F1B's peak."""
    if mem_limit is not None and mem_factor is not None:
        raise InputError("give mem_limit or mem_factor, not both")
    if mem_factor is not None:
        if not mem_factor > 0:
            raise InputError(f"mem_factor = {mem_factor} must be > 0")
        return mem_factor * reference_peak(profile, num_devices, num_microbatches, chunks)
    return mem_limit


def problem_limit(problem: Problem, mem_limit: float | Sequence[float] | None = None,
                  mem_factor: float | None = None, chunks: int = CHUNKS) -> float | Sequence[float] | None:
    """A problem's memory limit: ``mem_limit`` or ``mem_factor`` when either is given, else the problem's own."""
    given = (mem_limit, mem_factor) if mem_limit is not None or mem_factor is not None else \
        (problem.mem_limit, problem.mem_factor)
    return resolve_limit(problem.profile, problem.num_devices, problem.num_microbatches, *given, chunks)
