"""Handcrafted schedule families: each a pure function (profile, num_devices, num_microbatches) -> Schedule."""

from __future__ import annotations

from zbsolve.base.checks import check_count, check_size
from zbsolve.base.errors import InputError
from zbsolve.core.profile import Profile
from zbsolve.core.schedule import Schedule
from zbsolve.schedulers.families import classic, dualpipe, vshape, zero_bubble  # noqa: F401  (fill FAMILIES)
from zbsolve.schedulers.families.registry import CHUNKS_OF, FAMILIES, PLACEMENT_FAMILIES, Family, register

__all__ = ["CHUNKS_OF", "FAMILIES", "PLACEMENT_FAMILIES", "Family", "make_schedule", "register"]


def make_schedule(name: str, profile: Profile, num_devices: int, num_microbatches: int) -> Schedule:
    """Run the family ``name``; unknown names, bad p/m and problems over ``MAX_PASSES`` give a clear ``InputError``."""
    if name not in FAMILIES:
        raise InputError(f"family = {name!r} is unknown; choose one of {', '.join(FAMILIES)}")
    check_count("num_devices", num_devices)
    check_count("num_microbatches", num_microbatches)
    check_size(CHUNKS_OF[name] * num_devices, num_microbatches)
    return FAMILIES[name](profile, num_devices, num_microbatches)


