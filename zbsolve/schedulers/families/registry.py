"""The registry of handcrafted families: each family module adds its generator under its CLI name."""

from __future__ import annotations

from typing import Callable, TypeVar

from zbsolve.core.profile import Profile
from zbsolve.core.schedule import Schedule

Family = Callable[[Profile, int, int], Schedule]
Generator = TypeVar("Generator", bound=Family)

FAMILIES: dict[str, Family] = {}
"""CLI name -> generator, filled in by the family modules (imported by the package)."""
CHUNKS_OF: dict[str, int] = {}
"""CLI name -> stages per device of the family's placement."""
PLACEMENT_FAMILIES = {"sequential": ("zb-h2", "zb-h1", "1f1b"), "interleaved": ("1f1b-i",),
                      "vshape": ("zb-v", "v-half", "v-min")}
"""The families that run on each placement the optimizer solves (the multi-chunk ones with two chunks), from
the most memory and fewest bubbles to the least memory: the floor and warm starts of a solve (the first that fits
is the best of them on every problem in problems/) and the points beside a frontier."""


def register(name: str, chunks: int = 1) -> Callable[[Generator], Generator]:
    """Decorator: add a generator to ``FAMILIES`` under its CLI name, with ``chunks`` stages per device; the
    generator keeps its own signature (``interleaved_1f1b`` takes its chunks too)."""
    def deco(fn: Generator) -> Generator:
        FAMILIES[name] = fn
        CHUNKS_OF[name] = chunks
        return fn
    return deco
