"""solve(): the public optimizer API.

No assertion here depends on how fast this machine searches: a result is checked for what holds whatever the
time limit (valid, within the limit, never worse than the warm start, its bound valid for other schedules);
"optimal" is asserted only where the warm start meets the lower bound, which solve proves without searching.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import threading

import pytest

from conftest import ROOT, check_result, heuristic_objective, problem, serial_order
from zbsolve import (
    UNIT,
    InfeasibleError,
    InputError,
    Profile,
    simulate,
    solve,
)
from zbsolve.optimize.backends import BackendResult
from zbsolve.io.document import from_document
from zbsolve.schedulers.families import PLACEMENT_FAMILIES, make_schedule
from zbsolve.core.memory import peak
from zbsolve.core.schedule import build
from zbsolve.present.forms import solve_figures

solve_module = importlib.import_module("zbsolve.optimize.solve")
from zbsolve.optimize.warm_start import FIRST, ONE_AT_A_TIME  # noqa: E402
SLOW_LAST = Profile(t_f=[1.0, 1.0, 1.0, 1.4], t_b=[1.0, 1.0, 1.0, 1.4], t_w=[1.0, 1.0, 1.0, 1.4], t_comm=0.1)
UNEVEN = Profile(t_f=[1.0, 1.5, 1.2], t_b=[1.1, 2.0, 1.3], t_w=[0.6, 1.0, 0.9], t_comm=0.2,
                 mem_f=[1.0, 1.0, 2.0], mem_b=[-0.5, -0.25, -1.0], mem_w=[-0.5, -0.75, -1.0])


@pytest.mark.parametrize("solver", ["heuristic", "cpsat"])
def test_small_unit_problem_is_proven_optimal_by_its_bound(solver):
    """ZB-H1's bubble meets the lower bound at 1F1B's memory: optimal with no search (solver "heuristic")."""
    result = solve(UNIT, 4, num_microbatches=8, num_devices=4, solver=solver, time_limit=5, workers=1)
    check_result(result, 4)
    assert result.status == "optimal" and result.gap == 0 and result.lower_bound == result.objective
    assert result.objective == 3 * 8 + (4 - 1) * (1 + 1 - 1)


@pytest.mark.parametrize("p, m, limit", [(2, 2, 1.5), (2, 4, 2.0), (3, 3, 2.5), (3, 4, 3.0), (3, 4, None), (4, 8, 4.0)])
def test_cpsat_and_cbc_agree(p, m, limit):
    """Each backend's proven bound holds for the other's schedule: when both prove optimality they agree."""
    profile = UNEVEN if p == 3 else SLOW_LAST if p == 4 else Profile(t_f=[1.0, 1.5], t_b=[2.0, 1.0], t_comm=0.5)
    limits = None if limit is None else [limit * profile.stage_value("mem_f", d) for d in range(p)]
    cpsat = solve(profile, limits, num_microbatches=m, time_limit=10, workers=1)
    cbc = solve(profile, limits, num_microbatches=m, solver="cbc", time_limit=10, workers=1)
    for result in (cpsat, cbc):
        check_result(result, limits)
    assert cpsat.lower_bound <= cbc.objective * (1 + 1e-9) and cbc.lower_bound <= cpsat.objective * (1 + 1e-9)
    if cpsat.status == cbc.status == "optimal":
        assert cpsat.objective == pytest.approx(cbc.objective)


def test_never_worse_than_the_heuristic():
    profile = problem("iclr/1.5b-p8-m24").profile
    limit = 1.5 * 4 * profile.mem_f
    result = solve(profile, limit, num_microbatches=12, num_devices=4, time_limit=2, workers=1)
    check_result(result, limit)
    assert result.objective <= heuristic_objective(result)


def test_makespan_objective():
    """The makespan objective: the warm start meets the bound on the makespan here (optimal without search),
    so no schedule, the span solve's included, has a shorter makespan."""
    span = solve(UNEVEN, None, num_microbatches=4, time_limit=5, workers=1, objective="span")
    makespan = solve(UNEVEN, None, num_microbatches=4, time_limit=5, workers=1, objective="makespan")
    check_result(span)
    check_result(makespan)
    assert makespan.objective_kind == "makespan" and makespan.objective == makespan.timeline.makespan
    assert makespan.lower_bound <= span.timeline.makespan
    assert solve(UNEVEN, None, num_microbatches=4, objective="makespan", solver="heuristic").status == "optimal"
    assert makespan.status == "optimal"
    assert makespan.objective <= span.timeline.makespan
    assert makespan.objective == pytest.approx(19.2) and span.objective == pytest.approx(18.0)


