"""The frontiers as charts: paper bubble against the memory limit, one line per placement, the handcrafted
families as labelled points; and a plan's step time against the device memory (``plan --frontier``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from matplotlib.figure import Figure

from zbsolve.base.files import write_with
from zbsolve.base.units import gib
from zbsolve.optimize.frontier import Frontier
from zbsolve.planning.memory_frontier import BlockPoint, MemoryPoint
from zbsolve.present.figures import Units, label
from zbsolve.present.plot import check_chart_path

FRONTIER_FORMATS = (".png", ".svg", ".pdf")
"""The suffixes ``save_frontier_chart`` writes."""


def check_chart(path: str | Path, what: str = "chart", inputs: Iterable[str | Path | None] = ()) -> Path:
    """``path`` as a Path if a frontier chart can be written there (a .png, .svg or .pdf file in a writable folder,
    none of the files in ``inputs``); else an ``InputError`` naming ``what`` and the path."""
    return check_chart_path(path, what, inputs, FRONTIER_FORMATS)


def plot_frontier(frontier: Frontier, title: str = "memory-bubble frontier") -> Figure:
    """Paper bubble against memory factor: one line per placement, families as labelled points."""
    fig = Figure(figsize=(7, 4.5), layout="constrained")
    ax = fig.add_subplot()
    for placement in dict.fromkeys(r.placement for r in frontier.rows):
        pts = [(r.factor, r.paper_bubble) for r in frontier.rows
               if r.placement == placement and r.paper_bubble is not None]
        if pts:
            ax.plot(*zip(*pts), marker="o", label=placement)
    for f in frontier.families:
        ax.scatter([f.factor], [f.paper_bubble], marker="x", color="black")
        ax.annotate(f.name, (f.factor, f.paper_bubble), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xlabel("memory limit / 1F1B's peak")
    ax.set_ylabel(label("paper_bubble"))
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    return fig


def save_frontier_chart(frontier: Frontier, path: str | Path, title: str = "memory-bubble frontier") -> Path:
    """Write ``plot_frontier`` (.png, .svg or .pdf), whole or not at all; return the path."""
    path = check_chart(path)
    return _write(plot_frontier(frontier, title), path)


def plot_memory_frontier(points: Sequence[MemoryPoint], blocks: Sequence[BlockPoint],
                         title: str = "step time against device memory") -> Figure:
    """The plan's step time at each device memory, the best fitting baselines without and with recomputation, and
    the V-shape building blocks as labelled points at the memory they need; under ``title``, what the plan
    recomputes at each memory (``recomputes``)."""
    fig = Figure(figsize=(7, 4.5), layout="constrained")
    ax = fig.add_subplot()
    for name, values, style in (("plan", [p.step_time for p in points], "o-"),
                                ("best baseline", [p.baseline for p in points], "s--"),
                                ("best baseline, recomputing", [p.baseline_recomputed for p in points], "^--")):
        pts = [(gib(p.device_memory), v) for p, v in zip(points, values) if v is not None]
        if pts:
            ax.plot(*zip(*pts), style, label=name)
    for b in blocks:
        marker = "x" if b.recompute == "none" else "+"
        ax.scatter([gib(b.memory)], [b.step_time], marker=marker, color="black")
        ax.annotate(b.name + ("" if b.recompute == "none" else f", {b.recompute}"), (gib(b.memory), b.step_time),
                    textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xlabel("device memory (GiB)")
    ax.set_ylabel(label("step_time", Units("s")))
    ax.set_title(f"{title}\n{recomputes(points)}" if recomputes(points) else title)
    ax.grid(alpha=0.3)
    ax.legend()
    return fig


def recomputes(points: Sequence[MemoryPoint]) -> str:
    """What the plan recomputes at each device memory, by the form's name (``per-stage``, ``full``, ...), memories of
    one form together: "the plan recomputes: per-stage at 48, 64 GiB; none at 80 GiB"; empty where no plan says."""
    forms: dict[str, list[str]] = {}
    for p in points:
        if p.recompute is not None:
            forms.setdefault(p.recompute.split(":")[0], []).append(f"{gib(p.device_memory):g}")
    if not forms:
        return ""
    return "the plan recomputes: " + "; ".join(f"{form} at {', '.join(at)} GiB" for form, at in forms.items())


def save_memory_frontier_chart(points: Sequence[MemoryPoint], blocks: Sequence[BlockPoint], path: str | Path,
                               title: str = "step time against device memory") -> Path:
    """Write ``plot_memory_frontier`` (.png, .svg or .pdf), whole or not at all; return the path."""
    path = check_chart(path)
    return _write(plot_memory_frontier(points, blocks, title), path)


def _write(figure: Figure, path: Path) -> Path:
    """Write ``figure`` to ``path`` in the format its suffix names, whole or not at all."""
    write_with(path, lambda tmp: figure.savefig(tmp, format=path.suffix.lower()[1:]))
    return path
