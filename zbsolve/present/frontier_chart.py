"""The memory-bubble frontier as a chart: paper bubble against the memory limit, one line per placement, the
handcrafted families as labelled points."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from matplotlib.figure import Figure

from zbsolve.base.files import write_with
from zbsolve.planning.frontier import Frontier
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
    ax.set_ylabel("paper bubble rate")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    return fig


def save_frontier_chart(frontier: Frontier, path: str | Path, title: str = "memory-bubble frontier") -> Path:
    """Write ``plot_frontier`` (.png, .svg or .pdf), whole or not at all; return the path."""
    path = check_chart(path)
    figure = plot_frontier(frontier, title)
    write_with(path, lambda tmp: figure.savefig(tmp, format=path.suffix.lower()[1:]))
    return path
