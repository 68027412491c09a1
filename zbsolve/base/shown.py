"""Results shown by Jupyter and rich in the forms that ``zbsolve.present.forms`` registers for their type, and drawn
by the chart it registers, so a result type carries figures and no rendering of its own."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from matplotlib.figure import Figure


class Forms(NamedTuple):
    """How one result type is shown."""

    rich: Callable[[Any], object]
    """The result as a rich renderable (a terminal table)."""
    html: Callable[[Any], str]
    """The result as an HTML table (Jupyter)."""


FORMS: dict[type, Forms] = {}
"""Result type -> its forms, filled in by ``zbsolve.present.forms`` (imported when a result is first shown)."""
CHARTS: dict[type, Callable[[Any, str | Path | None], "Figure"]] = {}
"""Result type -> its chart: (result, path or None) -> a matplotlib Figure, written to the path when one is given;
filled in by ``zbsolve.present.forms``."""
REGISTRAR = "zbsolve.present.forms"
"""The module that fills in ``FORMS`` and ``CHARTS``, a layer above the results: imported by its name when a
result is first shown or drawn."""


def registered(kind: type) -> type:
    """``kind``, its forms and chart registered (``REGISTRAR`` imported when they are not yet)."""
    if kind not in FORMS:
        importlib.import_module(REGISTRAR)
    return kind


class Tabled:
    """Mixin: ``_repr_html_`` and ``__rich__`` from the forms registered for the type."""

    def _repr_html_(self) -> str:
        return FORMS[registered(type(self))].html(self)

    def __rich__(self) -> object:
        return FORMS[registered(type(self))].rich(self)


class Shown(Tabled):
    """Mixin: ``Tabled``'s forms, and ``plot`` from the chart registered for the type."""

    def plot(self, path: str | Path | None = None) -> "Figure":
        """The result's chart as a matplotlib Figure (it shows itself in Jupyter): a solve's Gantt chart with its
        memory panel, a plan's beside the baselines' step times, configure's candidates' throughput against memory,
        as ``zbsolve solve --chart``, ``zbsolve plan --chart`` and ``zbsolve configure --chart`` draw them; written
        to ``path`` (.png or .svg, whole or not at all) when one is given."""
        return CHARTS[registered(type(self))](self, path)
