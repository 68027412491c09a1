"""Figures as text: one number format, rich tables for the terminal and an HTML table for notebooks.

Figures are plain values by name (as ``Timeline.figures()`` and ``SolveResult.summary()`` give them):
floats, ints, strings, None, or lists of numbers.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, cast

from rich import box
from rich.table import Table

from zbsolve.core.measures import BUBBLES_NOTE
from zbsolve.optimize.result import status_text
from zbsolve.present.figures import Units, label

if TYPE_CHECKING:
    from zbsolve.optimize.frontier import Frontier

FRONTIER_COLUMNS = ("placement", "factor", "mem_limit", "paper_bubble", "bubble_rate", "status", "gap")
"""Columns of the frontier table: a row per (placement, limit), then a row per family point."""


SHORT = 24
"""The longest text that ``records_table`` keeps on one line: the columns of numbers wrap their headers first."""


def fmt(value: object) -> str:
    """A figure as text: integral numbers without a fraction, other floats to four decimals (trailing zeros
    dropped; three significant digits below 0.001), lists comma-separated (lists of texts, such as layer labels that
    hold commas themselves, by semicolons), None as "-"."""
    if value is None:
        return "-"
    if isinstance(value, (list, tuple)):
        return ("; " if any(isinstance(v, str) for v in value) else ", ").join(fmt(v) for v in value)
    if isinstance(value, bool) or not isinstance(value, float):
        return str(value)
    if not math.isfinite(value):
        return str(value)
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    if abs(value) < 1e-3:
        return f"{value:.3g}"
    return f"{value:.4f}".rstrip("0").rstrip(".")


def figures_table(figures: Mapping[str, object], title: str, caption: str | None = None) -> Table:
    """A two-column table: one row per figure, its name and value (names as given: ``figures.shown`` names them)."""
    table = Table(title=title, caption=caption, caption_justify="left")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for name, value in figures.items():
        table.add_row(name, fmt(value))
    return table


def figures_html(figures: Mapping[str, object]) -> str:
    """The figures as an HTML table: one row per figure, its name and value."""
    rows = "".join(f"<tr><th>{html.escape(name)}</th><td>{html.escape(fmt(value))}</td></tr>"
                   for name, value in figures.items())
    return f"<table>{rows}</table>"


def records_table(records: Sequence[Mapping[str, object]], title: str,
                  columns: Sequence[str] | None = None, units: Units | None = None,
                  caption: str | None = None) -> Table:
    """One row per record, one column per name in ``columns`` (default: the first record's names), headed by the
    figure's name with its unit in ``units`` (``figures.label``); a column holding numbers is right-aligned, a
    column of texts up to ``SHORT`` long never wraps (a longer text folds: none is cut), a missing value shows as
    "-"."""
    names = list(columns if columns is not None else records[0] if records else ())
    table = Table(title=title, caption=caption, caption_justify="left")
    for name in names:
        numeric = any(isinstance(r.get(name), (int, float)) and not isinstance(r.get(name), bool) for r in records)
        short = not numeric and max((len(fmt(r.get(name))) for r in records), default=0) <= SHORT
        table.add_column(label(name, units), justify="right" if numeric else "left", no_wrap=short, overflow="fold")
    for record in records:
        table.add_row(*(fmt(record.get(name)) for name in names))
    return table


def text_table(columns: Sequence[str], rows: Sequence[Sequence[str]], title: str, caption: str | None = None) -> Table:
    """A table of rows already formatted as text, every column right-aligned; a text too long for its column folds
    (none is cut)."""
    table = Table(title=title, caption=caption, caption_justify="left")
    for name in columns:
        table.add_column(name, justify="right", overflow="fold")
    for row in rows:
        table.add_row(*row)
    return table


def plain_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> Table:
    """A table of rows already formatted as text, every column right-aligned, without a title (the caller prints it as
    a line above) and without rules between its columns, its headers never wrapped: narrow enough for 80 columns."""
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 0))
    for name in columns:
        table.add_column(name, justify="right", no_wrap=True)
    for row in rows:
        table.add_row(*row)
    return table


def frontier_table(frontier: Frontier, title: str, units: Units | None = None) -> Table:
    """The frontier's rows (their status as ``status_text`` reads it), then each family point as a row named
    "family (placement)" whose mem_limit is the family's peak memory; figures named with their ``units``."""
    rows = [{**r.as_dict(), "status": status_text(r.status, r.bound_met)} for r in frontier.rows]
    points = [{"placement": f"{f.name} ({f.placement})", "factor": f.factor, "mem_limit": f.peak_memory,
               "paper_bubble": f.paper_bubble, "status": "family"} for f in frontier.families]
    return records_table(rows + points, title, FRONTIER_COLUMNS, units, BUBBLES_NOTE)


PER_DEVICE = ("static_gib", "activation_gib", "memory_gib")
"""Figures with one value per device, which ``device_memory_table`` shows as columns (beside "device_layers")."""
LAYER_LABELS = ("stage_layers", "device_layers")
"""Figures naming the model's layers each stage and each device holds (``costs.memory_figures``): the device table
shows them, the figures table leaves them out."""
DEVICE_COLUMNS = ("device", "layers", "static GiB", "activations GiB", "total GiB")
"""Columns of ``device_memory_table``."""


def device_memory_table(figures: Mapping[str, object], title: str) -> Table:
    """Memory per device in GiB, one row per device: the layers it holds (by the model's names, "-" for a bare
    profile), its static bytes, its peak activations and their sum (``figures`` as ``memory_figures`` gives them)."""
    # memory_figures gives a list per device for each of PER_DEVICE and "device_layers".
    columns = [cast(Sequence[float], figures[key]) for key in PER_DEVICE]
    n = len(columns[0])
    names = cast(Sequence[str], figures.get("device_layers", ["-"] * n))
    rows = [[str(d), names[d], *(f"{column[d]:.2f}" for column in columns)] for d in range(n)]
    return text_table(DEVICE_COLUMNS, rows, title)


BASELINE_COLUMNS = ("split", "schedule", "recompute", "step_time", "bubble", "max GiB", "fits")
"""Columns of ``baselines_table`` (``Baseline.row()``'s keys; the blocks recomputed per stage beside the
recomputation), which fit 100 columns."""
BASELINE_UNITS = Units("s", "GiB", True)
"""The baselines are a model's: seconds and GiB."""


def baselines_table(rows: Sequence[Mapping[str, object]], title: str, wide: bool = False) -> Table:
    """The baselines (``Baseline.row()`` each): every column with ``wide``; else ``BASELINE_COLUMNS``, the blocks
    recomputed per stage in brackets after the recomputation, and the rows without a figure under the table, one
    line per reason naming their schedules."""
    if wide:
        return records_table(rows, title, None, BASELINE_UNITS)
    timed: list[dict[str, object]] = []
    missing: dict[tuple[str, str], list[str]] = {}
    for row in rows:
        if row.get("step_time") is None:
            recompute = "" if row.get("recompute") in (None, "none") else f" recompute {row['recompute']}"
            missing.setdefault((f"{row['split']}{recompute}", str(row.get("note") or "no figure")), []).append(
                str(row["schedule"]))
            continue
        recomputed = f" ({row['recomputed']})" if row.get("recomputed") else ""
        timed.append({**row, "recompute": f"{row['recompute']}{recomputed}", "fits": "yes" if row["fits"] else "no"})
    caption = "\n".join(f"no figure for {split} {', '.join(names)}: {note}" for (split, note), names in missing.items())
    return records_table(timed, title, BASELINE_COLUMNS, BASELINE_UNITS, caption or None)
