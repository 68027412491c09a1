"""Gantt chart of a Timeline: one row per device, a box per pass, bubbles as empty space,
and an optional panel of activation memory over time.

Works headless and in notebooks: it builds ``matplotlib.figure.Figure`` objects directly, never
through pyplot, and saving picks the Agg (PNG) or SVG renderer from the file's suffix.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from io import BytesIO
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.collections import PolyCollection
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.legend_handler import HandlerTuple
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from zbsolve.base.errors import InputError
from zbsolve.base.files import check_output, write_with
from zbsolve.base.units import GIB
from zbsolve.core.measures import FIGURES
from zbsolve.core.schedule import BW, KINDS, B, F, Kind, Pair, Schedule, W
from zbsolve.core.simulator import Timeline
from zbsolve.present.figures import Units, label
from zbsolve.problem.costs import Costs

if TYPE_CHECKING:
    from zbsolve.optimize.result import SolveResult
    from zbsolve.planning.result import PlanResult

COLORS = {F: "#4c72b0", B: "#e1812c", W: "#8c6bb1", BW: "#3a923a"}
"""Base colour of each pass kind; a device's later stages (chunks) get lighter shades."""
FORMATS = (".png", ".svg")
MAX_LABELS = 2500
"""Above this many readable boxes, no box is labelled."""

_WIDTH_IN, _ROW_IN, _MEMORY_IN = 14.0, 0.36, 2.6
_LEFT_IN, _RIGHT_IN, _TOP_IN, _BOTTOM_IN = 0.8, 2.1, 0.75, 0.6
_LABEL_IN = 0.075
"""Inches of left margin per character of the longest device label."""
_GAP_IN, _BOX, _MIN_FONT = 0.3, 0.8, 4.5


class Chart(Figure):
    """A Figure that shows itself as a PNG in Jupyter, with or without pyplot's inline backend."""

    def _repr_png_(self) -> bytes:
        buffer = BytesIO()
        self.savefig(buffer, format="png")
        return buffer.getvalue()


def _shade(kind: Kind, chunk: int, chunks: int) -> tuple[float, float, float]:
    """Colour of ``kind`` on a device's ``chunk``-th stage: later chunks blend towards white."""
    mix = 0.5 * chunk / (chunks - 1) if chunks > 1 else 0.0
    r, g, b = (c + (1.0 - c) * mix for c in to_rgb(COLORS[kind]))
    return r, g, b


def _ink(face: tuple[float, float, float]) -> str:
    """Black or white, whichever reads better on ``face``."""
    r, g, b = face
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.55 else "white"


def _chunks(schedule: Schedule) -> list[dict[tuple[int, int], int]]:
    """Per device: (route, stage) -> index of that stage among the device's stages."""
    return [{rs: i for i, rs in enumerate(schedule.placement.stages_of(d))} for d in range(schedule.num_devices)]


def _boxes(timeline: Timeline):
    """Every box to draw: (x0, x1, y0, y1, pass, face colour); an F&B pair gives two half-height boxes."""
    schedule = timeline.schedule
    chunk_of = _chunks(schedule)
    boxes = []
    for d, ops in enumerate(schedule.devices):
        n = len(chunk_of[d])
        for op, x0, x1 in zip(ops, timeline.start[d], timeline.end[d]):
            halves = ((op.f, d - _BOX / 2, d), (op.b, d, d + _BOX / 2)) if isinstance(op, Pair) else (
                (op, d - _BOX / 2, d + _BOX / 2),)
            for p, y0, y1 in halves:
                chunk = chunk_of[d][(schedule.microbatch_route[p.mb], p.stage)]
                boxes.append((x0, x1, y0, y1, p, _shade(p.kind, chunk, n)))
    return boxes


def _figure(ax: Axes) -> Figure:
    """The figure ``ax`` is drawn on (the whole figure, where ``ax`` is in a subfigure)."""
    fig = ax.get_figure(root=True)
    assert fig is not None, "axes made by subplots or add_subplot are on a figure"
    return fig


def _points_per_unit(ax: Axes, makespan: float, num_devices: int) -> tuple[float, float]:
    """Size in points of one time unit and of one device row, from the axes' current place."""
    fig = _figure(ax)
    pos = ax.get_position()
    width_pt = pos.width * fig.get_figwidth() * 72.0
    height_pt = pos.height * fig.get_figheight() * 72.0
    return width_pt / max(makespan, 1e-12), height_pt / num_devices


