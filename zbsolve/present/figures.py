"""Figures as a person reads them: each under its one name (``core.measures.FIGURES``) with its unit, the same in
the command line's tables, the results' own tables (terminal and Jupyter) and the charts.

A model's times are seconds and its memory bytes (shown in GiB); a problem file states its units (``time_unit``,
``memory_unit``: the paper's problems are in microseconds and Table 1's units); the unit profile's are T_F's and M_B's;
a schedule document states its profile's under the same keys (docs/schedule-format.md); any other profile's are
named as "profile's unit".
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from zbsolve.base.units import GIB, gib
from zbsolve.core.measures import FIGURES, OBJECTIVE_FIGURES, Figure

if TYPE_CHECKING:
    from zbsolve.problem.costs import Costs

UNKNOWN = "profile's unit"
"""The unit named where a profile states none."""


@dataclass(frozen=True)
class Units:
    """The units of a profile's figures as tables and charts name them."""

    time: str = UNKNOWN
    """Of times: "s" for a model."""
    memory: str = UNKNOWN
    """Of memory figures: "GiB" where they are bytes (``in_bytes``), shown divided by ``GIB``."""
    in_bytes: bool = False
    """Whether the memory figures are bytes (a model's, or a profile given a device memory)."""

    @classmethod
    def of(cls, costs: "Costs | None" = None, time: str | None = None, memory: str | None = None) -> "Units":
        """The units of ``costs``' figures: seconds for a model, bytes for a model or a device memory; else ``time``
        and ``memory`` as a file states them (None or empty: ``UNKNOWN``)."""
        seconds = costs is not None and costs.model is not None
        in_bytes = costs is not None and costs.in_bytes
        return cls("s" if seconds else time or UNKNOWN, "GiB" if in_bytes else memory or UNKNOWN, in_bytes)

    def memory_value(self, value: float) -> float:
        """A memory figure in the unit shown: GiB where it is bytes."""
        return gib(value) if self.in_bytes else value


UNIT_PROFILE = Units("units of T_F", "units of M_B")
"""The units of the unit profile (T_F = T_B = T_W = 1, M_B = 1), the commands' default."""

SHOWN: dict[str, Figure] = {
    **FIGURES,
    "objective": Figure("minimised"),
    "partition": Figure("layers per stage"),
    "chunks": Figure("stages per device"),
    "source": Figure("schedule from"),
    "device_memory_gib": Figure("device memory"),
    "solve_time": Figure("solve time", "s"),
    "plan_time": Figure("plan time", "s"),
    "factor": Figure("limit / 1F1B's peak"),
    "max GiB": Figure("most memory on a device", "GiB"),
    "vs best uniform": Figure("step time / best uniform's"),
    "vs best torchtitan": Figure("step time / best torchtitan's"),
}
"""The figures' names in tables: ``FIGURES``, and the other entries of a summary that a plain key would not say."""
HIDDEN = ("bound_met",)
"""Summary entries no table shows as a row (the status says it: "heuristic (bound met)")."""
BOUND_FIGURES = ("lower_bound", "gap")
"""Figures of a bound: None where no bound was computed (an interrupted plan), shown as "unknown", never as 0."""


def label(key: str, units: Units | None = None) -> str:
    """The name of the figure under ``key`` with its unit in brackets ("step time with barrier (s)"); a key of no
    figure as it is."""
    figure = SHOWN.get(key)
    if figure is None:
        return key
    units = units or Units()
    unit = {"time": units.time, "memory": units.memory}.get(figure.unit, figure.unit)
    return f"{figure.name} ({unit})" if unit else figure.name


def size_text(size: float) -> str:
    """Bytes as GiB and as GB, so a preset's decimal size and a size given in GiB read alike: "79.65 GiB (85.52 GB)"."""
    return f"{_trimmed(gib(size), 2)} GiB ({_trimmed(size / 1e9, 2)} GB)"


def _trimmed(value: float, decimals: int) -> str:
    return f"{value:.{decimals}f}".rstrip("0").rstrip(".")


def shown(figures: Mapping[str, object], units: Units | None = None) -> dict[str, object]:
    """``figures`` (a summary or a timeline's figures) by their names with units: each figure once (the makespan and
    the objective's value are the step time with the barrier where they equal it; the first name shown is kept),
    memory figures in GiB where they are bytes, the objective by the figure it minimises, the device memory in GiB and
    GB, a bound's figures (``BOUND_FIGURES``) "unknown" where None."""
    units = units or Units()
    rows: dict[str, object] = {}
    for key, value in figures.items():
        if key in HIDDEN:
            continue
        name = label(OBJECTIVE_FIGURES.get(str(figures.get("objective")), key) if key == "value" else key, units)
        if key in BOUND_FIGURES and value is None:
            value = "unknown"
        elif key == "objective":
            value = FIGURES[OBJECTIVE_FIGURES[value]].name if value in OBJECTIVE_FIGURES else value
        elif key == "device_memory_gib" and isinstance(value, (int, float)):
            value = size_text(value * GIB)
        elif SHOWN.get(key, Figure("")).unit == "memory" and units.in_bytes:
            value = _memory(value, units)
        if name not in rows:
            rows[name] = value
    return rows


def _memory(value: object, units: Units) -> object:
    if isinstance(value, (list, tuple)):
        return [_memory(v, units) for v in value]
    return units.memory_value(value) if isinstance(value, (int, float)) and math.isfinite(value) else value


def published_rows(published: Mapping[str, float], table: tuple[int, int], solved: tuple[int, int],
                   objective: str) -> tuple[dict[str, float], str | None]:
    """A problem's ``published`` figures (the paper's bubble of each schedule in the paper's table for the problem's
    (p, m), ``table``) as rows named for what they hold, and the note under the table: none shown where the solve's
    (p, m), ``solved``, differ from the table's; where shown, the note says which objective the solve minimised."""
    if not published:
        return {}, None
    (p, m), (q, n) = table, solved
    if (p, m) != (q, n):
        return {}, f"the paper's table is for p={p}, m={m}: its figures are not shown beside p={q}, m={n}"
    rows = {f"paper's bubble of {name} (paper's table)": value for name, value in published.items()}
    note = f"paper's table: the paper's bubble of each schedule at p={p}, m={m}"
    if objective != "span":
        note += (f"; this solve minimised the {FIGURES[OBJECTIVE_FIGURES[objective]].name}, not the paper's bubble "
                 "(--objective span minimises the longest span, the paper's objective)")
    return rows, note
