"""Time limits that hold and interrupts that keep results.

The one wall-clock assertion is the contract itself: a solve returns within its time limit plus
max(2 s, 5%), on problems big enough that their warm starts and bounds alone overran it before every phase
drew on one deadline. The interrupt tests run ``zbsolve`` as a user does, in a subprocess; a small wrapper
prints a line when a phase begins (and changes nothing else), and the signal is sent just after it, so each
test knows which phase it interrupted and asserts it from the solver log.
"""

from __future__ import annotations

import itertools
import json
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import ROOT, check_result
from conftest import zbsolve as in_process

from zbsolve import UNIT, solve
from zbsolve.base.errors import InputError
from zbsolve.core.spec import make_spec
from zbsolve.optimize import warm_start
from zbsolve.optimize.solve import solve_request
from zbsolve.problem.request import Request
from zbsolve.schedulers.families import PLACEMENT_FAMILIES, make_schedule
from zbsolve.problem.memory_factor import reference_peak
from zbsolve.core.simulator import simulate

SLACK = 2.0, 0.05
"""The contract: a solve returns within time_limit + max(2 s, 5% of it), or, where building the first schedule and
the families (built whatever the limit) ends past the limit, within their time, the time kept for the step times and
the document, and that margin."""
WRAPPER = textwrap.dedent('''
    """zbsolve's command line, printing "phase NAME" on stderr when 1F1B's peak (for a memory factor), the
    heuristic, the backend, the result's step times, the writing of its document or a frontier solve's completion
    begins; 1F1B's peak then waits half a second, so that a signal sent just after its line comes while the memory
    limit is resolved, before the solve has any schedule."""
    import importlib
    import sys
    import time

    from zbsolve.app.cli import app

    solve_module, warm_module, result_module, frontier_module, limits_module = (
        importlib.import_module(f"zbsolve.{name}") for name in ("optimize.solve", "optimize.warm_start", "optimize.result",
                                                               "optimize.frontier", "problem.memory_factor"))


    def announce(name, fn, pause=0.0):
        def wrapped(*args, **kwargs):
            sys.stderr.write(f"phase {name}\\n")  # one write: a worker thread's line never splits it
            sys.stderr.flush()
            time.sleep(pause)
            return fn(*args, **kwargs)
        return wrapped


    def counted(*args, progress, frontier=frontier_module.frontier, **kwargs):
        return frontier(*args, progress=lambda done, total: announce(f"{done} solved", progress)(done, total), **kwargs)


    if __name__ == "__main__":  # the frontier's workers import this file again
        warm_module.heuristic = announce("warm start", warm_module.heuristic)
        solve_module._run_backend = announce("search", solve_module._run_backend)
        solve_module.step_times = announce("step times", solve_module.step_times)
        limits_module.reference_peak = announce("limit", limits_module.reference_peak, pause=0.5)
        result_module.SolveResult.to_json = announce("document", result_module.SolveResult.to_json)
        frontier_module.frontier = counted
        app(sys.argv[1:], prog_name="zbsolve")
''')


def within_budget(seconds: float, time_limit: float, log: str = "") -> bool:
    """Whether ``seconds`` keeps the contract of ``time_limit`` (and of the first schedule, by the solver ``log``'s
    line)."""
    first = re.search(r"^first schedule: \S+, built in ([0-9.]+)s; ([0-9.]+)s kept", log, re.MULTILINE)
    families = re.search(r"^families: built in ([0-9.]+)s", log, re.MULTILINE)
    least = (float(first[1]) + float(first[2]) if first else 0.0) + (float(families[1]) if families else 0.0)
    return seconds <= max(time_limit, least) + max(SLACK[0], SLACK[1] * time_limit)


@pytest.mark.parametrize("placement, p, m, factor", [("sequential", 64, 512, 1.0), ("vshape", 32, 256, 0.5)])
def test_solve_returns_within_its_time_limit(placement, p, m, factor):
    """Big enough that the warm starts and the bounds alone took 7 to 9 s before every phase drew on the deadline.
    ``check_result`` asserts the result is no worse than the first family that fits (at 0.5 x 1F1B's memory on
    the V-shape, V-Min: 829.5, where the heuristic gives 1057.5 and one microbatch at a time 16640)."""
    limit = factor * reference_peak(UNIT, p, m)
    began = time.monotonic()
    result = solve(UNIT, limit, num_microbatches=m, num_devices=p, placement=placement, time_limit=3, workers=1)
    wall = time.monotonic() - began
    assert within_budget(wall, 3, result.solver_log) and within_budget(result.solve_time, 3, result.solver_log), \
        result.solver_log
    check_result(result, limit)
    assert not result.interrupted


@pytest.mark.parametrize("placement, factor, first", [
    ("vshape", 0.5, "one-at-a-time"), ("vshape", 1.0, "zb-v"), ("sequential", 0.5, "one-at-a-time"),
    ("sequential", 2.0, "zb-h1"), ("interleaved", 2.0, "1f1b-i")])
