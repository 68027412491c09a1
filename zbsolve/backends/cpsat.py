"""CP-SAT backend: the exact model, solved whole on small problems, and a large-neighbourhood
search that re-optimises every device's order inside a time window while the order outside it
stays fixed (passes after the window are timed exactly by max-plus propagation)."""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model

from zbsolve.backends import BackendResult, Log
from zbsolve.formulation import Formulation
from zbsolve.schedule import B, F, W

WHOLE_MODEL_PASSES = 400
"""Problems with at most this many passes are first solved as one model."""
LNS_WINDOW_PASSES = 300
"""Passes in the first window of the large-neighbourhood search (adapted as it goes)."""
LNS_SECONDS = 1.5
"""Time limit of one window's solve, per LNS_WINDOW_PASSES passes beyond the first."""
_NEG = -(1 << 60)
_PRE, _WIN, _POST = -1, 0, 1


@dataclass
class _Outcome:
    status: int
    interrupted: bool


def run_interruptible(solver: cp_model.CpSolver, model: cp_model.CpModel) -> _Outcome:
    """Solve in a worker thread; Ctrl-C in the main thread stops the search and keeps its best solution."""
    solver.parameters.catch_sigint_signal = False
    done = threading.Event()
    result: dict[str, int] = {}

    def work() -> None:
        try:
            result["status"] = solver.Solve(model)
        finally:
            done.set()

    threading.Thread(target=work, daemon=True).start()
    interrupted = False
    while not done.is_set():
        try:
            done.wait(0.05)
        except KeyboardInterrupt:
            interrupted = True
            solver.StopSearch()
    return _Outcome(result.get("status", cp_model.UNKNOWN), interrupted)


