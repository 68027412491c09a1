"""Handcrafted schedule families: each a pure function (profile, num_devices, num_microbatches) -> Schedule."""

from __future__ import annotations

from typing import Callable

from zbsolve.base.checks import check_count, check_size
from zbsolve.base.errors import InputError
from zbsolve.core.profile import Profile
from zbsolve.core.schedule import Schedule

Family = Callable[[Profile, int, int], Schedule]

FAMILIES: dict[str, Family] = {}
"""CLI name -> generator, filled in by the family modules below."""
CHUNKS_OF: dict[str, int] = {}
"""CLI name -> stages per device of the family's placement."""
PLACEMENT_FAMILIES = {"sequential": ("zb-h2", "zb-h1", "1f1b"), "interleaved": ("1f1b-i",),
                      "vshape": ("zb-v", "v-half", "v-min")}
"""The families that run on each placement the optimizer solves (the multi-chunk ones with two chunks), from
the most memory and fewest bubbles to the least memory: the floor and warm starts of a solve (the first that fits
is the best of them on every problem in problems/) and the points beside a frontier."""


def register(name: str, chunks: int = 1) -> Callable[[Family], Family]:
    """Decorator: add a generator to ``FAMILIES`` under its CLI name, with ``chunks`` stages per device."""
    def deco(fn: Family) -> Family:
        FAMILIES[name] = fn
        CHUNKS_OF[name] = chunks
        return fn
    return deco


def make_schedule(name: str, profile: Profile, num_devices: int, num_microbatches: int) -> Schedule:
    """Run the family ``name``; unknown names, bad p/m and problems over ``MAX_PASSES`` give a clear ``InputError``."""
    if name not in FAMILIES:
        raise InputError(f"family = {name!r} is unknown; choose one of {', '.join(FAMILIES)}")
    check_count("num_devices", num_devices)
    check_count("num_microbatches", num_microbatches)
    check_size(CHUNKS_OF[name] * num_devices, num_microbatches)
    return FAMILIES[name](profile, num_devices, num_microbatches)


from zbsolve.schedulers.families import classic, zero_bubble, vshape, dualpipe  # noqa: E402,F401,I001  (fill FAMILIES)
