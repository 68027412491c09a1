"""How a schedule is measured against its devices and its bound, stated once: the bubbles and the gap."""

from __future__ import annotations

from collections.abc import Sequence


def bubble(work: Sequence[float], step: float) -> float:
    """Idle share of all devices over a step: 1 - work / (devices x step), floored at 0 against rounding."""
    return max(0.0, 1.0 - sum(work) / (len(work) * step))


def device_bubble(work: float, step: float) -> float:
    """Idle share of one device over a step: 1 - its work / step."""
    return 1.0 - work / step


def paper_bubble(span: float, work: float) -> float:
    """The Zero Bubble paper's bubble rate: (max span - max work) / max span, floored at 0."""
    return max(0.0, (span - work) / span)


def gap(value: float, bound: float) -> float:
    """How far ``value`` is above its lower ``bound``, relative to it: (value - bound) / value; 0 means proven
    optimal (and for a value of 0)."""
    return (value - bound) / value if value > 0 else 0.0
