"""solve(): the public optimizer API."""

from __future__ import annotations

import importlib
import json
import os
import signal
import threading
from pathlib import Path

import pytest

from zbsolve import (
    UNIT,
    InfeasibleError,
    InputError,
    Profile,
    SolveResult,
    simulate,
    solve,
)
from zbsolve.backends import BackendResult
from zbsolve.document import from_document
from zbsolve.heuristic import heuristic
from zbsolve.placement import sequential
from zbsolve.problem import Problem
from zbsolve.schedule import build

solve_module = importlib.import_module("zbsolve.solve")
ICLR = Path(__file__).resolve().parent.parent / "problems" / "iclr"
SLOW_LAST = Profile(t_f=[1.0, 1.0, 1.0, 1.4], t_b=[1.0, 1.0, 1.0, 1.4], t_w=[1.0, 1.0, 1.0, 1.4], t_comm=0.1)
UNEVEN = Profile(t_f=[1.0, 1.5, 1.2], t_b=[1.1, 2.0, 1.3], t_w=[0.6, 1.0, 0.9], t_comm=0.2,
                 mem_f=[1.0, 1.0, 2.0], mem_b=[-0.5, -0.25, -1.0], mem_w=[-0.5, -0.75, -1.0])


def _check(result: SolveResult, limit: float | None = None) -> None:
    """The result's schedule re-simulates to the result's own figures."""
    timeline = simulate(result.schedule)
    assert timeline.end == result.timeline.end
    assert result.objective == max(timeline.span) or result.objective == timeline.makespan
    assert result.paper_bubble == timeline.paper_bubble and result.peak_memory == timeline.peak_memory
    assert result.lower_bound <= result.objective + 1e-9
    assert result.gap == pytest.approx((result.objective - result.lower_bound) / result.objective)
    assert result.status in ("optimal", "feasible", "heuristic")
    if limit is not None:
        assert max(timeline.peak_memory) <= limit + 1e-9


def test_solve_small_unit_problem_is_proven_optimal():
    result = solve(UNIT, 4, num_microbatches=8, num_devices=4, time_limit=20, workers=1)
    _check(result, 4)
    assert result.status == "optimal" and result.gap == 0
    assert result.objective == 3 * 8 + (4 - 1) * (1 + 1 - 1)


@pytest.mark.parametrize("p, m, limit", [(2, 2, 1.5), (2, 4, 2.0), (3, 3, 2.5), (3, 4, 3.0), (3, 4, None), (4, 8, 4.0)])
def test_cpsat_and_cbc_agree(p, m, limit):
    profile = UNEVEN if p == 3 else SLOW_LAST if p == 4 else Profile(t_f=[1.0, 1.5], t_b=[2.0, 1.0], t_comm=0.5)
    limits = None if limit is None else [limit * profile.stage_value("mem_f", d) for d in range(p)]
    cpsat = solve(profile, limits, num_microbatches=m, time_limit=30, workers=1)
    cbc = solve(profile, limits, num_microbatches=m, solver="cbc", time_limit=30, workers=1)
    for result in (cpsat, cbc):
        _check(result)
        assert result.status == "optimal"
    assert cpsat.objective == pytest.approx(cbc.objective)


def test_never_worse_than_the_heuristic():
    profile = Problem.load(ICLR / "1.5b-p8-m24.yaml").profile
    limit = 1.5 * 4 * profile.mem_f
    result = solve(profile, limit, num_microbatches=12, num_devices=4, time_limit=2, workers=1)
    _check(result, limit)
    warm = simulate(heuristic(profile, sequential(4), 12, limit))
    assert result.objective <= max(warm.span)


def test_makespan_objective():
    span = solve(UNEVEN, None, num_microbatches=4, time_limit=20, workers=1)
    makespan = solve(UNEVEN, None, num_microbatches=4, time_limit=20, workers=1, objective="makespan")
    _check(makespan)
    assert makespan.objective == makespan.timeline.makespan <= span.timeline.makespan
    assert makespan.status == "optimal"


def test_heterogeneous_stages_beat_planning_with_the_median():
    p, m, limit = 4, 8, 4.0
    median = Profile(t_f=1.0, t_b=1.0, t_w=1.0, t_comm=0.1)
    planned = solve(median, limit, num_microbatches=m, num_devices=p, time_limit=20, workers=1)
    retimed = simulate(build("median", planned.schedule.placement, m, SLOW_LAST, planned.schedule.devices, limit))
    result = solve(SLOW_LAST, limit, num_microbatches=m, time_limit=20, workers=1)
    _check(result, limit)
    assert result.objective < max(retimed.span)
    assert result.paper_bubble < retimed.paper_bubble


@pytest.mark.parametrize("name", ["1.5b-p8-m24", "6.2b-p8-m64", "14.6b-p16-m48"])
def test_published_zb_1p_is_proven_optimal(name):
    problem = Problem.load(ICLR / f"{name}.yaml")
    p = problem.num_devices
    result = solve(problem.profile, p * problem.profile.mem_f, num_microbatches=problem.num_microbatches,
                   num_devices=p, time_limit=60, workers=1)
    _check(result)
    assert result.status == "optimal" and result.gap == 0
    assert round(result.paper_bubble, 4) == problem.published["zb-1p"]