def test_no_time_limit_gives_the_first_schedule_and_every_family_that_fits(placement, factor, first):
    """However short the limit (or busy the machine), the first schedule is built (the placement's first cheap
    family that fits, else one microbatch at a time), then every family of the placement that fits, before any
    look at the clock: the result is no worse than any of them; every later phase is skipped, each saying so."""
    p, m = 16, 64
    limit = factor * reference_peak(UNIT, p, m)
    result = solve(UNIT, limit, num_microbatches=m, num_devices=p, placement=placement, time_limit=1e-6, workers=1)
    check_result(result, limit)
    assert f"\nfirst schedule: {first}, built in " in "\n" + result.solver_log
    assert "skipped, it needs" in result.solver_log
    for name in PLACEMENT_FAMILIES[placement]:
        family = simulate(make_schedule(name, UNIT, p, m))
        if max(family.peak_memory) <= limit:
            assert result.objective <= family.objective("makespan"), (name, result.solver_log)


@pytest.mark.parametrize("placement, factor, floor", [("vshape", 0.5, "v-min"), ("vshape", 0.6, "v-half"),
                                                      ("vshape", 1.0, "zb-v"), ("sequential", 1.0, "zb-h1"),
                                                      ("sequential", 2.0, "zb-h2")])
def test_the_floor_is_the_first_family_that_fits(placement, factor, floor):
    """Time allowing, the floor is built after the first schedule: the family named, the first of the placement's
    that fits, or a better schedule; the families before it are each found over the limit once."""
    p, m = 16, 64
    limit = factor * reference_peak(UNIT, p, m)
    result = solve(UNIT, limit, num_microbatches=m, num_devices=p, placement=placement, solver="heuristic",
                   time_limit=60, workers=1)
    check_result(result, limit)
    over = PLACEMENT_FAMILIES[placement][:PLACEMENT_FAMILIES[placement].index(floor)]
    assert [line for line in result.solver_log.splitlines() if line.endswith("over the memory limit")] == \
        [f"{name}: over the memory limit" for name in over]
    assert f"\n{floor}: objective " in "\n" + result.solver_log
    assert result.objective <= simulate(make_schedule(floor, UNIT, p, m)).objective("makespan")


def test_repr_is_one_line_and_summary_has_the_figures():
    result = solve(UNIT, 4, num_microbatches=8, num_devices=4, solver="heuristic")
    assert repr(result) == (f"SolveResult(status='optimal', objective={result.objective:.6g}, gap=0, "
                            "solver='heuristic', interrupted=False)")
    assert {"paper_bubble", "peak_memory", "lower_bound", "interrupted"} <= set(result.summary())
    assert result.to_json()["solver"]["interrupted"] is False