def test_heterogeneous_stages_beat_planning_with_the_median():
    """The best plan for the median stage (proven by its bound), run on the real stages, loses to the
    heuristic that plans with the real stages, and so to any solve."""
    p, m, limit = 4, 8, 4.0
    median = Profile(t_f=1.0, t_b=1.0, t_w=1.0, t_comm=0.1)
    planned = solve(median, limit, num_microbatches=m, num_devices=p, solver="heuristic")
    assert planned.status == "optimal"
    retimed = simulate(build("median", planned.schedule.placement, m, SLOW_LAST, planned.schedule.devices, limit))
    result = solve(SLOW_LAST, limit, num_microbatches=m, time_limit=5, workers=1, objective="span")
    check_result(result, limit)
    assert result.objective < max(retimed.span)
    assert result.paper_bubble < retimed.paper_bubble


@pytest.mark.parametrize("name", ["1.5b-p8-m24", "6.2b-p8-m64", "14.6b-p16-m48"])
def test_published_zb_1p_is_proven_optimal(name):
    """At 1F1B's memory the heuristic meets the lower bound: solve proves it optimal without searching, and
    its bubble is the published ZB-1p figure."""
    prob = problem(f"iclr/{name}")
    p = prob.num_devices
    result = solve(prob.profile, p * prob.profile.mem_f, num_microbatches=prob.num_microbatches,
                   num_devices=p, solver="heuristic")
    check_result(result, p * prob.profile.mem_f)
    assert result.status == "optimal" and result.gap == 0
    assert round(result.paper_bubble, 4) == prob.published["zb-1p"]


def test_per_device_limits_and_heuristic_solver():
    """Unit times, p = 3, m = 6, no communication: the last device gets its first F at 1 + 1 = 2 and holds
    3 x 6 = 18 units of work, so no schedule's makespan is below 20; ZB-H1 reaches 20 within these per-device limits
    (its own peaks), so the heuristic solver's warm start meets the bound it proves without any search: optimal at
    20, whatever the machine's speed."""
    limits = [3.0, 2.5, 2.0]
    result = solve(UNIT, limits, num_microbatches=6, num_devices=3, solver="heuristic")
    check_result(result, limits, status="optimal")
    assert result.solver == "heuristic" and result.schedule.mem_limit == (3.0, 2.5, 2.0)
    assert result.objective == result.step_time == 20 and result.lower_bound == 20 and result.gap == 0
    assert all(peak <= lim for peak, lim in zip(result.peak_memory, limits))


def test_check_result_refuses_a_status_its_figures_contradict():
    """``check_result`` can fail on the status: the optimal result above restated as any other status, or a warm
    start's schedule passed off as the backend's, is refused."""
    import dataclasses

    result = solve(UNIT, [3.0, 2.5, 2.0], num_microbatches=6, num_devices=3, solver="heuristic")
    for wrong in ("heuristic", "feasible"):
        with pytest.raises(AssertionError):
            check_result(dataclasses.replace(result, status=wrong))
    unproven = dataclasses.replace(result, lower_bound=18.0, gap=0.1, solver="cpsat")  # zb-h1's, not CP-SAT's
    for wrong in ("optimal", "feasible"):
        with pytest.raises(AssertionError):
            check_result(dataclasses.replace(unproven, status=wrong))
    check_result(dataclasses.replace(unproven, status="heuristic"))
    with pytest.raises(AssertionError):
        check_result(result, status="heuristic")


def test_to_json_and_summary(tmp_path):
    result = solve(UNIT, 3, num_microbatches=6, num_devices=3, time_limit=5, workers=1)
    path = tmp_path / "schedule.json"
    doc = result.to_json(path)
    assert json.loads(path.read_text()) == doc
    assert doc["solver"]["status"] == result.status and doc["solver"]["lower_bound"] == result.lower_bound
    schedule, _ = from_document(doc)
    assert simulate(schedule).makespan == result.timeline.makespan
    summary = result.summary()
    assert summary["paper_bubble"] == result.paper_bubble and summary["gap"] == result.gap
    assert "<table>" in result._repr_html_() and "<th>paper&#x27;s bubble</th>" in result._repr_html_()
    assert result.__rich__().row_count == len(solve_figures(result))  # each figure once, by its name


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
    assert info.value.min_feasible == pytest.approx(1.0), "the unit profile's max(M_B, M_W)"
    check_result(solve(UNIT, info.value.min_feasible, num_microbatches=4, num_devices=2, time_limit=5, workers=1),
                 info.value.min_feasible)


