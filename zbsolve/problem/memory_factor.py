"""Memory limits from memory factors: a factor K is K times 1F1B's peak activation memory."""

from __future__ import annotations

from zbsolve.core.memory import peak
from zbsolve.core.placement import CHUNKS
from zbsolve.core.profile import Profile
from zbsolve.schedulers.families import make_schedule


def reference_peak(profile: Profile, num_devices: int, num_microbatches: int, chunks: int = CHUNKS) -> float:
    """1F1B's peak activation memory for this problem, the unit of a memory factor: on the profile with one stage
    per device (a profile of ``chunks`` stages per device has them merged), by the memory rule alone (1F1B is valid,
    and its peak needs no timing)."""
    merged = profile.merge_chunks(num_devices, chunks)
    schedule = make_schedule("1f1b", merged, num_devices, num_microbatches)
    return max(peak(schedule, d) for d in range(num_devices))


def factor_limit(profile: Profile, num_devices: int, num_microbatches: int, mem_factor: float,
                 chunks: int = CHUNKS) -> float:
    """The memory limit in profile units that ``mem_factor`` stands for: ``mem_factor`` x 1F1B's peak."""
    return mem_factor * reference_peak(profile, num_devices, num_microbatches, chunks)
