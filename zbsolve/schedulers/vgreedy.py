"""The V-shape greedy: ZB-V's schedule generator (Zero Bubble PP, Section 6) with each stage's own times.

Device d holds stages d (chunk 0, on the way down) and 2p-1-d (chunk 1, on the way up). The
greedy builds every device's order together, pass by pass, timing each as soon as possible:

1. warm-up: chunk-0 F down the devices, then the first chunk-1 F up from device p-1, each device
   adding chunk-0 F while they fit in memory and end before that chunk-1 F arrives;
2. more F (alternating chunks, last devices first) until each device is ahead of the next;
3. steady state, one round per microbatch chunk: a B on every device (the chunk whose input
   gradient has arrived, B first), then an F; a W fills an idle gap before the next arrival when
   it fits, runs early when memory requires it, or when leaving the gap would make this device's
   bubble the largest; the leftover W run at the end.

As in the authors' generator, both choices of filling gaps before F and before chunk-1 B are tried,
and each run is repeated with the previous run's per-device bubble allowed, while that lowers the
largest bubble. The best order by max span (each run times its passes as soon as possible, as the
simulator does) is kept and validated by the simulator; an optional deadline stops the search early.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Sequence

from zbsolve.base.checks import check_count, check_size, device_limits, room
from zbsolve.base.errors import BudgetError
from zbsolve.core.dependencies import dependencies, lag
from zbsolve.core.memory import need
from zbsolve.core.placement import vshape
from zbsolve.core.profile import Profile
from zbsolve.core.schedule import B, F, Kind, Pass, Schedule, W, build
from zbsolve.core.simulator import simulate

ROUNDS = 16
"""At most this many runs with the previous run's bubble allowed, per variant."""


class _Stuck(Exception):
    """The greedy cannot go on in this variant (a dependency or the memory limit is in the way)."""


