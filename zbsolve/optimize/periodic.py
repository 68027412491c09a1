"""The periodic formulation: the steady state's repeating pattern solved once, for any number of microbatches.

Microbatch ``i``'s pass ``x`` (F, B or W of a stage) starts at ``i * T + o[x]``: one pattern of offsets ``o``,
repeated every period ``T``. Two passes of a device never overlap when their offsets do not overlap modulo ``T``
(each an arc of a circle of length ``T``, modelled as two copies of its interval on ``[0, 2T)``), so a pattern is
valid for every microbatch count, its first and last repetitions its warm-up and cool-down: a makespan of at most
``(m - 1) * T + L`` (``L``, one microbatch's span), which timing its order as soon as possible only shortens. The
dependency rule holds between one microbatch's passes (the formulation of one microbatch, ``formulate``). Memory
is counted over every repetition wherever it rises, by the memory rule (an F's from its start, a B's and W's from
their end, a recomputing B's held while it runs): in steady state, so a warm-up or cool-down, with fewer
microbatches, each holding nothing below zero, holds no more. The model's size does not depend on m.

Where it holds: it covers the schedules whose microbatches all repeat one pattern (the steady states of 1F1B,
ZB-H1 and ZB-H2), not those whose warm-up runs microbatches differently (the search improves those from it). Each
device's work per microbatch bounds ``T`` from below, and ``m`` times it bounds the step, so where the period meets
that work the pattern's step is within ``(L - T) / (m * T)`` of the optimum: exact as m grows.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from ortools.sat.python import cp_model

from zbsolve.base.interrupt import solve_or_interrupt
from zbsolve.core.schedule import BW, B, F, Pass, Schedule, W, build
from zbsolve.core.simulator import Timeline
from zbsolve.core.spec import Spec
from zbsolve.optimize.formulation import Formulation, formulate

TOLERANCE = 0.005
"""The period is searched until the least feasible one is known within this share."""
MAX_PROBES = 10
"""Periods tried at most."""
STEP = 0.01
"""The first longer period tried is this share longer than the least; each next one doubles the share."""
RESOLUTION = 100
"""Quanta of a pattern's time per pass of its busiest device, on average (CP-SAT searches coarse times faster; each
duration rounded up costs at most one quantum)."""


@dataclass(frozen=True)
class Pattern:
    """One microbatch's pass offsets, repeated every ``period`` (both in quanta of the formulation's times)."""

    form: Formulation
    """The formulation of one microbatch: the passes the offsets belong to."""
    quantum: int
    """The pattern's unit of time, in the formulation's: each duration and lag is rounded up to whole quanta."""
    period: int
    """T: the time between two microbatches' same pass."""
    offset: tuple[int, ...]
    """Start of each pass of ``form`` in microbatch 0."""

    @property
    def span(self) -> int:
        """L: from microbatch 0's first start to its last end."""
        return max(o + d for o, d in zip(self.offset, quanta(self.form.duration, self.quantum)))

    def makespan(self, num_microbatches: int) -> int:
        """(m - 1) * T + L: the pattern's own makespan for ``num_microbatches``, an upper bound on its schedule's."""
        return (num_microbatches - 1) * self.period + self.span

    def to_time(self, value: int) -> float:
        """A time of the pattern in profile units."""
        return value * self.quantum / self.form.time_scale

    def schedule(self, spec: Spec, name: str = "periodic") -> Schedule:
        """The schedule running the pattern for ``spec``'s microbatches: per device, every pass in order of its
        start (repetition ``j`` holds microbatch ``j - q`` of a pass at offset ``q * T + r``, in order of ``r``)."""
        m, form = spec.num_microbatches, self.form
        rows: list[list[tuple[int, int, Pass]]] = [[] for _ in range(form.num_devices)]
        for x, (o, p) in enumerate(zip(self.offset, form.passes)):
            q, r = divmod(o, self.period)
            rows[form.device[x]].append((r, q, p))
        devices = []
        for row in rows:
            row.sort(key=lambda e: (e[0], e[1]))
            repeats = m + max((q for _, q, _ in row), default=0)
            devices.append([Pass(p.kind, j - q, p.stage) for j in range(repeats) for _, q, p in row if 0 <= j - q < m])
        return build(name, spec.placement, m, spec.profile, devices, spec.mem_limit)


