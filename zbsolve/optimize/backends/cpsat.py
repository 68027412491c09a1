"""CP-SAT backend: the exact model, solved whole on small problems, and a large-neighbourhood
search that re-optimises every device's order inside a time window while the order outside it
stays fixed (passes after the window are timed exactly by max-plus propagation).

A window's model is built in four steps: its data (``cpsat_window.window_data``), variables (``_add_starts``),
constraints (``_add_dependencies``, ``_add_no_overlap``, ``_add_memory_limit``) and objective
(``_add_objective``); ``_whole`` solves the whole incumbent as one window, ``_lns`` many windows in turn.
Every step draws on the backend's deadline: a window whose data cannot be built, solved and checked in
the time left is not started, and one whose building overruns is dropped."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model

from zbsolve.base.interrupt import run_interruptible
from zbsolve.core.schedule import B, F, W
from zbsolve.optimize.backends.cpsat_window import (
    AFTER,
    BEFORE,
    INSIDE,
    NEG,
    Incumbent,
    OutOfTime,
    WindowData,
    window_data,
)
from zbsolve.optimize.backends.protocol import BackendResult, Log
from zbsolve.optimize.formulation import Formulation

WHOLE_MODEL_PASSES = 400
"""Problems with at most this many passes are first solved as one model."""
LNS_WINDOW_PASSES = 300
"""Passes in the first window of the large-neighbourhood search (adapted as it goes)."""
LNS_SECONDS = 1.5
"""Time limit of one window's solve, per LNS_WINDOW_PASSES passes beyond the first."""
LNS_MIN_SECONDS = 0.1
"""A window is not started with less solve time than this."""


@dataclass(frozen=True)
class _Window:
    """One window's CP-SAT model and the variables its solution is read from."""

    data: WindowData
    model: cp_model.CpModel
    start: dict[int, cp_model.IntVar]
    """Start of each window pass."""
    objective: cp_model.IntVar
    """The objective: the largest span."""

    def order_from(self, solver: cp_model.CpSolver) -> list[list[int]]:
        """The full order with the window's passes sorted by the solver's starts."""
        where, out = self.data.where, []
        for seq in self.data.order:
            inside = sorted((i for i in seq if i in self.start), key=lambda i: (solver.value(self.start[i]), i))
            out.append([i for i in seq if where[i] == BEFORE] + inside + [i for i in seq if where[i] == AFTER])
        return out


def _window_model(form: Formulation, data: WindowData, lower: int, secondary: bool) -> _Window:
    """The model of one window; with ``secondary``, ties of the objective are broken by the sum of spans."""
    model = cp_model.CpModel()
    start = _add_starts(model, form, data)
    _add_dependencies(model, form, data, start)
    for d in range(form.num_devices):
        _add_no_overlap(model, form, data, start, d)
        _add_memory_limit(model, form, data, start, d)
    objective = _add_objective(model, form, data, start, lower, secondary)
    return _Window(data, model, start, objective)


def _add_starts(model: cp_model.CpModel, form: Formulation, data: WindowData) -> dict[int, cp_model.IntVar]:
    """A start variable per window pass, hinted with the incumbent's start."""
    start = {i: model.new_int_var(data.least_start[i], max(data.least_start[i], data.latest_end[i] - form.duration[i]),
                                  f"start{i}") for i in data.inside}
    for i in data.inside:
        model.add_hint(start[i], data.start[i])
    return start


def _add_dependencies(model: cp_model.CpModel, form: Formulation, data: WindowData,
                      start: dict[int, cp_model.IntVar]) -> None:
    """Each window pass starts after its window predecessors end, plus their lags."""
    for i in data.inside:
        for a, lag in data.links[i]:
            model.add(start[i] >= start[a] + form.duration[a] + lag)


def _add_no_overlap(model: cp_model.CpModel, form: Formulation, data: WindowData, start: dict[int, cp_model.IntVar],
                    d: int) -> None:
    """Device ``d`` runs one window pass at a time."""
    mine = data.inside_order[d]
    if len(mine) > 1:
        model.add_no_overlap([model.new_fixed_size_interval_var(start[i], form.duration[i], f"pass{i}") for i in mine])


