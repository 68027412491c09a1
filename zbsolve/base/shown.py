"""Results shown by Jupyter and rich in the forms that ``zbsolve.present.forms`` registers for their type, so a
result type carries figures and no rendering of its own."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple


class Forms(NamedTuple):
    """How one result type is shown."""

    rich: Callable[[Any], object]
    """The result as a rich renderable (a terminal table)."""
    html: Callable[[Any], str]
    """The result as an HTML table (Jupyter)."""


FORMS: dict[type, Forms] = {}
"""Result type -> its forms, filled in by ``zbsolve.present.forms`` (imported with the package)."""


class Shown:
    """Mixin: ``_repr_html_`` and ``__rich__`` from the forms registered for the type."""

    def _repr_html_(self) -> str:
        return FORMS[type(self)].html(self)

    def __rich__(self) -> object:
        return FORMS[type(self)].rich(self)
