"""A plan's phases within its time limit: the baselines timed until their deadline (the rest saying so), a split
bound not back in the search's time left unknown, and ``base.interrupt.deadline`` itself."""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time

import pytest

from test_planner import heavy_head
from zbsolve.base.interrupt import Deadline, deadline
from zbsolve.base.units import GIB
from zbsolve.planning.baselines import NOT_TIMED, SPLIT_ROWS, BaselineSetting, baseline_rows, timed_baselines
from zbsolve.planning.planner import plan
from zbsolve.planning.split_bound import split_bound
from zbsolve.schedulers.builtins import BUILTINS

SETTING = BaselineSetting(heavy_head(), 4, 8, 16 * GIB, 0)


def test_baselines_out_of_time_are_rows_saying_so():
    """Past the deadline no baseline is timed: each row is there, naming its split, schedule and recomputation as
    ``baseline_rows`` does, with no figure and the note; with time enough, the rows are ``baseline_rows``'s."""
    every = baseline_rows(SETTING)
    late = timed_baselines(SETTING, time.monotonic() - 1.0)
    assert all(b.note == NOT_TIMED and b.step_time is None and not b.fits for b in late)
    torch_rows = len(SPLIT_ROWS) * len(BUILTINS)
    assert [(b.split, b.schedule, b.recompute) for b in late[:torch_rows]] == \
        [(b.split, b.schedule, b.recompute) for b in every[:torch_rows]]
    assert timed_baselines(SETTING, time.monotonic() + 600.0) == every


def test_a_deadline_stops_the_block_in_the_main_thread_only():
    began = time.monotonic()
    with pytest.raises(Deadline):
        with deadline(began + 0.05):
            while True:
                sum(range(1000))
    assert time.monotonic() - began < 5.0
    finished = []

    def elsewhere() -> None:
        with deadline(time.monotonic() + 0.01):
            time.sleep(0.05)
        finished.append(True)

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    assert finished == [True]


class _NoBounds(cf.Executor):
    """Runs every job at once, but never a split bound (its future never completes)."""

    def submit(self, fn, /, *args, **kwargs) -> cf.Future:
        future: cf.Future = cf.Future()
        if fn is not split_bound:
            future.set_result(fn(*args, **kwargs))
        return future


def test_a_split_bound_not_back_in_the_search_time_leaves_the_bound_unknown():
    """The search waits for the split bounds no longer than its own time: the plan still times the baselines'
    splits and returns, its bound unknown (never zero)."""
    lines: list[str] = []
    result = plan(heavy_head(), num_devices=4, num_microbatches=8, device_memory="16GiB", reserve=0,
                  placement="sequential", time_limit=2, executor=_NoBounds(), progress=lines.append)
    assert result.lower_bound is None and result.gap is None
    assert any("split bound unknown" in line for line in lines)
    assert result.candidates and all(c.origin != "split bound" for c in result.candidates)
