"""``zbsolve configure``'s ranked table, in the terminal and in Jupyter: one row per candidate, the counts of the
search and the chosen configuration's ``zbsolve predict`` line below it."""

from __future__ import annotations

import html
from pathlib import Path

from rich import box
from rich.console import Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from zbsolve.configure.result import ConfigureResult
from zbsolve.present.tables import fmt

COLUMNS = ("rank", "tp/pp/vp/cp/ep/dp", "mbs", "zero", "recompute", "split", "tokens/s/GPU", "MFU", "step s",
           "planned step s", "peak GiB", "why it loses")
"""The ranked table's columns (``ConfigureResult.rows``)."""
HEADERS = {"rank": "#", "tp/pp/vp/cp/ep/dp": "tp/pp/vp/\ncp/ep/dp", "tokens/s/GPU": "tokens/\ns/GPU",
           "planned step s": "planned\nstep s", "peak GiB": "peak\nGiB"}
"""Headers on two lines where the column's figures are narrower than its name."""
WRAPPED = "why it loses"
"""Its one column that wraps, left-aligned: the others keep their figures on one line."""


def shown(column: str, value: object) -> str:
    """A cell of the ranked table: tokens/s/GPU whole, MFU in per cent, seconds to four figures, GiB to one
    decimal."""
    if not isinstance(value, float):
        return fmt(value)
    return (f"{value:,.0f}" if column == "tokens/s/GPU" else f"{100 * value:.1f}%" if column == "MFU"
            else f"{value:.1f}" if column == "peak GiB" else f"{value:.4g}")


def title(result: ConfigureResult) -> str:
    """The model's name, the target and whether the search finished: "llama3-70b: configurations for megatron
    (complete)", else "(incomplete: best found)"."""
    done = "complete" if result.complete else "incomplete: best found"
    return f"{Path(result.chosen.configuration.config).stem}: configurations for {result.target} ({done})"


def lines(result: ConfigureResult) -> list[str]:
    """What follows the table: the choice's standing (``ConfigureResult.status``), the counts with the seconds
    taken, the chosen configuration's predict line, the runtime's warnings on the ranked ones and the result's
    notes."""
    chosen = "best" if result.complete else "best found"
    warned = [f"#{k} warned: {w}" for k, r in enumerate(result.candidates, 1) for w in r.warnings]
    return [result.status(), f"{result.counts.line()}; {result.elapsed_s:.0f} s",
            f"{chosen}: {result.chosen.command}", *warned, *result.notes]


def configure_table(result: ConfigureResult) -> Table:
    """The ranked table for the terminal, with no rules between its columns: eleven fit 100 columns."""
    table = Table(title=escape(title(result)), box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 0))
    for name in COLUMNS:
        table.add_column(HEADERS.get(name, name), justify="left" if name == WRAPPED else "right",
                         no_wrap=name != WRAPPED, overflow="fold")
    for row in result.rows():
        table.add_row(*(escape(shown(name, row[name])) for name in COLUMNS))
    return table


def configure_rich(result: ConfigureResult) -> Group:
    """The ranked table with ``lines`` under it."""
    return Group(configure_table(result), *(Text(line) for line in lines(result)))


def configure_html(result: ConfigureResult) -> str:
    """The ranked table as HTML (Jupyter), the counts and the chosen configuration's predict line under it."""
    def cells(tag: str, values: list[str]) -> str:
        return "".join(f"<{tag}>{html.escape(value)}</{tag}>" for value in values)

    head = f"<tr>{cells('th', [HEADERS['rank'] if name == 'rank' else name for name in COLUMNS])}</tr>"
    rows = "".join(f"<tr>{cells('td', [shown(name, row[name]) for name in COLUMNS])}</tr>" for row in result.rows())
    below = "".join(f"<p><code>{html.escape(line)}</code></p>" for line in lines(result))
    return f"<p><b>{html.escape(title(result))}</b></p><table>{head}{rows}</table>{below}"
