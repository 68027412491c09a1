"""Where a calibration scales the cost model: named multipliers on named terms, each 1 unless told.

A ``Calibration`` holds a multiplier per term of ``TERMS`` within ``BOUNDS``; the kernel model
(``zbsolve.costmodel.kernels.Kernels``) reads its kernel terms. Nothing fits them yet: this is the place a fit
against measured steps fills, its multipliers then recorded with the measurement they come from.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from zbsolve.base.errors import InputError

TERMS = {"gemm": "seconds of matrix products", "attention": "seconds of the attention core",
         "memory_bound": "seconds of memory-bound kernels"}
"""The terms a calibration scales, by name, with what each multiplies."""
BOUNDS = (0.25, 4.0)
"""The least and the most multiplier: a calibration outside them says more about the model than the device."""


@dataclass(frozen=True)
class Calibration:
    """Multipliers on named terms of the cost model; a term not named keeps 1."""

    multipliers: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    """The multiplier of each term it scales (``TERMS``), within ``BOUNDS``."""

    def __post_init__(self) -> None:
        if not isinstance(self.multipliers, Mapping):
            raise InputError(f"calibration = {self.multipliers!r}: should be a mapping of term to multiplier")
        for term, value in self.multipliers.items():
            if term not in TERMS:
                raise InputError(f"calibration.{term} = {value!r}: {term!r} should be one of {', '.join(TERMS)}")
            if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
                    or not BOUNDS[0] <= value <= BOUNDS[1]):
                raise InputError(f"calibration.{term} = {value!r}: should be a number in "
                                 f"[{BOUNDS[0]:g}, {BOUNDS[1]:g}]")
        object.__setattr__(self, "multipliers", MappingProxyType(dict(self.multipliers)))

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.multipliers.items())))

    def scale(self, term: str) -> float:
        """The multiplier of ``term`` (1.0 where not named)."""
        if term not in TERMS:
            raise InputError(f"term = {term!r}: should be one of {', '.join(TERMS)}")
        return float(self.multipliers.get(term, 1.0))