class _Window:
    """The model of one window: passes whose incumbent start lies in [t0, t1) are free to reorder;
    passes before it keep their times, passes after it their order (and are timed by max-plus
    propagation from the window's ends)."""

    def __init__(self, form: Formulation, order: list[list[int]], start: list[int], t0: float, t1: float,
                 upper: int, latest: list[int], lower: int, secondary: bool) -> None:
        self.form, self.order = form, order
        dur, n = form.duration, len(form.passes)
        where = self.where = [_PRE if start[i] < t0 else _WIN if start[i] < t1 else _POST for i in range(n)]
        self.position = {i: k for seq in order for k, i in enumerate(seq)}
        end_const = [start[i] + dur[i] for i in range(n)]
        preds = form.predecessors()
        win = sorted(i for i in range(n) if where[i] == _WIN)
        self.size = len(win)
        sources, vec, const = self._propagate(start, end_const, preds)
        self.lo: dict[int, int] = {}
        """Least start of each window pass."""
        self.hi: dict[int, int] = {i: latest[i] + dur[i] for i in win}
        """Largest end of each window pass."""
        for d, seq in enumerate(order):
            pre_end = max((end_const[i] for i in seq if where[i] == _PRE), default=0)
            for i in seq:
                if where[i] == _WIN:
                    self.lo[i] = max([form.earliest[i], pre_end] + [end_const[a] + lag for a, lag in preds[i]
                                                                     if where[a] == _PRE])
        for d, lasts in enumerate(form.last):
            for last in lasts:
                room = upper + form.offset[d] - dur[last]
                if where[last] == _WIN:
                    self.hi[last] = min(self.hi[last], room + dur[last])
                elif where[last] == _POST:
                    for k in np.nonzero(vec[last] > _NEG // 2)[0]:
                        kind, x = sources[k]
                        for i in ([x] if kind == "pass" else [i for i in order[x] if where[i] == _WIN]):
                            self.hi[i] = min(self.hi[i], room - int(vec[last][k]))
        for b in win:
            for a, lag in preds[b]:
                if where[a] == _WIN:
                    self.lo[b] = max(self.lo[b], self.lo[a] + dur[a] + lag)
        succs: dict[int, list[tuple[int, int]]] = {}
        for b in win:
            for a, lag in preds[b]:
                if where[a] == _WIN:
                    succs.setdefault(a, []).append((b, lag))
        for a in reversed(win):
            for b, lag in succs.get(a, ()):
                self.hi[a] = min(self.hi[a], self.hi[b] - dur[b] - lag)
        model = self.model = cp_model.CpModel()
        s = self.var = {i: model.NewIntVar(self.lo[i], max(self.lo[i], self.hi[i] - dur[i]), f"s{i}") for i in win}
        for i in win:
            model.AddHint(s[i], start[i])
            for a, lag in preds[i]:
                if where[a] == _WIN:
                    model.Add(s[i] >= s[a] + dur[a] + lag)
        counts = form.stage_counts()
        for d, seq in enumerate(order):
            mine = [i for i in seq if where[i] == _WIN]
            if len(mine) > 1:
                model.AddNoOverlap([model.NewFixedSizeIntervalVar(s[i], dur[i], f"x{i}") for i in mine])
            if form.limit[d] is not None and mine:
                base = sum(form.mem_delta[i] for i in seq if where[i] == _PRE)
                if counts[d] == 1:
                    self._memory_counts(mine, base, form.limit[d])
                else:
                    self._memory_reservoir(mine, base, form.limit[d])
        self.z = model.NewIntVar(lower, upper, "z")
        self.span = [model.NewIntVar(0, upper, f"span{d}") for d in range(form.num_devices)]
        spans = form.spans(start)
        model.AddHint(self.z, max(spans))
        for d, (var, value) in enumerate(zip(self.span, spans)):
            model.AddHint(var, value)
            model.Add(self.z >= var)
        self._objective_terms(start, end_const, sources, vec, const)
        model.Minimize(self.z * 4 * form.num_devices + sum(self.span) if secondary else self.z)

    def _propagate(self, start: list[int], end_const: list[int], preds: list[list[tuple[int, int]]]
                   ) -> tuple[list[tuple[str, int]], dict[int, np.ndarray], dict[int, int]]:
        """Each pass after the window starts at max(const, max over sources (source + vec)); a source
        is the end of a window pass with a dependant after the window, or the end of a device's window."""
        form, where, dur = self.form, self.where, self.form.duration
        prev: dict[int, int | None] = {}
        for seq in self.order:
            for a, b in zip([None] + seq[:-1], seq):
                prev[b] = a
        post = sorted((i for i in range(len(form.passes)) if where[i] == _POST), key=lambda i: start[i])
        sources: list[tuple[str, int]] = []
        index: dict[tuple[str, int], int] = {}
        for i in post:
            links = list(preds[i]) + ([(prev[i], 0)] if prev[i] is not None else [])
            for a, lag in links:
                if where[a] == _WIN:
                    key = ("device", form.device[i]) if a == prev[i] else ("pass", a)
                    if key not in index:
                        index[key] = len(sources)
                        sources.append(key)
        vec: dict[int, np.ndarray] = {}
        const: dict[int, int] = {}
        for i in post:
            v = np.full(len(sources), _NEG, dtype=np.int64)
            c = 0
            for a, lag in list(preds[i]) + ([(prev[i], 0)] if prev[i] is not None else []):
                if where[a] == _POST:
                    np.maximum(v, vec[a] + (dur[a] + lag), out=v)
                    c = max(c, const[a] + dur[a] + lag)
                elif where[a] == _PRE:
                    c = max(c, end_const[a] + lag)
                else:
                    k = index[("device", form.device[i]) if a == prev[i] else ("pass", a)]
                    v[k] = max(v[k], lag)
            vec[i], const[i] = v, c
        return sources, vec, const

    def _objective_terms(self, start: list[int], end_const: list[int], sources: list[tuple[str, int]],
                         vec: dict[int, np.ndarray], const: dict[int, int]) -> None:
        """Bound each device's span by its last pass's end (a max-plus function when after the window)."""
        form, s, model, dur, where = self.form, self.var, self.model, self.form.duration, self.where
        exprs: list[cp_model.LinearExprT] = []
        for kind, x in sources:
            if kind == "pass":
                exprs.append(s[x] + dur[x])
                continue
            mine = [i for i in self.order[x] if where[i] == _WIN]
            end = model.NewIntVar(0, max(self.hi[i] for i in mine), f"end{x}")
            model.AddHint(end, max(start[i] + dur[i] for i in mine))
            for i in mine:
                model.Add(end >= s[i] + dur[i])
            exprs.append(end)
        for d, lasts in enumerate(form.last):
            off = form.offset[d]
            for last in lasts:
                if where[last] == _WIN:
                    model.Add(self.span[d] >= s[last] + dur[last] - off)
                elif where[last] == _PRE:
                    model.Add(self.span[d] >= end_const[last] - off)
                else:
                    model.Add(self.span[d] >= const[last] + dur[last] - off)
                    for k in np.nonzero(vec[last] > _NEG // 2)[0]:
                        model.Add(self.span[d] >= exprs[k] + int(vec[last][k]) + dur[last] - off)

    def _memory_counts(self, win: list[int], base: int, limit: int) -> None:
        """Memory at each window F's start from order literals (each B, W before or after it);
        pairs whose order the time bounds already fix get no literal."""
        form, s, model, dur, lo, hi = self.form, self.var, self.model, self.form.duration, self.lo, self.hi
        by_kind = {k: sorted((i for i in win if form.passes[i].kind == k), key=lambda i: form.passes[i].mb)
                   for k in (F, B, W)}
        prev_lits: dict[int, cp_model.IntVar] = {}
        level = base
        for f in by_kind[F]:
            level += form.mem_delta[f]
            k = form.passes[f].mb
            open_pairs = [x for kind in (B, W) for x in by_kind[kind] if form.passes[x].mb < k and hi[f] > lo[x]]
            fixed = sum(form.mem_delta[x] for x in open_pairs if hi[x] <= lo[f])
            open_pairs = [x for x in open_pairs if hi[x] > lo[f]]
            if level + fixed <= limit:
                prev_lits = {}
                continue
            lits: dict[int, cp_model.IntVar] = {}
            for x in open_pairs:
                y = lits[x] = model.NewBoolVar(f"o{x}_{f}")
                model.Add(s[f] >= s[x] + dur[x]).OnlyEnforceIf(y)
                model.Add(s[x] >= s[f] + dur[f]).OnlyEnforceIf(y.Not())
                model.AddHint(y, self.position[x] < self.position[f])
                if x in prev_lits:
                    model.AddImplication(prev_lits[x], y)
                q = form.passes[x]
                for twin in (form.index_of(q.kind, q.mb - 1, q.stage) if q.mb else -1,
                             form.index_of(B, q.mb, q.stage) if q.kind == W else -1):
                    if twin in lits:
                        model.AddImplication(y, lits[twin])
            model.Add(level + fixed + sum(form.mem_delta[x] * y for x, y in lits.items()) <= limit)
            prev_lits = lits

    def _memory_reservoir(self, win: list[int], base: int, limit: int) -> None:
        """Memory of a device with several stages as a reservoir of F starts and B, W ends."""
        form, s = self.form, self.var
        times = [0] + [s[i] if form.passes[i].kind == F else s[i] + form.duration[i] for i in win]
        changes = [base] + [form.mem_delta[i] for i in win]
        self.model.AddReservoirConstraint(times, changes, -sum(abs(c) for c in changes), limit)

    def order_from(self, solver: cp_model.CpSolver) -> list[list[int]]:
        """The full order with the window's passes sorted by the solver's starts."""
        out = []
        for seq in self.order:
            win = sorted((i for i in seq if i in self.var), key=lambda i: (solver.Value(self.var[i]), i))
            out.append([i for i in seq if self.where[i] == _PRE] + win + [i for i in seq if self.where[i] == _POST])
        return out


def _solver(time_limit: float, workers: int, seed: int, presolve: bool = True) -> cp_model.CpSolver:
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.01, time_limit)
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = seed
    solver.parameters.cp_model_presolve = presolve
    return solver


class _Search:
    """The best order found so far, kept up to date so that Ctrl-C can return it."""

    def __init__(self, form: Formulation, order: list[list[int]], report: Callable[[str], None] | None) -> None:
        self.form = form
        self.order = order
        self.value, self.total, self.start = self._score(order)
        self.log = Log(report)

    def _score(self, order: list[list[int]]) -> tuple[int, int, list[int]]:
        start = self.form.asap(order)
        return self.form.value(start), sum(self.form.spans(start)), start

    def offer(self, order: list[list[int]], allow_equal: bool) -> bool:
        """Keep ``order`` if it is better (by objective, then by the sum of spans); say whether it was."""
        if not self.form.memory_ok(order):
            return False
        value, total, start = self._score(order)
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
    form, value = search.form, search.value
    window = _Window(form, search.order, search.start, -1, float("inf"), value, form.latest(value), lower, False)
    solver = _solver(deadline - time.monotonic(), workers, seed)
    outcome = run_interruptible(solver, window.model)
    found = outcome.status in (cp_model.OPTIMAL, cp_model.FEASIBLE)
    search.log.append(f"whole model: {solver.StatusName(outcome.status)} in {solver.WallTime():.2f}s, "
                      f"objective {solver.Value(window.z) if found else '-'}")
    if found:
        search.offer(window.order_from(solver), allow_equal=True)
    if outcome.status == cp_model.OPTIMAL:
        return True, search.value, outcome.interrupted
    return False, max(lower, math.ceil(solver.BestObjectiveBound())), outcome.interrupted


def _lns(search: _Search, deadline: float, workers: int, seed: int, lower: int) -> bool:
    """Large-neighbourhood search over time windows of the incumbent (most at its head, where the
    warm-up idles; some at its tail and anywhere); return whether it was interrupted."""
    form = search.form
    rng = random.Random(seed)
    horizon = max(search.start[i] + form.duration[i] for lasts in form.last for i in lasts)
    per_time = len(form.passes) / max(1, horizon)
    target = {"head": 2 * LNS_WINDOW_PASSES, "tail": LNS_WINDOW_PASSES, "any": LNS_WINDOW_PASSES}
    iteration, build = 0, 0.0
    while time.monotonic() + 2 * build < deadline - 0.05 and search.value > lower:
        iteration += 1
        kind = rng.choices(("head", "tail", "any"), (0.5, 0.2, 0.3))[0]
        width = target[kind] / per_time
        t0 = {"head": -1.0, "tail": horizon - width, "any": rng.uniform(0, max(1.0, horizon - width))}[kind]
        began = time.monotonic()
        window = _Window(form, search.order, search.start, t0, t0 + width, search.value,
                         form.latest(search.value), lower, True)
        build = time.monotonic() - began
        if window.size == 0:
            continue
        seconds = min(deadline - time.monotonic(), LNS_SECONDS * (1 + window.size / LNS_WINDOW_PASSES))
        solver = _solver(seconds, workers, seed + iteration, presolve=False)
        outcome = run_interruptible(solver, window.model)
        before = search.value, search.total
        if outcome.status in (cp_model.OPTIMAL, cp_model.FEASIBLE) and search.offer(window.order_from(solver), False):
            search.log.append(f"lns {iteration}: {kind} window [{t0:.0f}, {t0 + width:.0f}) of {window.size} passes: "
                              f"{before[0]} -> {search.value} (sum of spans {before[1]} -> {search.total})")
            horizon = max(search.start[i] + form.duration[i] for lasts in form.last for i in lasts)
        if outcome.interrupted:
            return True
        grow = 1.4 if outcome.status == cp_model.OPTIMAL else 0.8
        target[kind] = max(60, min(int(target[kind] * grow), len(form.passes)))
    search.log.append(f"lns: {iteration} windows, objective {search.value}")
    return False