def interrupt_at(tmp_path: Path, phase: str, sig: int, *args: object) -> tuple[int, str]:
    """Run ``zbsolve ARGS`` through the wrapper, send ``sig`` just after ``phase`` begins; (exit code, stderr)."""
    wrapper = tmp_path / "wrapper.py"
    wrapper.write_text(WRAPPER)
    process = subprocess.Popen([sys.executable, str(wrapper), *map(str, args)], cwd=ROOT, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    seen = []
    for line in process.stderr:
        seen.append(line)
        if line.strip() == f"phase {phase}":
            time.sleep(0.1)
            process.send_signal(sig)
            break
    out, rest = process.communicate(timeout=120)
    return process.returncode, "".join(seen) + rest


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("phase, problem, args", [
    ("warm start", "unit-p64-m512", ("--mem-factor", 1)),
    ("search", "problems/iclr/1.5b-p8-m32.yaml", ("--mem-factor", 2, "--chart", "out.svg")),
])
def test_interrupted_solve_writes_the_best_schedule_and_says_so(tmp_path, sig, phase, problem, args):
    """The heuristic of 98,304 passes takes seconds, the search of 1.5b-p8-m32 at twice 1F1B's memory minutes."""
    if problem.startswith("unit"):
        problem = tmp_path / "unit.yaml"
        problem.write_text("num_devices: 64\nnum_microbatches: 512\n")
    out = tmp_path / "out.json"
    args = tuple(tmp_path / arg if str(arg).endswith(".svg") else arg for arg in args)
    code, stderr = interrupt_at(tmp_path, phase, sig, "solve", problem, *args, "--time-limit", 300, "--workers", 1,
                                "--objective", "span", "-o", out)
    assert code == 128 + sig, stderr
    assert "interrupted: the best schedule found so far is in" in stderr
    solver = json.loads(out.read_text())["solver"]
    assert solver["interrupted"] is True and solver["status"] in ("heuristic", "feasible")
    searched = any(line in solver["log"] for line in ("warm start objective", "interrupted before the solver returned"))
    assert searched == (phase == "search"), solver["log"]
    if "--chart" in args:
        assert (tmp_path / "out.svg").read_text().startswith("<?xml")
    check = in_process("check", out, "-q")
    assert check.exit_code == 0, check.stderr


@pytest.mark.parametrize("phase", ["step times", "document"])
def test_an_interrupt_after_the_search_still_writes_the_schedule(tmp_path, phase):
    """The search is over, its figures or its document are under way: the document is written whole all the same.
    The floor, ZB-H2, is optimal on the span and is not the first schedule, whose step times are made before it."""
    problem, out = tmp_path / "unit.yaml", tmp_path / "out.json"
    problem.write_text("num_devices: 64\nnum_microbatches: 512\n")
    code, stderr = interrupt_at(tmp_path, phase, signal.SIGINT, "solve", problem, "--time-limit", 300, "--objective",
                                "span", "-q", "-o", out)
    assert code == 130, stderr
    assert f"interrupted: the best schedule found so far is in {out}" in stderr
    check = in_process("check", out, "-q")
    assert check.exit_code == 0, check.stderr


def test_a_signal_before_the_first_schedule_exists_stops_the_solve_once_it_does(tmp_path):
    """The signal comes as the memory factor's limit is resolved (1F1B's peak), before any schedule of the solve
    exists: the solve builds its first schedule, writes it and says it was interrupted."""
    problem, out = tmp_path / "unit.yaml", tmp_path / "out.json"
    problem.write_text("num_devices: 8\nnum_microbatches: 32\nmem_factor: 1\n")
    code, stderr = interrupt_at(tmp_path, "limit", signal.SIGINT, "solve", problem, "-o", out)
    assert code == 130, stderr
    assert stderr.strip().splitlines()[-1] == f"interrupted: the best schedule found so far is in {out}"
    check = in_process("check", out, "-q")
    assert check.exit_code == 0, check.stderr


def test_interrupted_frontier_keeps_the_finished_solves(tmp_path):
    """Two solves in one process: the first proves optimality at once, the second searches until the signal."""
    out, chart = tmp_path / "f.json", tmp_path / "f.png"
    code, stderr = interrupt_at(tmp_path, "1 solved", signal.SIGTERM, "frontier", "problems/iclr/1.5b-p8-m32.yaml",
                                "--factors", "1,2", "--placements", "sequential", "--time-limit", 300, "--jobs", 1,
                                "-o", out, "--chart", chart)
    assert code == 143, stderr
    doc = json.loads(out.read_text())
    assert doc["interrupted"] is True
    assert [r["status"] for r in doc["rows"]] == ["optimal", "carried"]
    assert chart.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("command", ["solve", "frontier"])
@pytest.mark.parametrize("flag, make, needle", [
    ("-o", lambda tmp: tmp, "is a directory"),
    ("-o", lambda tmp: tmp / "missing" / "out.json", "does not exist"),
    ("--chart", lambda tmp: tmp / "missing" / "out.png", "does not exist"),
    ("--chart", lambda tmp: tmp / "out.txt", "is not one of"),
])
def test_unwritable_outputs_fail_before_any_work(tmp_path, monkeypatch, command, flag, make, needle):
    """The output is checked before the problem is loaded or any solve begins: both fail the test if reached."""
    import zbsolve.app.cli.solve as solve_command
    import zbsolve.optimize.frontier as frontier_module

    def work(*args, **kwargs):
        raise AssertionError("the work began before the output was checked")

    monkeypatch.setattr(solve_command, "_load", work)
    monkeypatch.setattr(frontier_module, "frontier", work)
    problem = tmp_path / "unit.yaml"
    problem.write_text("num_devices: 64\nnum_microbatches: 512\n")
    run = in_process(command, problem, "--time-limit", 600, flag, make(tmp_path))
    assert run.exit_code == 2 and needle in run.stderr, (run.stderr, run.exception)


def test_a_time_limit_the_first_schedule_cannot_keep_is_refused_naming_the_least_that_could(monkeypatch):
    """A clock that advances 1 s at each reading: the first schedule on 2 of 8 devices and 4 of 16 microbatches, its
    step times and its document (counted twice: made to measure, then written) take 5 s, so 80 s at full size."""
    readings = itertools.count()
    monkeypatch.setattr(warm_start.time, "process_time", lambda: float(next(readings)))
    spec = make_spec(UNIT, None, num_microbatches=16, num_devices=8)
    with pytest.raises(InputError, match=r"^time_limit = 60 is too short") as refused:
        warm_start.check_time(spec, 60.0, time.monotonic())
    least = int(re.search(r"give a time limit of at least (\d+)s", str(refused.value))[1])
    assert 80 / 1.05 <= least <= 81 / 1.05 + 1
    warm_start.check_time(spec, least + 1.0, time.monotonic())
    small = make_spec(UNIT, None, num_microbatches=16, num_devices=warm_start.SAMPLE - 1)
    warm_start.check_time(small, 1e-6, time.monotonic())  # too small to time: never refused
    with pytest.raises(InputError, match=r"^time_limit = 60 is too short"):
        solve(UNIT, None, num_microbatches=16, num_devices=8, time_limit=60, solver="heuristic")
    request = Request(num_microbatches=16, num_devices=8, time_limit=60, solver="heuristic")
    assert solve_request(UNIT, request).schedule  # a planner's or a frontier's solve takes the time it is given
