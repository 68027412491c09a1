"""Errors zbsolve raises: each names the field or pass at fault and the value."""

from __future__ import annotations


class ZbsolveError(Exception):
    """Base class of every error zbsolve raises on purpose."""


class InputError(ZbsolveError, ValueError):
    """Bad input: a field, value or file that zbsolve cannot use."""


class ScheduleError(ZbsolveError):
    """A schedule the simulator rejects: missing, duplicate or misplaced pass, deadlock."""


class MemoryLimitError(ScheduleError):
    """A schedule whose running activation memory exceeds the limit on some device."""


class InfeasibleError(ZbsolveError):
    """No schedule exists under the given constraints (e.g. a memory limit too small)."""

    def __init__(self, message: str, min_feasible: float | None = None) -> None:
        super().__init__(message)
        self.min_feasible = min_feasible


class BudgetError(ZbsolveError, TimeoutError):
    """The time budget ran out before any schedule was found."""