def _add_memory_limit(model: cp_model.CpModel, form: Formulation, data: WindowData,
                      start: dict[int, cp_model.IntVar], d: int) -> None:
    """Device ``d``'s memory stays within its limit."""
    limit, mine = form.limit[d], data.inside_order[d]
    if limit is None or not mine:
        return
    held = sum(form.mem_delta[i] for i in data.order[d] if data.where[i] == BEFORE)
    if form.stage_counts()[d] == 1 and not any(form.mem_held[i] or form.passes[i].kind != F and form.mem_delta[i] > 0
                                               for i in mine):
        _add_memory_by_order(model, form, data, start, d, held, limit)
    else:
        _add_memory_reservoir(model, form, data, start, d, held, limit)


def _add_memory_by_order(model: cp_model.CpModel, form: Formulation, data: WindowData,
                         start: dict[int, cp_model.IntVar], d: int, held: int, limit: int) -> None:
    """Memory at each window F's start (where a one-stage device's memory peaks when no B raises it) from order
    literals (each B, W before or after it); pairs whose order the time bounds already fix get no literal."""
    dur, least, latest = form.duration, data.least_start, data.latest_end
    mine, position = data.inside_order[d], {i: k for k, i in enumerate(data.order[d])}
    by_kind = {k: sorted((i for i in mine if form.passes[i].kind == k), key=lambda i: form.passes[i].mb)
               for k in (F, B, W)}
    previous: dict[int, cp_model.IntVar] = {}
    level = held
    for f in by_kind[F]:
        level += form.mem_delta[f]
        mb = form.passes[f].mb
        open_pairs = [x for kind in (B, W) for x in by_kind[kind] if form.passes[x].mb < mb and latest[f] > least[x]]
        fixed = sum(form.mem_delta[x] for x in open_pairs if latest[x] <= least[f])
        open_pairs = [x for x in open_pairs if latest[x] > least[f]]
        if level + fixed <= limit:
            previous = {}
            continue
        before: dict[int, cp_model.IntVar] = {}
        for x in open_pairs:
            lit = before[x] = model.new_bool_var(f"before{x}_{f}")
            model.add(start[f] >= start[x] + dur[x]).only_enforce_if(lit)
            model.add(start[x] >= start[f] + dur[f]).only_enforce_if(~lit)
            model.add_hint(lit, position[x] < position[f])
            if x in previous:
                model.add_implication(previous[x], lit)
            q = form.passes[x]
            for twin in (form.index_of(q.kind, q.mb - 1, q.stage) if q.mb else -1,
                         form.index_of(B, q.mb, q.stage) if q.kind == W else -1):
                if twin in before:
                    model.add_implication(lit, before[twin])
        model.add(level + fixed + sum(form.mem_delta[x] * lit for x, lit in before.items()) <= limit)
        previous = before


def _add_memory_reservoir(model: cp_model.CpModel, form: Formulation, data: WindowData,
                          start: dict[int, cp_model.IntVar], d: int, held: int, limit: int) -> None:
    """Memory of a device as a reservoir of F starts and B, W ends, and of what a recomputing B holds from its
    start to its end (used where memory can peak elsewhere than at an F's start)."""
    mine = data.inside_order[d]
    inside = [i for i in mine if form.mem_held[i]]
    times = ([0] + [start[i] if form.passes[i].kind == F else start[i] + form.duration[i] for i in mine]
             + [start[i] for i in inside] + [start[i] + form.duration[i] for i in inside])
    changes = ([held] + [form.mem_delta[i] for i in mine] + [form.mem_held[i] for i in inside]
               + [-form.mem_held[i] for i in inside])
    model.add_reservoir_constraint(times, changes, -sum(abs(c) for c in changes), limit)


def _add_objective(model: cp_model.CpModel, form: Formulation, data: WindowData, start: dict[int, cp_model.IntVar],
                   lower: int, secondary: bool) -> cp_model.IntVar:
    """Minimise the largest span (then, with ``secondary``, the sum of spans); return the objective variable."""
    objective = model.new_int_var(lower, data.upper, "objective")
    span = [model.new_int_var(0, data.upper, f"span{d}") for d in range(form.num_devices)]
    incumbent = form.spans(data.start)
    model.add_hint(objective, max(incumbent))
    for var, value in zip(span, incumbent):
        model.add_hint(var, value)
        model.add(objective >= var)
    _add_span_bounds(model, form, data, start, span)
    model.minimize(objective * 4 * form.num_devices + sum(span) if secondary else objective)
    return objective