class _Run:
    """One run of the greedy for ``p`` devices and ``m`` microbatches."""

    def __init__(self, profile: Profile, p: int, m: int, rooms: list[float], fill_f: bool, fill_b: bool,
                 allowed: list[float] | None, deadline: float | None = None) -> None:
        self.p, self.m, self.S = p, m, 2 * p
        self.rooms, self.fill_f, self.fill_b, self.deadline = rooms, fill_f, fill_b, deadline
        self.time = {k: [profile.time(k, s) for s in range(self.S)] for k in (F, B, W)}
        self.delta = {k: [profile.delta(k, s) for s in range(self.S)] for k in (F, B, W)}
        self.need = {k: [need(self.delta[k][s], profile.held_in(k, s)) for s in range(self.S)] for k in (F, B, W)}
        """What a pass needs above the memory before it: its delta, or what a recomputing B holds while it runs."""
        self.comm = profile.t_comm
        # deps[kind][s]: what pass (kind, mb, s) waits for, as (kind, stage, whether on another device, lag) of mb's
        self.deps = {k: [tuple((dep.kind, dep.stage, self.dev(dep.stage) != self.dev(s),
                                lag(self.comm, self.dev(dep.stage), self.dev(s)))
                               for dep in dependencies(Pass(k, 0, s), self.S)) for s in range(self.S)]
                     for k in (F, B, W)}
        self.allowed = allowed or [0.0] * p
        self.most_allowed = max(self.allowed)
        self.end: dict[Kind, list[list[float]]] = {k: [[] for _ in range(self.S)] for k in (F, B, W)}
        self.cur = [0.0] * p
        self.first = [0.0] * p
        self.mem = [0.0] * p
        self.bubble = [0.0] * p
        self.top_bubble = 0.0
        self.pending: list[deque[int]] = [deque() for _ in range(p)]
        self.ops: list[list[Pass]] = [[] for _ in range(p)]

    # -- bookkeeping -------------------------------------------------------------------------------

    def dev(self, s: int) -> int:
        return s if s < self.p else self.S - 1 - s

    def up(self, d: int) -> int:
        """Device d's chunk-1 stage."""
        return self.S - 1 - d

    def count(self, kind: Kind, s: int) -> int:
        return len(self.end[kind][s])

    def done(self, kind: Kind, s: int, mb: int) -> float | None:
        """End time of pass (kind, mb, s), None if not placed yet."""
        ends = self.end[kind][s]
        return ends[mb] if mb < len(ends) else None

    def arrival(self, kind: Kind, s: int, mb: int) -> float | None:
        """When pass (kind, mb, s)'s input from another device arrives; None if it has no such input
        or it is not placed yet."""
        for dep_kind, dep_stage, across, gap in self.deps[kind][s]:
            if across:
                end = self.done(dep_kind, dep_stage, mb)
                return None if end is None else end + gap
        return None

    def max_bubble(self, d: int) -> float:
        """The bubble a device may reach before a gap counts as the largest."""
        return max(self.top_bubble, self.most_allowed - self.allowed[d])

    def put(self, kind: Kind, s: int) -> None:
        d, mb = self.dev(s), self.count(kind, s)
        if mb >= self.m:
            raise _Stuck
        if self.mem[d] + self.need[kind][s] > self.rooms[d]:
            raise _Stuck
        begin = self.cur[d]
        for dep_kind, dep_stage, _, gap in self.deps[kind][s]:
            end = self.done(dep_kind, dep_stage, mb)
            if end is None:
                raise _Stuck
            begin = max(begin, end + gap)
        if self.ops[d]:
            self.bubble[d] += begin - self.cur[d]
            self.top_bubble = max(self.top_bubble, self.bubble[d])
        else:
            self.first[d] = begin
        self.cur[d] = begin + self.time[kind][s]
        self.mem[d] += self.delta[kind][s]
        self.end[kind][s].append(self.cur[d])
        self.ops[d].append(Pass(kind, mb, s))
        if kind == B:
            self.pending[d].append(s)

    def put_w(self, d: int) -> None:
        if not self.pending[d]:
            raise _Stuck
        self.put(W, self.pending[d].popleft())

    def fill(self, d: int, arrival: float | None, fill: bool) -> None:
        """W before a pass whose input arrives at ``arrival``: every W that ends by then, and one more
        when ``fill`` and the gap would otherwise make this device's bubble the largest."""
        if arrival is None:
            return
        while self.pending[d] and arrival >= self.cur[d] + self.time[W][self.pending[d][0]]:
            self.put_w(d)
        if fill and self.pending[d] and arrival - self.cur[d] > self.max_bubble(d) - self.bubble[d]:
            self.put_w(d)

    # -- the phases --------------------------------------------------------------------------------

    def warm_up(self) -> None:
        p, m = self.p, self.m
        for d in range(p):
            self.put(F, d)
        for d in reversed(range(p)):
            if d < p - 1:
                sent = self.done(F, self.up(d + 1), 0)
                assert sent is not None, "device d + 1 placed its chunk-1 F of microbatch 0 the round before"
                arrival = sent + self.comm
                reserve = (d + 1) * (self.delta[F][d] + self.delta[F][self.up(d)])
                while (self.mem[d] + reserve <= self.rooms[d] and self.cur[d] + self.time[F][d] <= arrival
                       and self.count(F, d) < m):
                    for j in range(d + 1):
                        if self.count(F, j) < m:
                            self.put(F, j)
            self.put(F, self.up(d))
        chunk = 0
        for d in range(1, p):
            idle = 0
            while (self.count(F, d) + self.count(F, self.up(d)) < self.count(F, d - 1) + self.count(F, self.up(d - 1))
                   or self.count(F, self.up(d)) <= self.count(F, self.up(d - 1)) < m):
                placed = False
                for j in reversed(range(d, p)):
                    s = j if chunk == 0 else self.up(j)
                    if self.count(F, s) < m:
                        self.put(F, s)
                        placed = True
                chunk = 1 - chunk
                idle = 0 if placed else idle + 1
                if idle == 2:
                    raise _Stuck

    def steady(self) -> None:
        p, m = self.p, self.m
        for _ in range(2 * m):
            if self.deadline is not None and time.monotonic() > self.deadline:
                raise BudgetError("the V-shape greedy's deadline passed")
            for d in range(p):
                while self.mem[d] + max(self.need[B][d], self.need[B][self.up(d)]) > self.rooms[d]:
                    self.put_w(d)
            first, second = [], []
            for d in range(p):
                up = self.up(d)
                if self.count(B, d) >= self.count(B, up):
                    first.append(d)
                elif d == p - 1 or self.done(B, d + 1, self.count(B, d)) is not None or self.count(B, up) >= m:
                    second.append(d)
                else:
                    first.append(d)
            for d, s in [(d, d) for d in reversed(second)] + [(d, self.up(d)) for d in first]:
                mb = self.count(B, s)
                if mb >= m:
                    continue
                self.fill(d, self.arrival(B, s, mb), s == d or self.fill_b)
                self.put(B, s)
            for d in range(p):
                down, up = d, self.up(d)
                if self.count(F, up) >= m:
                    continue
                if self.count(F, up) >= self.count(F, down):
                    s = down
                elif d == p - 1 or self.done(F, self.up(d + 1), self.count(F, up)) is not None:
                    s = up
                elif self.count(F, down) < m and (d == 0 or self.done(F, d - 1, self.count(F, down)) is not None):
                    s = down
                else:
                    continue
                while self.mem[d] + self.delta[F][s] > self.rooms[d]:
                    self.put_w(d)
                self.fill(d, self.arrival(F, s, self.count(F, s)), self.fill_f)
                self.put(F, s)
        for d in range(p):
            while self.pending[d]:
                self.put_w(d)

    def run(self) -> list[list[Pass]] | None:
        """Every device's order, or None when this variant gets stuck."""
        try:
            self.warm_up()
            self.steady()
        except _Stuck:
            return None
        if any(self.count(k, s) < self.m for k in (F, B, W) for s in range(self.S)):
            return None
        return self.ops

    def span(self) -> float:
        """Max per-device span of the run's own as-soon-as-possible times."""
        return max(end - first for end, first in zip(self.cur, self.first))