def test_ctrl_c_returns_the_best_schedule_so_far(monkeypatch):
    prob = problem("iclr/1.5b-p8-m32")
    p = prob.num_devices
    run_backend = solve_module._run_backend
    timers = []

    def interrupt_soon(*args, **kwargs):
        timers.append(threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)))
        timers[-1].start()
        return run_backend(*args, **kwargs)

    monkeypatch.setattr(solve_module, "_run_backend", interrupt_soon)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # a runner started in the background ignores it
    try:
        result = solve(prob.profile, 2 * p * prob.profile.mem_f, num_microbatches=prob.num_microbatches,
                       num_devices=p, time_limit=60, workers=1, objective="span")
    finally:
        signal.signal(signal.SIGINT, previous)
    check_result(result)
    assert timers and result.interrupted and "interrupted" in result.solver_log
    assert result.status in ("feasible", "heuristic")


@pytest.mark.parametrize("found", ["worse", "nothing"])
def test_a_worse_or_failed_solver_falls_back_to_the_warm_start(monkeypatch, found):
    """A stub backend returns a poor order or none: the result is the warm start. Its gap stays above 0
    whatever the bound, as a better schedule than the warm start exists (CP-SAT finds one given time)."""
    def bad_backend(solver, form, order, *args):
        return BackendResult(serial_order(form) if found == "worse" else None, False, None, "stub")

    monkeypatch.setattr(solve_module, "_run_backend", bad_backend)
    prob = problem("iclr/1.5b-p8-m32")
    p, m, limit = prob.num_devices, prob.num_microbatches, 2 * prob.num_devices * prob.profile.mem_f
    result = solve(prob.profile, limit, num_microbatches=m, num_devices=p, time_limit=5, workers=1, objective="span")
    check_result(result, limit)
    assert result.status == "heuristic" and result.objective <= heuristic_objective(result)
    assert result.gap > 0 and "stub" in result.solver_log


@pytest.mark.parametrize("solver", ["cpsat", "cbc"])
def test_progress_hears_every_log_line_as_it_comes(solver):
    lines: list[str] = []
    result = solve(UNEVEN, [2.0, 2.0, 4.0], num_microbatches=4, solver=solver, time_limit=10, workers=1,
                   progress=lines.append)
    check_result(result, [2.0, 2.0, 4.0])
    assert "\n".join(lines) == result.solver_log
    names = [line.split(":")[0] for line in lines]
    first = names.index("first schedule")  # the cheap families to the first that fits, else one at a time
    tried = [name for name in names[:first] if name != ONE_AT_A_TIME]
    assert names[:first] and tried == list(FIRST["sequential"])[:len(tried)]
    assert (ONE_AT_A_TIME in names[:first]) == any("over the memory limit" in line for line in lines[:first])
    floor = names[first + 1:names.index("families")]  # then every other family of the placement
    assert floor == [name for name in PLACEMENT_FAMILIES["sequential"] if name not in tried][:len(floor)]
    assert solver in lines[-1] or "lns" in lines[-1] or "whole" in lines[-1]


def test_solve_takes_the_path_of_a_model_a_profile_or_a_problem_file():
    """A problem file states what is not given: its p, m, memory limit and placement (as zbsolve solve reads it)."""
    model = ROOT / "problems" / "models" / "llama3-8b.yaml"
    result = solve(str(model), num_devices=4, num_microbatches=8, solver="heuristic")
    check_result(result)
    assert result.costs.model.name == "llama3-8b"
    stated = solve(ROOT / "problems" / "iclr" / "1.5b-p8-m24.yaml", solver="heuristic")
    assert (stated.schedule.num_devices, stated.schedule.num_microbatches) == (8, 24)
    with pytest.raises(InputError, match="num_microbatches"):
        solve(str(model), num_devices=4)


def test_a_fused_backward_holds_what_its_b_leaves_for_its_w():
    """B raises the memory before W frees it (mem_b > 0): a fused BW holds that while it runs, as B then W would,
    so 1F1B is over 2.2 as its split form is; at 2.5 it fits, and the solver's order, split, is faster."""
    profile = Profile(t_f=1.0, t_b=1.0, t_w=1.0, mem_f=1.0, mem_b=0.5, mem_w=-1.5)
    assert profile.held_in("BW", 0) == 0.5 and profile.held_in("B", 0) == 0.0
    one_f_one_b = make_schedule("1f1b", profile, 2, 4)
    assert peak(one_f_one_b, 0) == 2.5
    tight = solve(profile, 2.2, num_devices=2, num_microbatches=4, solver="cpsat", time_limit=30)
    check_result(tight, 2.2)
    assert "1f1b: over the memory limit" in tight.solver_log
    roomy = solve(profile, 2.5, num_devices=2, num_microbatches=4, solver="cpsat", time_limit=30)
    check_result(roomy, 2.5, status="optimal")
    assert roomy.step_time == 14.0 < simulate(one_f_one_b).makespan