def _label(ax: Axes, boxes: list, x_pt: float, row_pt: float) -> None:
    """Write each box's microbatch number, shrunk to fit its box; skip boxes too small to read,
    and label none at all when there are too many."""
    full = min(9.0, 0.5 * row_pt)
    digits = max(len(str(p.mb)) for *_, p, _ in boxes)
    fits = []
    for x0, x1, y0, y1, p, face in boxes:
        text = str(p.mb)
        size = min(full * min(1.0, 1.4 * (y1 - y0) / _BOX), ((x1 - x0) * x_pt - 2.0) / (0.62 * digits))
        if size >= _MIN_FONT:
            fits.append(((x0 + x1) / 2, (y0 + y1) / 2, text, size, _ink(face)))
    if len(fits) > MAX_LABELS:
        return
    for x, y, text, size, ink in fits:
        ax.text(x, y, text, ha="center", va="center", fontsize=size, color=ink, clip_on=True)


def _legend_handles(boxes: list, schedule: Schedule) -> tuple[list, list[str]]:
    """One legend entry a pass kind, one for the F&B pairs, one for the lighter shades of a device's later stages
    (every kind's), one for idle time: no two entries in the same colours."""
    kinds = {p.kind for *_, p, _ in boxes}
    handles: list = [Patch(facecolor=COLORS[k], label=k) for k in KINDS if k in kinds]
    labels = [{F: "F forward", B: "B input grad", W: "W weight grad", BW: "BW full backward"}[k]
              for k in KINDS if k in kinds]
    pairs = [op for ops in schedule.devices for op in ops if isinstance(op, Pair)]
    if pairs:
        back = pairs[0].b.kind
        handles.append((Patch(facecolor=COLORS[F]), Patch(facecolor=COLORS[back])))
        labels.append(f"F&{back} pair (top F)")
    if max(len(c) for c in _chunks(schedule)) > 1:
        handles.append(tuple(Patch(facecolor=_shade(k, 1, 2)) for k in KINDS if k in kinds))
        labels.append("device's later stages")
    handles.append(Patch(facecolor="white", edgecolor="0.6"))
    labels.append("idle (bubble)")
    return handles, labels


def _gantt(ax: Axes, timeline: Timeline, rows: Sequence[str] | None = None) -> None:
    schedule = timeline.schedule
    p, makespan = schedule.num_devices, timeline.makespan
    boxes = _boxes(timeline)
    x_pt, row_pt = _points_per_unit(ax, makespan, p)
    verts = np.array([((x0, y0), (x0, y1), (x1, y1), (x1, y0)) for x0, x1, y0, y1, *_ in boxes]).reshape(-1, 4, 2)
    widths = verts[:, 2, 0] - verts[:, 0, 0]
    edge = 0.5 if widths.size and np.median(widths) * x_pt >= 4.0 else 0.0
    # A 3-D array of vertices is PolyCollection's fast path, which matplotlib's stubs leave out.
    ax.add_collection(PolyCollection(verts, facecolors=[b[-1] for b in boxes],  # type: ignore[arg-type]
                                     edgecolors="white", linewidths=edge, antialiaseds=edge > 0))
    _label(ax, boxes, x_pt, row_pt)
    ax.set_xlim(0.0, makespan)
    ax.set_ylim(p - 0.5, -0.5)
    ax.set_yticks(range(p), list(rows) if rows is not None else [str(d) for d in range(p)],
                  fontsize=8 if p <= 16 else 6)
    ax.set_ylabel("device")
    for d in range(1, p):
        ax.axhline(d - 0.5, color="0.9", linewidth=0.5, zorder=0)
    handles, labels = _legend_handles(boxes, schedule)
    ax.legend(handles, labels, handler_map={tuple: HandlerTuple(ndivide=None, pad=0)}, loc="upper left",
              bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)


