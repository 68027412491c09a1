"""Interrupts of a solve at each line of its log, raised where the test chooses (a progress callback that raises
``KeyboardInterrupt`` at the n-th line), never by a signal sent after a delay: before the first schedule exists the
interrupt propagates; from then on the solve returns the best schedule so far, interrupted, and its document is
valid. The first schedule is the placement's cheapest family that fits (or one microbatch at a time), so an
interrupt finds one as soon as it can exist; a signal while it is built stops the solve once it exists."""

from __future__ import annotations

import os
import re
import signal

import pytest
from conftest import check_result

from zbsolve import UNIT, solve
from zbsolve.core.simulator import simulate
from zbsolve.io.document import read_document
from zbsolve.optimize import warm_start
from zbsolve.optimize.warm_start import FIRST, ONE_AT_A_TIME
from zbsolve.problem.memory_factor import reference_peak


def untimed(log: str) -> list[str]:
    """The lines of a solver log, their figures in seconds left out."""
    return [re.sub(r"[0-9.]+s\b", "_s", line) for line in log.splitlines()]


def interrupt_at(n: int) -> callable:
    """A progress callback that raises ``KeyboardInterrupt`` at the ``n``-th log line."""
    heard: list[str] = []

    def hear(line: str) -> None:
        heard.append(line)
        if len(heard) == n:
            raise KeyboardInterrupt
    return hear


@pytest.mark.parametrize("placement, factor", [("sequential", 0.5), ("sequential", 2.0), ("vshape", 0.5),
                                               ("vshape", 1.0)])
def test_an_interrupt_at_any_line_once_the_first_schedule_exists_returns_a_valid_document(tmp_path, placement,
                                                                                           factor):
    p, m = 4, 12
    limit = factor * reference_peak(UNIT, p, m)
    kwargs = dict(num_microbatches=m, num_devices=p, placement=placement, solver="heuristic", time_limit=60, workers=1)
    lines = untimed(solve(UNIT, limit, **kwargs).solver_log)
    first = next(i for i, line in enumerate(lines) if ": objective " in line)
    assert lines[first].split(":")[0] in (*FIRST[placement], ONE_AT_A_TIME)
    for n in range(1, len(lines) + 1):
        if n <= first:  # family n did not fit: no schedule yet
            with pytest.raises(KeyboardInterrupt):
                solve(UNIT, limit, **kwargs, progress=interrupt_at(n))
            continue
        result = solve(UNIT, limit, **kwargs, progress=interrupt_at(n))
        assert result.interrupted and untimed(result.solver_log)[:n] == lines[:n]
        check_result(result, limit)
        result.to_json(tmp_path / "out.json")
        schedule, _ = read_document(tmp_path / "out.json")
        assert simulate(schedule).end == result.timeline.end


def test_a_signal_while_the_first_schedule_is_built_stops_the_solve_once_it_exists(monkeypatch):
    """SIGINT comes as the first family is built: the solve builds it whole, then returns it, interrupted."""
    build = warm_start.make_schedule

    def signalled(*args):
        os.kill(os.getpid(), signal.SIGINT)
        return build(*args)

    monkeypatch.setattr(warm_start, "make_schedule", signalled)
    result = solve(UNIT, None, num_microbatches=8, num_devices=4, time_limit=60, workers=1)
    assert result.interrupted and result.schedule.name == FIRST["sequential"][0]
    assert result.solver_log.splitlines()[-1] == "interrupted: returning the best schedule found so far"
    check_result(result)
