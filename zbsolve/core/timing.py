"""The timing engine, written once: as-soon-as-possible starts of per-device orders.

Nodes are integers; each device runs its nodes in the given order, one at a time, and a node
starts once its device is free and every predecessor has ended plus its lag. The simulator times
ops with it, the formulation passes with integer durations, the V-shape families unit slots.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


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


@dataclass(frozen=True)
class Preds:
    """Predecessors of ``n`` nodes in columns of flat lists: ``node[c][i]`` is node i's c-th predecessor (``n``
    for none) and ``lag[c][i]`` its lag."""

    node: list[list[int]]
    """Per column, each node's predecessor in it (``n``: none)."""
    lag: list[list[float]]
    """Per column, the lag of each node's predecessor in it."""

    @classmethod
    def from_lists(cls, preds: Sequence[Sequence[tuple[int, float]]]) -> Preds:
        """The columns of ``preds[i]``, node i's (predecessor, lag) pairs."""
        n, width = len(preds), max(map(len, preds), default=0)
        node = [[n] * n for _ in range(width)]
        lag: list[list[float]] = [[0] * n for _ in range(width)]
        for i, links in enumerate(preds):
            for c, (a, gap) in enumerate(links):
                node[c][i], lag[c][i] = a, gap
        return cls(node, lag)


def asap(orders: Sequence[Sequence[int]], duration: Sequence[float],
         preds: Preds | Sequence[Sequence[tuple[int, float]]], origin: float | Sequence[float] = 0) -> Timing:
    """Time ``orders`` (per device, node ids) as soon as possible from ``origin`` (one time, or each device's);
    ``preds`` is a ``Preds`` or, per node, its (node, lag) pairs. Each node is tried once, and once more each time a
    device that waited for it resumes, so the work is linear in nodes and predecessors."""
    if not isinstance(preds, Preds):
        preds = Preds.from_lists(preds)
    columns = list(zip(preds.node, preds.lag))
    n = len(duration)
    start: list = [None] * n
    end: list = [None] * n + [-math.inf]
    reached = [0] * len(orders)
    free = list(origin) if isinstance(origin, Sequence) else [origin] * len(orders)
    waiting: dict[int, list[int]] = {}
    todo = list(range(len(orders) - 1, -1, -1))
    while todo:
        d = todo.pop()
        seq, k, t_free = orders[d], reached[d], free[d]
        stop = len(seq)
        while k < stop:
            i = seq[k]
            ready = t_free
            for node, gaps in columns:
                a = node[i]
                done = end[a]
                if done is None:
                    waiting.setdefault(a, []).append(d)
                    break
                done += gaps[i]
                if done > ready:
                    ready = done
            else:
                start[i] = ready
                t_free = end[i] = ready + duration[i]
                k += 1
                if i in waiting:
                    todo += waiting.pop(i)
                continue
            break
        reached[d], free[d] = k, t_free
    end.pop()
    return Timing(start, end, reached)

