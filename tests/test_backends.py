"""The backend registry, every backend on small problems, and interruptible CP-SAT solves."""

from __future__ import annotations

import os
import random
import signal
import threading

import pytest
from ortools.sat.python import cp_model

from zbsolve.base.interrupt import run_interruptible
from zbsolve.core.placement import sequential, vshape
from zbsolve.core.profile import Profile
from zbsolve.core.simulator import simulate
from zbsolve.optimize.backends import BACKENDS
from zbsolve.optimize.bound import lower_bound
from zbsolve.optimize.formulation import formulate
from zbsolve.problem.request import SOLVERS
from zbsolve.schedulers.heuristic import heuristic

UNEVEN = Profile(t_f=[1.0, 1.5, 1.2], t_b=[1.1, 2.0, 1.3], t_w=[0.6, 1.0, 0.9], t_comm=0.2,
                 mem_f=[1.0, 1.0, 2.0], mem_b=[-0.5, -0.25, -1.0], mem_w=[-0.5, -0.75, -1.0])
SKEWED_V = Profile(t_f=[1.0, 1.5, 1.2, 1.0], t_b=[1.0, 2.0, 1.3, 1.1], t_w=[0.5, 1.0, 0.9, 0.6], t_comm=0.25)


def test_registry_names_every_solver_but_the_heuristic():
    assert set(BACKENDS) == set(SOLVERS) - {"heuristic"}


@pytest.mark.parametrize("name", sorted(BACKENDS))
@pytest.mark.parametrize("profile, placement, m, limit", [
    (UNEVEN, sequential(3), 4, [2.0, 2.0, 4.0]),
    (SKEWED_V, vshape(2), 3, 2.5),
], ids=["sequential", "vshape"])
def test_backend_returns_a_valid_order_no_worse_than_the_warm_start(name, profile, placement, m, limit):
    form = formulate(profile, placement, m, limit, "span")
    warm = heuristic(profile, placement, m, limit)
    lines: list[str] = []
    result = BACKENDS[name](form, form.order_of(warm), time_limit=20, workers=1, seed=0, lower=lower_bound(form),
                            report=lines.append)
    assert result.order is not None and not result.interrupted
    timeline = simulate(form.schedule(result.order, name))  # raises on an invalid order or memory over the limit
    assert max(timeline.span) <= max(simulate(warm).span)
    assert "\n".join(lines) == result.log


def _max_3sat(variables: int, clauses: int) -> cp_model.CpModel:
    """Random MAX-3-SAT: solutions come at once, a proof of optimality takes CP-SAT very long."""
    rng = random.Random(0)
    model = cp_model.CpModel()
    x = [model.new_bool_var(f"x{i}") for i in range(variables)]
    satisfied = []
    for c in range(clauses):
        clause = model.new_bool_var(f"clause{c}")
        model.add_bool_or([x[i] if rng.random() < 0.5 else ~x[i] for i in rng.sample(range(variables), 3)]
                          ).only_enforce_if(clause)
        satisfied.append(clause)
    model.maximize(sum(satisfied))
    return model


@pytest.mark.parametrize("feasible", [True, False])
def test_run_interruptible_returns_the_models_status(feasible):
    model = cp_model.CpModel()
    x = model.new_int_var(0, 10, "x")
    model.add(x >= 3 if feasible else x >= 11)
    model.minimize(x)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    outcome = run_interruptible(solver, model)
    assert outcome.status == (cp_model.OPTIMAL if feasible else cp_model.INFEASIBLE) and not outcome.interrupted
    if feasible:
        assert solver.value(x) == 3


def test_ctrl_c_stops_the_search_and_keeps_its_best_solution():
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.max_time_in_seconds = 300
    model = _max_3sat(120, 800)
    timer = threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT))
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # a runner started in the background ignores it
    try:
        timer.start()
        outcome = run_interruptible(solver, model)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    assert outcome.interrupted and outcome.status == cp_model.FEASIBLE
    assert 0 < solver.objective_value < 800


def test_the_passes_after_a_window_are_timed_after_what_they_read_when_they_start_together():
    """A pass of no duration and its reader start at the same time: the reader (the lower index here) is timed
    after it, as the dependency says, whatever the sort by start left between them."""
    from types import SimpleNamespace

    from zbsolve.optimize.backends.cpsat_window import AFTER, _after_window

    form = SimpleNamespace(duration=[3, 0], passes=[0, 1], last=[[0], [1]])  # 0 reads 1, on another device
    after = _after_window(form, [[0], [1]], [5, 5], [AFTER, AFTER], [[(1, 0)], []], deadline=float("inf"))
    assert after.const == {1: 0, 0: 0} and set(after.lag) == {0, 1}
