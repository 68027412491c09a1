"""Solver backends: each turns a Formulation (and a warm start) into per-device pass orders."""

from __future__ import annotations

from zbsolve.optimize.backends.cbc import solve_cbc
from zbsolve.optimize.backends.cpsat import solve_cpsat
from zbsolve.optimize.backends.protocol import Backend, BackendResult, Log

__all__ = ["BACKENDS", "Backend", "BackendResult", "Log"]

BACKENDS: dict[str, Backend] = {"cpsat": solve_cpsat, "cbc": solve_cbc}
"""Every backend by the name ``solve(solver=...)`` takes."""