def v_greedy(profile: Profile, num_devices: int, num_microbatches: int,
             mem_limit: float | Sequence[float] | None = None, *, deadline: float | None = None) -> Schedule | None:
    """The best V-shape order the greedy finds under ``mem_limit`` (one number, one per device, or None),
    validated by the simulator; None when every variant gets stuck (e.g. a limit too tight for its warm-up).
    ``profile`` has 2p stages (chunks) or p stages / scalars, split in two. Past ``deadline`` (a
    ``time.monotonic()`` instant) no further run is tried and the best so far is kept; ``BudgetError`` if no
    run finished by then."""
    p, m = num_devices, check_count("num_microbatches", num_microbatches)
    layout = vshape(p)
    check_size(layout.num_stages, m)
    prof = profile.per_chunk(p, 2, "the V-shape greedy").expand(2 * p)
    rooms = [room(x) for x in device_limits(mem_limit, p)]
    best, best_span, ran = None, math.inf, False
    try:
        for fill_b in (True, False):
            for fill_f in (True, False):
                allowed, top = None, math.inf
                for _ in range(ROUNDS):
                    if deadline is not None and time.monotonic() > deadline:
                        raise BudgetError("the V-shape greedy's deadline passed")
                    run = _Run(prof, p, m, rooms, fill_f, fill_b, allowed, deadline)
                    ops = run.run()
                    ran = True
                    if ops is None or run.top_bubble >= top:
                        break
                    allowed, top, span = run.bubble, run.top_bubble, run.span()
                    if span < best_span:
                        best, best_span = ops, span
    except BudgetError:
        if not ran:
            raise BudgetError("the V-shape greedy's deadline passed before its first run finished") from None
    if best is None:
        return None
    schedule = build("v-greedy", layout, m, prof, best, mem_limit)
    simulate(schedule)
    return schedule