def _add_span_bounds(model: cp_model.CpModel, form: Formulation, data: WindowData, start: dict[int, cp_model.IntVar],
                     span: list[cp_model.IntVar]) -> None:
    """Each device's span is at least its last passes' ends (a max-plus function of the window's ends for
    passes after the window)."""
    dur, where, after = form.duration, data.where, data.after
    source_end: list[cp_model.LinearExprT] = []
    for kind, x in after.sources:
        if kind == "pass":
            source_end.append(start[x] + dur[x])
            continue
        mine = data.inside_order[x]
        end = model.new_int_var(0, max(data.latest_end[i] for i in mine), f"end{x}")
        model.add_hint(end, max(data.start[i] + dur[i] for i in mine))
        for i in mine:
            model.add(end >= start[i] + dur[i])
        source_end.append(end)
    for d, lasts in enumerate(form.last):
        offset = form.offset[d]
        for last in lasts:
            if where[last] == INSIDE:
                model.add(span[d] >= start[last] + dur[last] - offset)
            elif where[last] == BEFORE:
                model.add(span[d] >= data.start[last] + dur[last] - offset)
            else:
                model.add(span[d] >= after.const[last] + dur[last] - offset)
                for k in np.nonzero(after.lag[last] > NEG // 2)[0]:
                    model.add(span[d] >= source_end[k] + int(after.lag[last][k]) + dur[last] - offset)


# -- solve -------------------------------------------------------------------------------------


def _solver(time_limit: float, workers: int, seed: int, presolve: bool = True) -> cp_model.CpSolver:
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.01, time_limit)
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = seed
    solver.parameters.cp_model_presolve = presolve
    return solver


class _Search:
    """The best order found so far, kept up to date so that Ctrl-C can return it, and what every window of
    the search shares (predecessors, latest starts, the cost of checking an order)."""

    def __init__(self, form: Formulation, order: list[list[int]], report: Callable[[str], None] | None) -> None:
        began = time.monotonic()
        self.form = form
        self.order = order
        self.value, self.total, self.start = self._score(order)
        self.preds = form.predecessors()
        self._latest: dict[int, list[int]] = {}
        self.log = Log(report)
        self.check_cost = time.monotonic() - began
        """Seconds to check and time an order (``offer``), estimated from timing the incumbent."""

    def _score(self, order: list[list[int]]) -> tuple[int, int, list[int]]:
        start = self.form.asap(order)
        return self.form.value(start), sum(self.form.spans(start)), start

    def window(self, t0: float, t1: float, deadline: float) -> WindowData:
        """The window [t0, t1) of the incumbent; raise OutOfTime when it cannot be built by ``deadline``."""
        incumbent = Incumbent(self.order, self.start, self.value, self.latest(self.value))
        return window_data(self.form, incumbent, self.preds, t0, t1, deadline)

    def latest(self, upper: int) -> list[int]:
        """Latest start of every pass under objective ``upper`` (kept for the next window)."""
        if upper not in self._latest:
            self._latest = {upper: self.form.latest(upper)}
        return self._latest[upper]

    def offer(self, order: list[list[int]], allow_equal: bool) -> bool:
        """Keep ``order`` if it is better (by objective, then by the sum of spans); say whether it was."""
        began = time.monotonic()
        if not self.form.memory_ok(order):
            return False
        value, total, start = self._score(order)
        self.check_cost = time.monotonic() - began
        if (value, total) < (self.value, self.total) or (allow_equal and (value, total) == (self.value, self.total)):
            self.order, self.value, self.total, self.start = order, value, total, start
            return True
        return False


def solve_cpsat(form: Formulation, incumbent: list[list[int]], *, time_limit: float, workers: int,
                seed: int, lower: int, report: Callable[[str], None] | None = None) -> BackendResult:
    """Improve ``incumbent`` (per-device pass orders) within ``time_limit`` seconds, passing each log line to
    ``report`` as it comes; Ctrl-C returns the best so far."""
    deadline = time.monotonic() + time_limit
    search = _Search(form, incumbent, report)
    search.log.append(f"warm start objective {search.value}, lower bound {lower}")
    bound: int | None = None
    try:
        if len(form.passes) <= WHOLE_MODEL_PASSES:
            optimal, bound, interrupted = _whole(search, deadline, workers, seed, lower)
            if optimal or interrupted:
                return BackendResult(search.order, optimal, bound, "\n".join(search.log), interrupted)
        interrupted = _lns(search, deadline, workers, seed, lower)
    except KeyboardInterrupt:
        interrupted = True
    return BackendResult(search.order, search.value <= lower, bound, "\n".join(search.log), interrupted)


