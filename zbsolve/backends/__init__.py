"""Solver backends: each turns a Formulation (and a warm start) into per-device pass orders."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


class Log(list[str]):
    """Solver log lines; each appended line is also passed to ``report`` (when given) as it comes."""

    def __init__(self, report: Callable[[str], None] | None = None) -> None:
        super().__init__()
        self.report = report

    def append(self, line: str) -> None:
        """Add ``line`` and report it."""
        super().append(line)
        if self.report is not None:
            self.report(line)


@dataclass(frozen=True)
class BackendResult:
    """What a backend found."""

    order: list[list[int]] | None
    """Per device, pass indices in order; None when no schedule was found."""
    optimal: bool
    """Whether the backend proved ``order`` optimal."""
    bound: int | None
    """The backend's own lower bound on the scaled objective (None: none)."""
    log: str
    """Human-readable solver log."""
    interrupted: bool = False
    """Whether Ctrl-C stopped the search."""
