"""Lower bounds on the objective: each device's work plus the idle time no schedule can avoid.

A device running one stage idles before its first B (only F can run then, at most as many as
the memory limit holds) and between the end of its last F and the start of its last B (a round
trip through the later stages, filled at most by the B and W work the limit lets it hold then).
A device running several stages idles likewise before its first pass that is not an F of its lowest
stage, and on the round trip between the last B of its next stage and the last B of its lowest.
``lower_bound`` bounds the first idle by earliest starts alone; ``warmup_bound`` minimises it
jointly over all one-stage devices on a relaxation that keeps only the F passes and the first B of each
device (W dropped, B freeing all of its microbatch's memory), solved by CP-SAT.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from ortools.sat.python import cp_model

from zbsolve.base.interrupt import run_interruptible
from zbsolve.core.schedule import B, F, W
from zbsolve.optimize.bound_terms import route_stages
from zbsolve.optimize.formulation import Formulation


@dataclass(frozen=True)
class _DeviceBound:
    base: int
    """Work plus the objective's offset shift (first earliest start minus offset)."""
    head: int
    """Least idle before the first B, from earliest starts."""
    tail: int
    """Least idle between the last F's end and the last B's start."""
    disjoint: bool
    """Whether the two idle periods cannot overlap (the limit forces a B before the last F)."""
    critical: int
    """Earliest end of the device's last pass, minus the offset."""

    def value(self, head: int) -> int:
        idle = head + self.tail if self.disjoint else max(head, self.tail)
        return max(self.critical, self.base + idle)


def _device_bounds(form: Formulation) -> list[_DeviceBound]:
    """Per device, its bound's parts."""
    m, offset, work = form.num_microbatches, form.offset, form.work
    counts = form.stage_counts()
    lags = _last_lags(form)
    out: list[_DeviceBound] = []
    for d in range(form.num_devices):
        base = form.earliest[form.first[d]] - offset[d] + work[d]
        critical = max(form.earliest[i] + form.duration[i] for i in form.last[d]) - offset[d]
        if counts[d] != 1:
            out.append(_DeviceBound(base, *_multi_stage_idle(form, d, lags), True, critical))
            continue
        s = form.passes[form.first[d]].stage
        tf, tb, tw = (form.duration[form.index_of(k, 0, s)] for k in (F, B, W))
        mf, mw = form.mem_delta[form.index_of(F, 0, s)], -form.mem_delta[form.index_of(W, 0, s)]
        n_f = _warmup_room(form, d)
        head = max(0, form.earliest[form.index_of(B, 0, s)] - form.earliest[form.first[d]] - n_f * tf)
        tail = max(0, _round_trip(form, s, lags) - _tail_fill(m, tb, tw, mf, mw, form.limit[d]))
        out.append(_DeviceBound(base, head, tail, n_f < m, critical))
    return out