def _memory(ax: Axes, timeline: Timeline, scale: float, unit: str) -> None:
    """Activation memory over time per device (divided by ``scale``, in ``unit``), and the limits dashed: one legend
    entry a device, and one for the limits."""
    schedule = timeline.schedule
    p, makespan = schedule.num_devices, timeline.makespan
    cmap = colormaps["viridis"]
    colors = [cmap(d / max(p - 1, 1) * 0.9) for d in range(p)]
    for d, steps in enumerate(timeline.memory):
        t, m = zip(*steps, (makespan, steps[-1][1]))
        ax.step(t, [x / scale for x in m], where="post", color=colors[d], linewidth=1.0,
                label=f"device {d}" if p <= 8 or d in (0, p - 1) else None)
    limits = [schedule.limit_of(d) for d in range(p)]
    given = [x for x in limits if x is not None]
    if len(given) == p and len(set(given)) == 1:
        ax.axhline(given[0] / scale, color="black", linestyle="--", linewidth=1.0, label="memory limit")
    handles, labels = ax.get_legend_handles_labels()
    if given and "memory limit" not in labels:
        for d, limit in enumerate(limits):
            if limit is not None:
                ax.axhline(limit / scale, color=colors[d], linestyle="--", linewidth=0.8)
        handles.append(Line2D([], [], color="0.5", linestyle="--", linewidth=0.8))
        labels.append("limits (dashed)")
    ax.set_ylabel(f"activation\nmemory{f' ({unit})' if unit else ''}")
    ax.set_ylim(0.0, 1.05 * max([timeline.peak, *given]) / scale or 1.0)
    ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)


def _left_in(labels: Sequence[str]) -> float:
    """Inches of left margin that fit the longest of ``labels`` (tick labels beside the axes)."""
    return max(_LEFT_IN, _LABEL_IN * max(map(len, labels), default=0))