def test_per_device_limits_and_heuristic_solver():
    limits = [3.0, 2.5, 2.0]
    result = solve(UNIT, limits, num_microbatches=6, num_devices=3, solver="heuristic")
    _check(result)
    assert all(peak <= limit for peak, limit in zip(result.peak_memory, limits))
    assert result.status in ("heuristic", "optimal") and result.solver == "heuristic"


def test_to_json_and_summary(tmp_path):
    result = solve(UNIT, 3, num_microbatches=6, num_devices=3, time_limit=10, workers=1)
    path = tmp_path / "schedule.json"
    doc = result.to_json(path)
    assert json.loads(path.read_text()) == doc
    assert doc["solver"]["status"] == result.status and doc["solver"]["lower_bound"] == result.lower_bound
    schedule, _ = from_document(doc)
    assert simulate(schedule).makespan == result.timeline.makespan
    summary = result.summary()
    assert summary["paper_bubble"] == result.paper_bubble and summary["gap"] == result.gap
    assert "<table>" in result._repr_html_() and "paper_bubble" in result._repr_html_()
    assert result.__rich__().row_count == len(summary)


@pytest.mark.parametrize("kwargs, field", [
    ({"time_limit": 0}, "time_limit"), ({"time_limit": -1.0}, "time_limit"), ({"time_limit": float("nan")}, "time_limit"),
    ({"solver": "gurobi"}, "solver"), ({"placement": "bidirectional"}, "placement"), ({"placement": "zigzag"}, "placement"),
    ({"objective": "area"}, "objective"), ({"workers": 0}, "workers"), ({"num_microbatches": 0}, "num_microbatches"),
    ({"num_devices": None}, "num_devices"), ({"mem_limit": "lots"}, "mem_limit"),
])
def test_bad_input_names_the_field(kwargs, field):
    args = {"mem_limit": 4.0, "num_microbatches": 4, "num_devices": 2, **kwargs}
    mem_limit = args.pop("mem_limit")
    with pytest.raises(InputError, match=field):
        solve(UNIT, mem_limit, **args)


def test_limit_below_any_schedule_states_the_smallest_feasible_limit():
    with pytest.raises(InfeasibleError) as info:
        solve(UNIT, 0.5, num_microbatches=4, num_devices=2)
    assert info.value.min_feasible is not None and info.value.min_feasible > 0.5
    _check(solve(UNIT, info.value.min_feasible, num_microbatches=4, num_devices=2, time_limit=10, workers=1))


def test_ctrl_c_returns_the_best_schedule_so_far(monkeypatch):
    problem = Problem.load(ICLR / "1.5b-p8-m32.yaml")
    p = problem.num_devices
    run_backend = solve_module._run_backend
    timers = []

    def interrupt_soon(*args, **kwargs):
        timers.append(threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)))
        timers[-1].start()
        return run_backend(*args, **kwargs)

    monkeypatch.setattr(solve_module, "_run_backend", interrupt_soon)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # a runner started in the background ignores it
    try:
        result = solve(problem.profile, 2 * p * problem.profile.mem_f, num_microbatches=problem.num_microbatches,
                       num_devices=p, time_limit=60, workers=1)
    finally:
        signal.signal(signal.SIGINT, previous)
    _check(result)
    assert timers and "interrupted" in result.solver_log
    assert result.status in ("feasible", "heuristic")


@pytest.mark.parametrize("found", ["worse", "nothing"])
def test_a_worse_or_failed_solver_falls_back_to_the_warm_start(monkeypatch, found):
    def bad_backend(solver, form, order, *args):
        serial = [sorted(ps, key=lambda i: (form.passes[i].mb, "FBW".index(form.passes[i].kind)))
                  for ps in form.device_passes()]
        return BackendResult(serial if found == "worse" else None, False, None, "stub")

    monkeypatch.setattr(solve_module, "_run_backend", bad_backend)
    problem = Problem.load(ICLR / "1.5b-p8-m32.yaml")
    p, m, limit = problem.num_devices, problem.num_microbatches, 2 * problem.num_devices * problem.profile.mem_f
    result = solve(problem.profile, limit, num_microbatches=m, num_devices=p, time_limit=5, workers=1)
    _check(result, limit)
    warm = simulate(heuristic(problem.profile.expand(p), sequential(p), m, limit))
    assert result.status == "heuristic" and result.objective <= max(warm.span)
    assert result.gap > 0 and "stub" in result.solver_log


@pytest.mark.parametrize("solver", ["cpsat", "cbc"])
def test_progress_hears_every_log_line_as_it_comes(solver):
    lines: list[str] = []
    result = solve(UNEVEN, [2.0, 2.0, 4.0], num_microbatches=4, solver=solver, time_limit=20, workers=1,
                   progress=lines.append)
    _check(result)
    assert "\n".join(lines) == result.solver_log
    assert lines[0].startswith("heuristic") and (solver in lines[-1] or "lns" in lines[-1] or "whole" in lines[-1])
