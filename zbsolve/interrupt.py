"""CP-SAT solves that Ctrl-C stops without losing the best solution found so far."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from ortools.sat.python import cp_model


@dataclass(frozen=True)
class Outcome:
    """How an interruptible solve ended."""

    status: cp_model.CpSolverStatus
    """CP-SAT's status (UNKNOWN when the search never returned one)."""
    interrupted: bool
    """Whether Ctrl-C stopped the search."""


def run_interruptible(solver: cp_model.CpSolver, model: cp_model.CpModel) -> Outcome:
    """Solve in a worker thread; Ctrl-C in the main thread stops the search and keeps its best solution."""
    solver.parameters.catch_sigint_signal = False
    done = threading.Event()
    result: dict[str, cp_model.CpSolverStatus] = {}

    def work() -> None:
        try:
            result["status"] = solver.solve(model)
        finally:
            done.set()

    threading.Thread(target=work, daemon=True).start()
    interrupted = False
    while not done.is_set():
        try:
            done.wait(0.05)
        except KeyboardInterrupt:
            interrupted = True
            solver.stop_search()
    return Outcome(result.get("status", cp_model.UNKNOWN), interrupted)
