"""How a schedule is measured against its devices and its bound, stated once: the bubbles and the gap, and each
figure's name in tables and charts (``FIGURES``), named for the question it answers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


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


@dataclass(frozen=True)
class Figure:
    """What a figure is called wherever a person reads it (tables, charts, titles), and what it is measured in."""

    name: str
    """The question it answers, e.g. "step time with barrier"."""
    unit: str = ""
    """"time" (the profile's time unit: seconds for a model), "memory" (the profile's memory unit: bytes for a
    model, shown in GiB), "s" (wall seconds), or "" (a share, a count or a text)."""


STEP_TIME = Figure("step time with barrier", "time")
"""One training step with an optimizer barrier (global gradient-norm clipping): the makespan."""
FIGURES: dict[str, Figure] = {
    "step_time": STEP_TIME,
    "makespan": STEP_TIME,
    "step_time_no_barrier": Figure("step time without barrier", "time"),
    "span": Figure("longest span", "time"),
    "bubble_rate": Figure("bubble with barrier"),
    "bubble": Figure("bubble with barrier"),
    "bubble_no_barrier": Figure("bubble without barrier"),
    "paper_bubble": Figure("paper's bubble"),
    "lower_bound": Figure("lower bound", "time"),
    "gap": Figure("gap to the bound"),
    "peak_memory": Figure("peak activations", "memory"),
    "peak_memory_per_device": Figure("peak activations per device", "memory"),
    "mem_limit": Figure("activation limit", "memory"),
}
"""Each figure by its key in results and documents (which stay as they are): one name per figure, so the makespan
and the step time with the barrier, the same figure, read alike. The bubbles answer "what share of every device's
time is idle" (``bubble``: with the barrier, the makespan; without it, the steady period); the paper's bubble
answers "how does this compare with the paper's tables" (``paper_bubble``: the busiest device's idle share of the
longest span); the longest span is the paper's objective."""
OBJECTIVE_FIGURES = {"makespan": "step_time", "span": "span"}
"""The figure each objective (``core.objective.OBJECTIVES``) minimises, by its key in ``FIGURES``."""
BUBBLES_NOTE = ("bubble: the idle share of all devices' time over the step, imbalance included; paper's bubble: "
                "(longest span - the busiest device's work) / longest span, as in the paper's tables")
"""What tells the bubbles apart, said under a table that shows both."""