def _number(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 1e5 else f"{x:.6g}"


def _title(timeline: Timeline, title: str | None, units: Units) -> str:
    """``title`` (default: the schedule's name), then the figures by their names (``present.figures``), each with
    its unit."""
    schedule = timeline.schedule
    head = schedule.name if title is None else title
    step = f"{timeline.makespan:.4g}" if units.time == "s" else _number(timeline.makespan)
    peak = f"{units.memory_value(timeline.peak):.2f}" if units.in_bytes else _number(timeline.peak)
    return (f"{head}\np={schedule.num_devices}, m={schedule.num_microbatches}, {FIGURES['step_time'].name} "
            f"{step} {units.time}, {FIGURES['bubble_rate'].name} {timeline.bubble_rate:.2%}, "
            f"{FIGURES['paper_bubble'].name} {timeline.paper_bubble:.2%}, {FIGURES['peak_memory'].name} {peak} "
            f"{units.memory}")


def plot_timeline(timeline: "Timeline | SolveResult | PlanResult", *, memory: bool = False, title: str | None = None,
                  ax: Axes | None = None, rows: Sequence[str] | None = None, costs: Costs | None = None,
                  units: Units | None = None) -> Figure:
    """Gantt chart of ``timeline`` (or of a solve's or a plan's result: its timeline, with its costs); ``memory``
    adds a panel of activation memory per device.

    The title's first line is ``title`` (default: the schedule's name), the second its figures. ``rows`` labels
    the devices (default: their numbers, with the model's layers they hold when ``costs`` has a model). Times and
    memory carry their units: with ``costs`` of a model seconds and GiB (GiB too where a device memory is given),
    else ``units`` (``Units(time="us", memory=...)``, as a problem file states them; default "profile's unit").
    With ``ax`` the chart is drawn there (no memory panel) and ``ax``'s figure is returned.
    """
    if not isinstance(timeline, Timeline):
        costs = costs if costs is not None else timeline.costs
        timeline = timeline.timeline
    units = Units.of(costs, units.time if units else None, units.memory if units else None)
    if rows is None and costs is not None and costs.model is not None:
        rows = [f"{d}: {names}" for d, names in enumerate(costs.device_names())]
    xlabel = f"time ({units.time})"
    if ax is not None and memory:
        raise InputError("memory = True needs a figure of its own: leave ax = None")
    if ax is None:
        p = timeline.schedule.num_devices
        gantt_in = max(1.2, _ROW_IN * p)
        height = _TOP_IN + gantt_in + _BOTTOM_IN + (_MEMORY_IN + _GAP_IN if memory else 0.0)
        fig = Chart(figsize=(_WIDTH_IN, height))
        fig.subplots_adjust(left=_left_in(rows or []) / _WIDTH_IN, right=1 - _RIGHT_IN / _WIDTH_IN,
                            top=1 - _TOP_IN / height, bottom=_BOTTOM_IN / height,
                            hspace=2 * _GAP_IN / (gantt_in + _MEMORY_IN))
        if memory:
            ax, memory_ax = fig.subplots(2, 1, sharex=True, height_ratios=[gantt_in, _MEMORY_IN])
            _memory(memory_ax, timeline, GIB if units.in_bytes else 1.0, units.memory)
            memory_ax.set_xlabel(xlabel)
        else:
            ax = fig.subplots()
    _gantt(ax, timeline, rows)
    if not memory:
        ax.set_xlabel(xlabel)
    ax.set_title(_title(timeline, title, units), loc="left", fontsize=10)
    return _figure(ax)


def check_chart_path(path: str | Path, what: str = "chart", inputs: Iterable[str | Path | None] = (),
                     formats: Sequence[str] = FORMATS) -> Path:
    """``path`` as a Path if a chart can be written there (a file of one of ``formats`` in a writable folder, none
    of the files in ``inputs``); else an ``InputError`` naming ``what`` and the path."""
    path = Path(path)
    if path.suffix.lower() not in formats:
        raise InputError(f"{what} = {path}: suffix {path.suffix or '(none)'!r} is not one of {', '.join(formats)}")
    return check_output(path, what, inputs)


def save_figure(fig: Figure, path: str | Path) -> Path:
    """Write ``fig`` as PNG or SVG, chosen by ``path``'s suffix, whole or not at all; return the path."""
    path = check_chart_path(path)
    write_with(path, lambda tmp: fig.savefig(tmp, format=path.suffix.lower()[1:], dpi=150))
    return path


def save_chart(timeline: Timeline, path: str | Path, *, memory: bool = False, title: str | None = None,
               costs: Costs | None = None, units: Units | None = None) -> Path:
    """Write the chart of ``timeline`` (``plot_timeline``) as PNG or SVG, chosen by ``path``'s suffix, whole or not
    at all; return the path."""
    check_chart_path(path)
    return save_figure(plot_timeline(timeline, memory=memory, title=title, costs=costs, units=units), path)


def plot_plan(result: "PlanResult") -> Figure:
    """The plan's Gantt chart, each device labelled with the model's layers it holds, titled with what was planned
    and whose schedule was kept (``PlanResult.title``: the placement, the recomputation, the partition), above the
    step times of the plan and of the baselines (hatched: does not fit the device memory)."""
    timeline, costs = result.timeline, result.costs
    p = timeline.schedule.num_devices
    rows = [f"{d}: {names}" for d, names in enumerate(costs.device_names())]
    bars = [(f"plan ({result.placement})", result.step_time, True)] + [
        (f"{b.schedule} ({b.split}" + ("" if b.recompute == "none" else f", recompute {b.recompute}") + ")",
         b.step_time, b.fits) for b in result.baselines if b.step_time is not None]
    gantt_in, bars_in = max(1.2, _ROW_IN * p), max(1.2, 0.2 * len(bars))
    height = _TOP_IN + gantt_in + _BOTTOM_IN + bars_in + 2 * _GAP_IN
    fig = Chart(figsize=(_WIDTH_IN, height))
    fig.subplots_adjust(left=_left_in(rows + [name for name, *_ in bars]) / _WIDTH_IN,
                        right=1 - _RIGHT_IN / _WIDTH_IN, top=1 - _TOP_IN / height,
                        bottom=_BOTTOM_IN / height, hspace=4 * _GAP_IN / (gantt_in + bars_in))
    ax, bar_ax = fig.subplots(2, 1, height_ratios=[gantt_in, bars_in])
    _gantt(ax, timeline, rows)
    ax.set_xlabel("time (s)")
    ax.set_title(_title(timeline, result.title(), Units.of(costs)), loc="left", fontsize=10)
    names, times, fits = zip(*bars)
    y = range(len(bars))
    bar_ax.barh(y, times, color=["#3a923a" if k == 0 else "#4c72b0" for k in y],
                hatch=[None if ok else "//" for ok in fits], edgecolor="white")
    bar_ax.set_yticks(y, names, fontsize=7)
    bar_ax.set_ylim(len(bars) - 0.5, -0.5)
    bar_ax.set_xlabel(f"{label('step_time', Units.of(costs))}; hatched: does not fit the device memory")
    return fig


def save_plan_chart(result: "PlanResult", path: str | Path) -> Path:
    """Write ``plot_plan(result)`` as PNG or SVG, chosen by ``path``'s suffix, whole or not at all; return the path."""
    check_chart_path(path)
    return save_figure(plot_plan(result), path)
