"""What a backend is: its protocol, its result and its log."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from zbsolve.optimize.formulation import Formulation


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


class Backend(Protocol):
    """Improve ``incumbent`` (per-device pass orders) within ``time_limit`` seconds; ``lower`` is a proven
    bound on the scaled objective; each log line goes to ``report`` as it comes; Ctrl-C returns the best so far."""

    def __call__(self, form: Formulation, incumbent: list[list[int]], *, time_limit: float, workers: int, seed: int,
                 lower: int, report: Callable[[str], None] | None = None) -> BackendResult: ...