def _whole(search: _Search, deadline: float, workers: int, seed: int, lower: int) -> tuple[bool, int, bool]:
    """Solve the whole model; return (proven optimal, lower bound, interrupted)."""
    form = search.form
    data = search.window(-1, math.inf, deadline)
    window = _window_model(form, data, lower, secondary=False)
    solver = _solver(deadline - time.monotonic(), workers, seed)
    outcome = run_interruptible(solver, window.model)
    found = outcome.status in (cp_model.OPTIMAL, cp_model.FEASIBLE)
    search.log.append(f"whole model: {solver.status_name(outcome.status)} in {solver.wall_time:.2f}s, "
                      f"objective {solver.value(window.objective) if found else '-'}")
    if found:
        search.offer(window.order_from(solver), allow_equal=True)
    if outcome.status == cp_model.OPTIMAL:
        return True, search.value, outcome.interrupted
    return False, max(lower, math.ceil(solver.best_objective_bound)), outcome.interrupted


def _lns(search: _Search, deadline: float, workers: int, seed: int, lower: int) -> bool:
    """Large-neighbourhood search over time windows of the incumbent (most at its head, where the
    warm-up idles; some at its tail and anywhere), each started only if it can be built, solved and
    checked by ``deadline``; return whether it was interrupted."""
    form = search.form
    rng = random.Random(seed)
    horizon = max(search.start[i] + form.duration[i] for lasts in form.last for i in lasts)
    per_time = len(form.passes) / max(1, horizon)
    target = {"head": 2 * LNS_WINDOW_PASSES, "tail": LNS_WINDOW_PASSES, "any": LNS_WINDOW_PASSES}
    build = dict.fromkeys(target, 0.0)  # seconds the last window of each kind took to build
    iteration, stopped = 0, "the time limit"
    while search.value > lower:
        kind = rng.choices(("head", "tail", "any"), (0.5, 0.2, 0.3))[0]
        if deadline - time.monotonic() < build[kind] + LNS_MIN_SECONDS + search.check_cost:
            kind = min(build, key=build.__getitem__)
            if deadline - time.monotonic() < build[kind] + LNS_MIN_SECONDS + search.check_cost:
                break
        iteration += 1
        width = target[kind] / per_time
        t0 = {"head": -1.0, "tail": horizon - width, "any": rng.uniform(0, max(1.0, horizon - width))}[kind]
        began = time.monotonic()
        try:
            data = search.window(t0, t0 + width, deadline - LNS_MIN_SECONDS - search.check_cost)
        except OutOfTime:
            stopped = f"a window ({kind}) that could not be built in the time left"
            break
        window = _window_model(form, data, lower, secondary=True)
        build[kind] = time.monotonic() - began
        size = len(data.inside)
        if size == 0:
            continue
        seconds = min(deadline - time.monotonic() - search.check_cost, LNS_SECONDS * (1 + size / LNS_WINDOW_PASSES))
        solver = _solver(seconds, workers, seed + iteration, presolve=False)
        outcome = run_interruptible(solver, window.model)
        before = search.value, search.total
        if outcome.status in (cp_model.OPTIMAL, cp_model.FEASIBLE) and search.offer(window.order_from(solver), False):
            search.log.append(f"lns {iteration}: {kind} window [{t0:.0f}, {t0 + width:.0f}) of {size} passes: "
                              f"{before[0]} -> {search.value} (sum of spans {before[1]} -> {search.total})")
            horizon = max(search.start[i] + form.duration[i] for lasts in form.last for i in lasts)
        if outcome.interrupted:
            return True
        grow = 1.4 if outcome.status == cp_model.OPTIMAL else 0.8
        target[kind] = max(60, min(int(target[kind] * grow), len(form.passes)))
    else:
        stopped = "the lower bound"
    search.log.append(f"lns: {iteration} windows, objective {search.value} (stopped by {stopped})")
    return False
