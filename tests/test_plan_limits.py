"""A plan's phases within its time limit: the baselines timed until their deadline (the rest saying so), a split
bound not back in the search's time left unknown, ``base.interrupt.deadline`` itself, and the search's candidates
started only where they end in its time."""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time
from pathlib import Path

import pytest

from conftest import heavy_head
from zbsolve.base.interrupt import Deadline, deadline
from zbsolve.base.units import GIB
from zbsolve.planning.baselines import NOT_TIMED, SPLIT_ROWS, baseline_rows, timed_baselines
from zbsolve.planning.runs import BaselineSetting
from zbsolve.planning.planner import plan
from zbsolve.planning import search as search_module
from zbsolve.planning.split_bound import split_bound
from zbsolve.problem.request import Request
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


def _search(executor: cf.Executor, parallel: int) -> search_module.Search:
    request = Request(num_microbatches=8, num_devices=4, device_memory=16 * GIB, reserve=0)
    return search_module.Search(heavy_head(), request, time.monotonic() + 600.0, executor, parallel, [], None)


def _jobs(n: int) -> list[tuple]:
    """``n`` sequential partitions of ``heavy_head``'s 15 layers into 4 stages."""
    splits = [(4, 4, 4, 3), (3, 4, 4, 4), (4, 3, 4, 4), (4, 4, 3, 4)]
    return [("sequential", 1, "none", counts, "test") for counts in splits[:n]]


def test_the_search_times_its_first_candidate_alone_and_measures_finishing(monkeypatch):
    """The first job starts alone, whatever the parallelism; its schedule's finishing is measured once (re-simulated
    under its budgets, with step times), and each job's time is the one it reports, not its wait."""
    submitted: list[int] = []
    search = _search(cf.ThreadPoolExecutor(2), 2)
    real = search_module.time_candidate

    def recorded(*args, **kwargs):
        submitted.append(len(search.timed))
        return real(*args, **kwargs)._replace(seconds=0.25)

    monkeypatch.setattr(search_module, "time_candidate", recorded)
    found = search.time_all(_jobs(2), time.monotonic() + 600.0)
    assert submitted == [0, 1] and len(found) == 2 and search.job_seconds == 0.25  # the second after the first
    candidate, timeline, times, seconds = search.finish
    kept = min(found, key=lambda c: c.step_time)
    assert candidate is found[0] and timeline.makespan == found[0].step_time and seconds > 0
    assert times.step_time == timeline.makespan and search.kept[0] is kept  # measured on the first, once


def test_no_candidate_starts_that_would_still_run_at_the_search_end(monkeypatch):
    """Once a job is known to take 100 s, none starts with 10 s left to the search's end, nor with the deadline less
    twice the finishing time too close; the search's first job starts whatever the time."""
    started: list[tuple] = []
    monkeypatch.setattr(search_module, "time_candidate",
                        lambda model, request, own, end: started.append(request.partition) or
                        search_module.Timed(1.0, seconds=100.0))
    search = _search(cf.ThreadPoolExecutor(1), 1)
    assert len(search.time_all(_jobs(1), time.monotonic() + 1.0)) == 1  # the first, alone, past its time
    assert search.time_all(_jobs(3)[1:], time.monotonic() + 10.0) == [] and len(started) == 1
    assert len(search.time_all(_jobs(3)[1:], time.monotonic() + 300.0)) == 2
    search.finish = (None, None, None, 260.0)  # finishing takes 260 s: twice that is kept before the deadline
    assert search.time_all(_jobs(4)[3:], time.monotonic() + 300.0) == []


def test_the_limit_counts_from_when_it_began(monkeypatch):
    """``began`` is when the limit started: the plan's seconds count from it, and ``zbsolve plan`` passes the
    process's start (``base.clock.started``), so that loading counts against the limit."""
    from typer.testing import CliRunner

    import zbsolve.planning.planner as planner
    from zbsolve.base import clock
    from zbsolve.app.cli import app

    earlier = time.monotonic() - 100.0
    result = plan(heavy_head(), num_devices=4, num_microbatches=8, device_memory="16GiB", reserve=0,
                  placement="sequential", time_limit=103, began=earlier)  # 3 s left
    assert result.plan_time >= 100.0
    heard = []

    def heard_began(model, **keywords):
        heard.append(keywords["began"])
        raise KeyboardInterrupt

    monkeypatch.setattr(clock, "started", earlier)
    monkeypatch.setattr(planner, "plan", heard_began)  # the command line looks it up when it plans
    model = Path(__file__).resolve().parent.parent / "problems" / "models" / "llama3-8b.yaml"
    run = CliRunner().invoke(app, ["plan", str(model), "--devices", "8", "--microbatches", "8"])
    assert heard == [earlier] and run.exit_code == 130, run.output
