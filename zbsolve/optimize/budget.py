"""The one deadline of a solve: what each phase costs, and whether it fits in the time left."""

from __future__ import annotations

import time
from dataclasses import dataclass

from zbsolve.optimize.backends.protocol import Log

COSTS = {"family": 10.0, "heuristic variant": 4.5, "v-greedy variant": 4.0, "simulate": 1.6, "re-simulate": 2.2,
         "formulate": 8.5, "lower bound": 2.0, "warm-up bound": 1.3, "search": 6.0}
"""Cost of each search phase in units of the first schedule's simulation, the largest measured with p = 64 to 128
and m = 512 to 1024: building and simulating a family (V-Half's and V-Min's builds are the slowest, about 7.5);
one variant of the heuristic and one run of the V-shape greedy; simulating a warm start; rebuilding and simulating
the backend's order; the formulation; the cheap lower bound with the warm start's order; building the warm-up
relaxation; the least search worth starting (timing the warm start, building a small window, checking its order).
The phases after the search, the result's step times and its document, are not estimated but measured (``keep``)."""


@dataclass
class Budget:
    """The one deadline of a solve, and the unit of ``COSTS``."""

    deadline: float
    started: float
    """``time.monotonic()`` when the solve began."""
    unit: float = 0.0
    """Seconds the first schedule's simulation took."""
    kept: float = 0.0
    """Seconds kept before the deadline for the result's step times and its document (``keep``)."""

    def left(self) -> float:
        """Seconds until the deadline (negative once it has passed)."""
        return self.deadline - time.monotonic()

    def cost(self, phase: str) -> float:
        """Estimated seconds of ``phase``."""
        return COSTS[phase] * self.unit

    def keep(self, seconds: float) -> None:
        """Keep ``seconds`` before the deadline for the phases after the search: what they took on the first
        schedule, measured."""
        self.kept += seconds
        self.deadline -= seconds

    def allows(self, phase: str, log: Log, then: float = 0.0, name: str | None = None) -> bool:
        """Whether ``phase`` fits in the time left, keeping ``then`` seconds for what must follow; if not, log
        why (naming it ``name``, by default the phase)."""
        need = self.cost(phase) + then
        if need <= self.left():
            return True
        log.append(f"{name or phase}: skipped, it needs about {need:.2g}s and {max(0.0, self.left()):.2g}s are left")
        return False
