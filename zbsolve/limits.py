"""Memory limits from memory factors: a factor K is K times 1F1B's peak activation memory."""

from __future__ import annotations

from collections.abc import Sequence

from zbsolve.errors import InputError
from zbsolve.families import make_schedule
from zbsolve.profile import Profile
from zbsolve.simulator import simulate


def reference_peak(profile: Profile, num_devices: int, num_microbatches: int) -> float:
    """1F1B's peak activation memory for this problem: the unit of a memory factor."""
    return simulate(make_schedule("1f1b", profile, num_devices, num_microbatches)).peak


def resolve_limit(profile: Profile, num_devices: int, num_microbatches: int,
                  mem_limit: float | Sequence[float] | None, mem_factor: float | None) -> float | Sequence[float] | None:
    """The memory limit in profile units: ``mem_limit`` as given, or ``mem_factor`` x 1F1B's peak."""
    if mem_limit is not None and mem_factor is not None:
        raise InputError("give mem_limit or mem_factor, not both")
    if mem_factor is not None:
        if not mem_factor > 0:
            raise InputError(f"mem_factor = {mem_factor} must be > 0")
        return mem_factor * reference_peak(profile, num_devices, num_microbatches)
    return mem_limit