def _multi_stage_idle(form: Formulation, d: int, lags: dict[tuple[int, int], int]) -> tuple[int, int]:
    """The least idle (head, tail) of a device running several stages (lowest s1, next s2). Before the
    earliest start of any pass other than an F of s1 it can only run the F of s1 that fit in memory, and
    before its first B only F of its stages that fit in memory, none longer than its longest F (head);
    between the end of B(m-1, s2) and the start of B(m-1, s1) only pending B of s1 and pending W (tail)."""
    m, stages = form.num_microbatches, route_stages(form.placement.routes[0], form.num_devices)[d]
    s1, s2 = stages[0], stages[1]
    tf = form.duration[form.index_of(F, 0, s1)]
    begin = form.earliest[form.first[d]]
    others = [form.index_of(F, 0, s) for s in stages[1:]] + [form.index_of(B, 0, s) for s in stages]
    head = max(0, min(form.earliest[i] for i in others) - begin - _warmup_room(form, d) * tf)
    first_b = min(form.earliest[form.index_of(B, 0, s)] for s in stages)
    forwards = [form.index_of(F, 0, s) for s in stages]
    held = [form.mem_delta[i] for i in forwards if form.mem_delta[i] > 0]
    room = len(stages) * m
    limit = form.limit[d]
    if limit is not None and len(held) == len(forwards):
        room = min(room, limit // min(held))
    head = max(head, first_b - begin - room * max(form.duration[i] for i in forwards))
    path = [form.index_of(B, m - 1, s) for s in range(s2, s1 - 1, -1)]
    trip = _path_time(form, path, lags)
    tb = form.duration[form.index_of(B, 0, s1)]
    tw = max(form.duration[form.index_of(W, 0, s)] for s in stages)
    mf = form.mem_delta[form.index_of(F, 0, s1)]
    mw = min(-form.mem_delta[form.index_of(W, 0, s)] for s in stages)
    return head, max(0, trip - _tail_fill(m, tb, tw, mf, mw, form.limit[d], len(stages) * m))


def lower_bound(form: Formulation) -> int:
    """A lower bound on the scaled objective from earliest starts, work and memory."""
    return _cheap(_device_bounds(form))


def _cheap(parts: list[_DeviceBound]) -> int:
    """``lower_bound`` from the devices' bound parts."""
    return max(b.value(b.head) for b in parts)


def _warmup_room(form: Formulation, d: int) -> int:
    """Most F a one-stage device can run before its first B."""
    mf = form.mem_delta[form.first[d]]
    limit = form.limit[d]
    return form.num_microbatches if limit is None or mf == 0 else min(form.num_microbatches, limit // mf)


def warmup_bound(form: Formulation, time_limit: float, workers: int) -> int:
    """A lower bound at least ``lower_bound``'s, minimising the idle before every device's first B
    jointly (CP-SAT's proven bound on the relaxation after ``time_limit`` seconds); Ctrl-C stops it
    and raises KeyboardInterrupt."""
    parts = _device_bounds(form)
    cheap = _cheap(parts)
    if any(c != 1 for c in form.stage_counts()) or time_limit <= 0:
        return cheap
    horizon = max(form.earliest) + sum(form.work)

    model = cp_model.CpModel()
    objective = model.new_int_var(cheap, horizon, "objective")
    start: dict[int, cp_model.IntVar] = {}
    for d, part in enumerate(parts):
        start.update(_add_warmup(model, form, d, part, horizon, objective))
    for a, b, lag in form.edges:
        if a in start and b in start:
            model.add(start[b] >= start[a] + form.duration[a] + lag)
    model.minimize(objective)

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit
    solver.parameters.num_workers = workers
    if run_interruptible(solver, model).interrupted:
        raise KeyboardInterrupt
    return max(cheap, math.ceil(solver.best_objective_bound - 1e-6))


def _add_warmup(model: cp_model.CpModel, form: Formulation, d: int, part: _DeviceBound, horizon: int,
                objective: cp_model.IntVar) -> dict[int, cp_model.IntVar]:
    """One-stage device ``d``'s relaxation: the F that fit in memory before its first B, that B, and the
    idle before it, which with ``part``'s other idle is at most ``objective``; return their start variables."""
    stage = form.passes[form.first[d]].stage
    room = _warmup_room(form, d)
    forwards = [form.index_of(F, k, stage) for k in range(min(form.num_microbatches, room + 1))]
    first_b = form.index_of(B, 0, stage)
    tf, tb = form.duration[forwards[0]], form.duration[first_b]
    start: dict[int, cp_model.IntVar] = {}
    intervals = []
    for i in forwards + [first_b]:
        start[i] = model.new_int_var(form.earliest[i], horizon, f"start{i}")
        intervals.append(model.new_fixed_size_interval_var(start[i], form.duration[i], f"pass{i}"))
    model.add_no_overlap(intervals)
    before: list[cp_model.IntVar] = []
    for k, i in enumerate(forwards):
        early = model.new_bool_var(f"before{i}")
        model.add(start[first_b] >= start[i] + tf).only_enforce_if(early)
        model.add(start[i] >= start[first_b] + tb).only_enforce_if(~early)
        if before:
            model.add(start[i] >= start[forwards[k - 1]] + tf)
            model.add_implication(early, before[-1])
        if k >= room:
            model.add(early == 0)
        before.append(early)
    head = model.new_int_var(part.head, horizon, f"head{d}")
    model.add(head == start[first_b] - form.earliest[form.first[d]] - tf * sum(before))
    model.add(objective >= part.base + head + (part.tail if part.disjoint else 0))
    return start


def _last_lags(form: Formulation) -> dict[tuple[int, int], int]:
    """The lag of every dependency edge between the last microbatch's F and B passes (the round trips' paths)."""
    m, stages = form.num_microbatches, form.placement.num_stages
    last = {form.index_of(kind, m - 1, s) for kind in (F, B) for s in range(stages)}
    return {(a, b): x for a, b, x in form.edges if b in last and a in last}


def _round_trip(form: Formulation, stage: int, lags: dict[tuple[int, int], int]) -> int:
    """Least time from the end of the last microbatch's F to the start of its B on ``stage``."""
    m = form.num_microbatches
    path = [form.index_of(F, m - 1, s) for s in range(stage, form.placement.num_stages)]
    path += [form.index_of(B, m - 1, s) for s in range(form.placement.num_stages - 1, stage - 1, -1)]
    return _path_time(form, path, lags)


def _path_time(form: Formulation, path: list[int], lags: dict[tuple[int, int], int]) -> int:
    """Least time from the end of ``path[0]`` to the start of ``path[-1]`` along dependency edges (``lags``)."""
    return sum(lags[(a, b)] + (form.duration[b] if b != path[-1] else 0) for a, b in itertools.pairwise(path))


def _tail_fill(m: int, tb: int, tw: int, mf: int, mw: int, limit: int | None, passes: int | None = None) -> int:
    """Most B and W work a device can hold pending when its round trip starts.

    With ``a`` microbatches whose B has not run (the last one included) and ``w`` whose W has not
    run after their B, memory is at least ``a * mf + w * mw`` (here ``mw`` = -mem_w); the work that can
    fill the round trip is ``(a - 1)`` B and ``(a - 1 + w)`` W; ``w`` is at most ``passes - a`` (default m - a).
    """
    best = 0
    for a in range(1, m + 1):
        room = None if limit is None else limit - a * mf
        if room is not None and room < 0:
            break
        most = (m if passes is None else passes) - a
        w = most if room is None or mw == 0 else min(most, room // mw)
        best = max(best, (a - 1) * tb + (a - 1 + w) * tw)
    return best