def quanta(times: Sequence[int], quantum: int) -> list[int]:
    """``times`` in whole quanta, rounded up (a pattern timed so is timed no shorter than its passes take)."""
    return [-(-t // quantum) for t in times]


def pattern(form: Formulation, quantum: int, period: int, time_limit: float, workers: int = 1,
            hint: Sequence[int] | None = None) -> Pattern | None:
    """The pattern of period ``period`` (in ``quantum``s of ``form``'s times) with the least span CP-SAT finds in
    ``time_limit`` seconds from ``hint`` (offsets, as a schedule's microbatch ran them) or else ``_greedy``'s, or
    None when none is found (proven infeasible or out of time); Ctrl-C stops it and raises KeyboardInterrupt."""
    # data
    n, T = len(form.passes), period
    duration = quanta(form.duration, quantum)
    lags = quanta([lag for *_, lag in form.edges], quantum)
    horizon = sum(duration) + sum(lags) + n * T

    # variables: offset = turns * T + phase, phase within the period
    model = cp_model.CpModel()
    turns = [model.new_int_var(0, horizon // T + 1, f"q{x}") for x in range(n)]
    phase = [model.new_int_var(0, T - 1, f"r{x}") for x in range(n)]
    start = [model.new_int_var(0, horizon, f"o{x}") for x in range(n)]
    for x in range(n):
        model.add(start[x] == turns[x] * T + phase[x])
    model.add(start[form.index_of(F, 0, 0)] == 0)
    hint = hint or _greedy(form, duration, lags, T)
    if hint is not None:
        for x, o in enumerate(hint):
            model.add_hint(start[x], o)
            model.add_hint(turns[x], o // T)
            model.add_hint(phase[x], o % T)

    # constraints: dependencies; one pass at a time on a device, modulo T; memory in flight
    for (a, b, _), lag in zip(form.edges, lags):
        model.add(start[b] >= start[a] + duration[a] + lag)
    for d, xs in enumerate(form.device_passes()):
        if sum(duration[x] for x in xs) > T:
            return None
        model.add_no_overlap([model.new_fixed_size_interval_var(phase[x] + k * T, duration[x], f"i{x}_{k}")
                              for x in xs for k in (0, 1)])
        limit = form.limit[d]
        if limit is not None:
            _add_memory(model, form, duration, xs, start, T, limit, horizon)

    # objective: one microbatch's span
    span = model.new_int_var(0, horizon, "span")
    model.add_max_equality(span, [start[x] + duration[x] for x in range(n)])
    model.minimize(span)
    if hint is not None:
        model.add_hint(span, max(o + d for o, d in zip(hint, duration)))

    # solve
    solver, status = solve_or_interrupt(model, time_limit, workers)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    return Pattern(form, quantum, T, tuple(solver.value(v) for v in start))


def offsets_of(timeline: Timeline, form: Formulation) -> tuple[int, list[int]] | None:
    """The time between ``timeline``'s middle microbatch's first F and the next's, and the offsets at which it ran
    the middle microbatch's passes from that F, in ``form``'s times (None where it runs overlapped pairs, or has
    one microbatch)."""
    schedule, mb = timeline.schedule, timeline.schedule.num_microbatches // 2
    starts: dict[tuple[str, int, int], float] = {}
    for ops, times in zip(schedule.devices, timeline.start):
        for op, t in zip(ops, times):
            if op.__class__ is not Pass:
                return None
            starts[op.kind, op.stage, op.mb] = t
            if op.kind == BW:
                starts[B, op.stage, op.mb], starts[W, op.stage, op.mb] = t, t + schedule.profile.time(B, op.stage)
    if mb == 0:
        return None
    first = starts[F, 0, mb - 1]
    return (round((starts[F, 0, mb] - first) * form.time_scale),
            [round((starts[p.kind, p.stage, mb - 1] - first) * form.time_scale) for p in form.passes])


def _greedy(form: Formulation, duration: list[int], lags: list[int], T: int) -> list[int] | None:
    """Offsets of period ``T`` placed one pass at a time in the formulation's topological order, each at the first
    start after its dependencies whose time modulo ``T`` is free on its device (memory not looked at); None where a
    pass finds no free place."""
    preds: list[list[tuple[int, int]]] = [[] for _ in form.passes]
    for (a, b, _), lag in zip(form.edges, lags):
        preds[b].append((a, lag))
    busy: list[list[tuple[int, int]]] = [[] for _ in range(form.num_devices)]  # arcs (phase, length) taken
    start = [0] * len(form.passes)
    for x, d in enumerate(form.device):
        ready = max((start[a] + duration[a] + lag for a, lag in preds[x]), default=0)
        tries = [ready] + sorted(ready + (r + n - ready) % T for r, n in busy[d])
        found = next((t for t in tries if t < ready + T and all(
            not _overlap(t % T, duration[x], r, n, T) for r, n in busy[d])), None)
        if found is None:
            return None
        start[x] = found
        busy[d].append((found % T, duration[x]))
    return start


def _overlap(r1: int, n1: int, r2: int, n2: int, T: int) -> bool:
    """Whether arcs [r1, r1 + n1) and [r2, r2 + n2) of a circle of length T overlap."""
    if n1 == 0 or n2 == 0:
        return False
    return (r2 - r1) % T < n1 or (r1 - r2) % T < n2


def _add_memory(model: cp_model.CpModel, form: Formulation, duration: list[int], xs: list[int],
                start: list[cp_model.IntVar], T: int, limit: int, horizon: int) -> None:
    """Keep a device's activation memory within ``limit`` wherever it rises (an F's start, a recomputing B's start, a
    B's end that allocates), summed over every repetition of the pattern: a stage holds its F's memory from the F's
    start to its B's end, then F's and B's until its W's end, in each microbatch; one that started ``k`` periods
    earlier than a moment ``t`` is in a phase ``[begin, end)`` of the pattern where ``begin <= t + k T < end``."""
    phases: list[tuple[int, cp_model.LinearExpr, cp_model.LinearExpr]] = []
    checks: list[tuple[cp_model.LinearExpr, int]] = []
    for s in sorted({form.passes[x].stage for x in xs}):
        f, b, w = (form.index_of(kind, 0, s) for kind in (F, B, W))
        end_b, end_w = start[b] + duration[b], start[w] + duration[w]
        phases += [(form.mem_delta[f], start[f], end_b), (form.mem_delta[f] + form.mem_delta[b], end_b, end_w)]
        checks.append((start[f], 0))
        if form.mem_held[b] > 0:
            checks.append((start[b], form.mem_held[b]))
        if form.mem_delta[b] > 0:
            checks.append((end_b, 0))
    for t, held in checks:
        level = [level * (_turns(model, t - begin, T, horizon) - _turns(model, t - end, T, horizon))
                 for level, begin, end in phases if level]
        model.add(sum(level) + held <= limit)


def _turns(model: cp_model.CpModel, span: cp_model.LinearExpr, T: int, horizon: int) -> cp_model.IntVar:
    """floor(span / T), ``span`` within [-horizon, horizon]."""
    k = model.new_int_var(-(horizon // T) - 1, horizon // T + 1, "k")
    model.add(k * T <= span)
    model.add(span <= k * T + T - 1)
    return k


def periodic(spec: Spec, deadline: float, workers: int = 1, warm: Timeline | None = None) -> Pattern | None:
    """The pattern whose schedule has the least makespan bound found before ``deadline`` (``time.monotonic()``),
    each probe a ``pattern`` solve of one period: first the devices' largest work per microbatch (the least period
    there is), then, where memory or the packing needs a longer one, ``warm``'s own period (its middle
    microbatch's offsets the hint of every probe, in exact times) and periods ``STEP`` times 1, 2, 4, ... longer
    (one microbatch's span at most) until one is found, then bisection below it. None where no probe found one, or
    the placement has several routes."""
    if len(spec.placement.routes) != 1:
        return None
    form = formulate(spec.profile, spec.placement, 1, spec.mem_limit, "makespan")
    busiest = max(len(xs) for xs in form.device_passes())
    warm_pattern = offsets_of(warm, form) if warm is not None else None
    quantum = 1 if warm_pattern else max(1, max(form.work) // (RESOLUTION * busiest))
    duration = quanta(form.duration, quantum)
    work = max(sum(duration[x] for x in xs) for xs in form.device_passes())
    high = -(-max(e + d for e, d in zip(form.earliest, form.duration)) // quantum) + len(form.passes)
    ladder = sorted({min(high, math.ceil(work * (1 + STEP * 2 ** k))) for k in range(MAX_PROBES)} - {work})
    if warm_pattern and warm_pattern[0] > work:  # the warm schedule's own period next, its offsets the hint
        ladder = [warm_pattern[0]] + [period for period in ladder if period > warm_pattern[0]]
    ladder.insert(0, work)
    hint = warm_pattern[1] if warm_pattern else None
    m, low, top, best = spec.num_microbatches, work - 1, None, None
    for probe in range(MAX_PROBES):
        if top is None:
            if probe >= len(ladder):
                break
            period = ladder[probe]
        else:
            period = (low + top) // 2
        left = deadline - time.monotonic()
        if left <= 0 or top is not None and (top - low <= max(1, TOLERANCE * top) or probe == 1):
            break
        found = pattern(form, quantum, period, left / (2 if probe == 0 else MAX_PROBES - probe), workers, hint)
        if found is None:
            low = period
            continue
        top = period
        if best is None or found.makespan(m) < best.makespan(m):
            best = found
    return best
