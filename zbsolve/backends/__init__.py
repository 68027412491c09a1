"""Solver backends: each turns a Formulation (and a warm start) into per-device pass orders."""

from __future__ import annotations

from dataclasses import dataclass


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
