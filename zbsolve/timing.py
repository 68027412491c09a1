"""The timing engine, written once: as-soon-as-possible starts of per-device orders.

Nodes are integers; each device runs its nodes in the given order, one at a time, and a node
starts once its device is free and every predecessor has ended plus its lag. The simulator times
ops with it, the formulation passes with integer durations, the V-shape families unit slots.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args


@dataclass(frozen=True)
class Timing:
    """Starts and ends of the nodes an order could run; ``reached`` < the order's length means deadlock."""

    start: list
    """Start of each node (None: never reached)."""
    end: list
    """End of each node (None: never reached)."""
    reached: list[int]
    """Per device, how many of its nodes ran."""

    def deadlocked(self, orders: Sequence[Sequence[int]]) -> bool:
        """Whether some device could not run its whole order."""
        return any(r < len(seq) for r, seq in zip(self.reached, orders))


def asap(orders: Sequence[Sequence[int]], duration: Sequence[float],
         preds: Sequence[Sequence[tuple[int, float]]], origin: float = 0) -> Timing:
    """Time ``orders`` (per device, node ids) as soon as possible from ``origin``; ``preds[i]`` lists
    (node, lag) pairs."""
    n = len(duration)
    start: list = [None] * n
    end: list = [None] * n
    reached = [0] * len(orders)
    free = [origin] * len(orders)
    progress = True
    while progress:
        progress = False
        for d, seq in enumerate(orders):
            k, t_free = reached[d], free[d]
            while k < len(seq):
                i = seq[k]
                ready = t_free
                for a, gap in preds[i]:
                    done = end[a]
                    if done is None:
                        break
                    if done + gap > ready:
                        ready = done + gap
                else:
                    start[i] = ready
                    t_free = end[i] = ready + duration[i]
                    k += 1
                    continue
                break
            if k != reached[d]:
                reached[d], free[d], progress = k, t_free, True
    return Timing(start, end, reached)


Objective = Literal["span", "makespan"]
"""What a schedule is judged by: the longest per-device span (the paper's, for the post-validated
runtime) or the makespan (one step with an optimizer barrier)."""
OBJECTIVES: tuple[str, ...] = get_args(Objective)


def device_objective(first_start: float, last_end: float, objective: str) -> float:
    """One device's share of the objective: its span (last end - first start) or its last end."""
    return last_end - first_start if objective == "span" else last_end
