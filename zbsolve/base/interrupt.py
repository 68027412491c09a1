"""Interrupts: SIGINT and SIGTERM both stop long work as Ctrl-C does, and CP-SAT solves that an
interrupt stops without losing the best solution found so far.

Inside ``signals_as_interrupt()``, SIGTERM raises ``KeyboardInterrupt`` in the main thread as SIGINT
does, so one ``except KeyboardInterrupt`` keeps the finished results whichever signal came; inside
``deferred()`` both are only recorded, so that finished results are written whole. ``exit_code()`` then
says which came: 130 for SIGINT, 143 for SIGTERM. ``deadline()`` stops work that has run out of time alike.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
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
    from ortools.sat.python import cp_model

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


def solve_or_interrupt(model: cp_model.CpModel, time_limit: float, workers: int
                       ) -> tuple[cp_model.CpSolver, cp_model.CpSolverStatus]:
    """Solve ``model`` within ``time_limit`` seconds on ``workers`` threads (``run_interruptible``): the solver, to
    read its values and bound, and its status; ``KeyboardInterrupt`` once a Ctrl-C has stopped the search."""
    from ortools.sat.python import cp_model

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.01, time_limit)
    solver.parameters.num_workers = workers
    outcome = run_interruptible(solver, model)
    if outcome.interrupted:
        raise KeyboardInterrupt
    return solver, outcome.status


_received: list[int] = []
"""The signals received inside ``signals_as_interrupt``, in order."""


def _interrupt(signum: int, _frame: object) -> None:
    _received.append(signum)
    raise KeyboardInterrupt


@contextmanager
def signals_as_interrupt() -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM raise ``KeyboardInterrupt`` (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _received.clear()
    previous = {s: signal.signal(s, _interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@contextmanager
def deferred() -> Iterator[list[int]]:
    """Within the block, SIGINT and SIGTERM raise nothing, so that what it writes is written whole: the yielded
    list holds the signals that came (``exit_code`` says which). Main thread only; elsewhere a no-op."""
    came: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield came
        return

    def record(signum: int, _frame: object) -> None:
        came.append(signum)
        _received.append(signum)

    previous = {s: signal.signal(s, record) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield came
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def exit_code() -> int:
    """The shell's exit code for the last interrupt: 143 after SIGTERM, else 130 (SIGINT)."""
    return 128 + (_received[-1] if _received else signal.SIGINT)


class Deadline(Exception):
    """The time ``deadline`` was given has run out."""


@contextmanager
def deadline(until: float) -> Iterator[None]:
    """Raise ``Deadline`` inside the block once ``time.monotonic()`` reaches ``until`` (by SIGALRM, so in the main
    thread only: elsewhere the block runs to its end). Import what the block needs before it: a module stopped
    halfway through its import stays broken."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def ring(signum: int, frame: object) -> None:
        raise Deadline

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, max(1e-6, until - time.monotonic()))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)

