"""The simulator: the one judge of every schedule.

``simulate`` times a schedule as soon as possible from its per-device orders, checks it
(every pass exactly once, on its device, dependencies satisfiable, no deadlock, memory within
the limit) and returns its ``Timeline``. It knows nothing of how the schedule was made.

Its work is linear in passes: each pass gets a flat key from (microbatch, stage, kind), the
checks and the timing engine read flat lists, and the memory trace is kept as two float arrays.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import overload

from zbsolve.base.checks import exceeds
from zbsolve.base.errors import MemoryLimitError, ScheduleError
from zbsolve.core.dependencies import dependencies, identity, lag
from zbsolve.core.measures import bubble, paper_bubble
from zbsolve.core.memory import levels
from zbsolve.core.objective import device_share, step
from zbsolve.core.schedule import BW, KINDS, B, F, Kind, Op, Pair, Pass, Schedule, W, passes_of
from zbsolve.core.timing import Preds, asap


class MemoryTrace(Sequence[tuple[float, float]]):
    """One device's memory trace: (time, activation memory from then on) steps, stored as two float arrays."""

    __slots__ = ("times", "values")

    def __init__(self, times: array, values: array) -> None:
        self.times, self.values = times, values

    def __len__(self) -> int:
        return len(self.times)

    @overload
    def __getitem__(self, i: int) -> tuple[float, float]: ...

    @overload
    def __getitem__(self, i: slice) -> list[tuple[float, float]]: ...

    def __getitem__(self, i: int | slice) -> tuple[float, float] | list[tuple[float, float]]:
        if isinstance(i, slice):
            return list(zip(self.times[i], self.values[i]))
        return self.times[i], self.values[i]

    def __iter__(self) -> Iterator[tuple[float, float]]:
        return zip(self.times, self.values)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, MemoryTrace):
            return self.times == other.times and self.values == other.values
        return isinstance(other, Sequence) and list(self) == list(other)

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"MemoryTrace({list(self)!r})"


@dataclass(frozen=True)
class Timeline:
    """A validated schedule with its as-soon-as-possible timing and memory."""

    schedule: Schedule
    """The schedule that was simulated."""
    start: tuple[tuple[float, ...], ...]
    """start[d][i]: start time of device d's i-th op."""
    end: tuple[tuple[float, ...], ...]
    """end[d][i]: end time of device d's i-th op."""
    memory: tuple[MemoryTrace, ...]
    """memory[d]: (time, activation memory from then on) steps of device d."""
    peak_memory: tuple[float, ...]
    """Peak activation memory per device."""

    @property
    def makespan(self) -> float:
        """One step with an optimizer barrier (``core.objective``): time from 0 to the last end on any device, its
        tail included."""
        return self.objective("makespan")

    @property
    def work(self) -> tuple[float, ...]:
        """Busy time per device."""
        return tuple(sum(e - s for s, e in zip(ss, es)) for ss, es in zip(self.start, self.end))

    @property
    def span(self) -> tuple[float, ...]:
        """Per device, time from its first start to its last end, its tail included."""
        return self.device_shares("span")

    def device_shares(self, objective: str) -> tuple[float, ...]:
        """Per device, its share of ``objective``: its span, or its last end for "makespan", each with the device's
        tail (``Profile.device_tails``)."""
        tails = self.schedule.profile.device_tails(self.schedule.placement)
        return tuple(device_share(ss[0], es[-1], objective, tail) if ss else 0.0
                     for ss, es, tail in zip(self.start, self.end, tails))

    def objective(self, objective: str) -> float:
        """The schedule's ``objective`` (``core.objective.step``): longest per-device span ("span") or makespan
        ("makespan")."""
        return step(self.device_shares(objective))

    @property
    def bubble_rate(self) -> float:
        """Idle share of all devices: 1 - work / (p * makespan), floored at 0 against rounding."""
        return bubble(self.work, self.makespan)

    @property
    def paper_bubble(self) -> float:
        """The paper's bubble rate: (max span - max work) / max span."""
        return paper_bubble(max(self.span), max(self.work))

    @property
    def peak(self) -> float:
        """Largest peak activation memory over devices."""
        return max(self.peak_memory)

    def figures(self) -> dict[str, object]:
        """The headline figures as plain values."""
        return {"makespan": self.makespan, "bubble_rate": self.bubble_rate, "paper_bubble": self.paper_bubble,
                "peak_memory": self.peak, "peak_memory_per_device": list(self.peak_memory)}


_SLOTS = (F, B, W)
"""The identities of one (microbatch, stage), in key order (B and BW share the backward's)."""
_FUSED = -2
"""Position of the W of a backward run as BW (none is allowed)."""
_Row = tuple[int, int, float, int, float, int]
"""A pass's kind and stage on a route: (device, key offset, duration, dependency key offset, lag, key offset of
the W a BW stands for or 0)."""


class _Index:
    """Where every op of a schedule sits, found in one scan that checks every pass: a pass's identity
    has the flat key ``mb * (3S + 1) + 3 stage + slot``; each microbatch's spare key is "no dependency"."""

    def __init__(self, schedule: Schedule) -> None:
        self.schedule, self.microbatch_route = schedule, schedule.microbatch_route
        S, m, devices = schedule.num_stages, schedule.num_microbatches, schedule.devices
        self.S, self.m, self.stride = S, m, 3 * S + 1
        self.first = [0]
        for ops in devices:
            self.first.append(self.first[-1] + len(ops))
        n = self.first[-1]
        self.pos: list[int] = [-1] * (self.stride * m)
        """Op index of each key; -1: absent; ``_FUSED``: the W of a BW; a spare key: ``n``, no op."""
        self.pos[3 * S::self.stride] = [n] * m
        self.duration: list[float] = []
        self.dep_key: list[int] = []
        """Per op, the key of its (first pass's) dependency."""
        self.lag: list[float] = []
        self.extra: list[tuple[int, int, float]] = []
        """(op, key, lag): the dependency of an F&B pair's backward."""
        self.conflict = False
        """Whether some W sits beside a BW of the same microbatch and stage."""
        self._scan()
        self._check_complete()

    def key(self, p: Pass) -> int:
        """Flat key of the identity of ``p``."""
        return p.mb * self.stride + 3 * p.stage + _SLOTS.index(identity(p).kind)

    def where(self, g: int) -> tuple[int, int]:
        """(device, position) of op ``g``."""
        d = bisect_right(self.first, g) - 1
        return d, g - self.first[d]

    def op(self, g: int) -> Op:
        """Op ``g``."""
        d, i = self.where(g)
        return self.schedule.devices[d][i]

    def _rows(self, route: int) -> dict[Kind, list[_Row]]:
        """Per kind, each stage's row for microbatches of ``route`` (key offsets from the microbatch's first key)."""
        S, schedule = self.S, self.schedule
        devs, comm = schedule.placement.routes[route], schedule.profile.t_comm
        rows = {}
        for kind in KINDS:
            row = []
            for s in range(S):
                p = Pass(kind, 0, s)
                (dep,) = dependencies(p, S) or (None,)
                link = (3 * S, 0.0) if dep is None else (self.key(dep), lag(comm, devs[dep.stage], devs[s]))
                w_key = self.key(Pass(W, 0, s)) if kind == BW else 0
                row.append((devs[s], self.key(p), schedule.duration(p), *link, w_key))
            rows[kind] = row
        return rows

    def _scan(self) -> None:
        """Check and record each op in order: one whose passes are plainly fine through the tables, anything
        else with ``_place``, which raises at the first fault."""
        routes = [self._rows(r) for r in range(len(self.schedule.placement.routes))]
        probe, record = self._probe, self._record
        duration, dep_key, lags = self.duration, self.dep_key, self.lag
        g = 0
        for d, ops in enumerate(self.schedule.devices):
            for i, op in enumerate(ops):
                if type(op) is Pass:
                    if (found := probe(routes, d, op)) is not None:
                        base, (_, _, dur, dep, gap, _) = found
                        record(g, found)
                        duration.append(dur)
                        dep_key.append(base + dep)
                        lags.append(gap)
                        g += 1
                        continue
                elif type(op) is Pair and op.f.kind == F and op.b.kind in (B, BW) \
                        and (f := probe(routes, d, op.f)) is not None and (b := probe(routes, d, op.b)) is not None:
                    record(g, f)
                    record(g, b)
                    duration.append(self.schedule.duration(op))
                    dep_key.append(f[0] + f[1][3])
                    lags.append(f[1][4])
                    self.extra.append((g, b[0] + b[1][3], b[1][4]))
                    g += 1
                    continue
                self._place(d, i, g, op)
                g += 1

    def _probe(self, routes: list[dict[Kind, list[_Row]]], d: int, p: Pass) -> tuple[int, _Row] | None:
        """(first key of ``p``'s microbatch, ``p``'s row) when ``p`` is a known pass in range, on device ``d`` and
        not yet seen; else None."""
        kind, mb, stage = p
        if (0 <= mb < self.m and 0 <= stage < self.S
                and (row := routes[self.microbatch_route[mb]].get(kind)) is not None):
            base, entry = mb * self.stride, row[stage]
            if entry[0] == d and self.pos[base + entry[1]] < 0:
                return base, entry
        return None

    def _record(self, g: int, found: tuple[int, _Row]) -> None:
        """Record a probed pass at op ``g``: its key, and for a BW the W it stands for."""
        pos, (base, (_, off, _, _, _, w_off)) = self.pos, found
        if pos[base + off] == _FUSED:
            self.conflict = True
        pos[base + off] = g
        if w_off:
            if pos[base + w_off] == -1:
                pos[base + w_off] = _FUSED
            else:
                self.conflict = True

    def _place(self, d: int, i: int, g: int, op: Op) -> None:
        """Check and record op ``g`` (device ``d``, position ``i``) pass by pass; raise at the first fault."""
        S, m, schedule, pos = self.S, self.m, self.schedule, self.pos

        def fault(what: str) -> ScheduleError:
            return ScheduleError(f"device {d} position {i} ({op}): {what}")

        if isinstance(op, Pair) and (op.f.kind != F or op.b.kind not in (B, BW)):
            raise fault("an F&B pair needs an F and a B or BW")
        links = []
        for p in passes_of(op):
            if p.kind not in KINDS:
                raise fault(f"unknown pass kind {p.kind!r}")
            if not 0 <= p.mb < m:
                raise fault(f"microbatch {p.mb} out of range 0..{m - 1}")
            if not 0 <= p.stage < S:
                raise fault(f"stage {p.stage} out of range 0..{S - 1}")
            if (want := schedule.device_of(p)) != d:
                raise fault(f"pass {p} belongs on device {want}")
            k = self.key(p)
            if pos[k] >= 0:
                dd, ii = self.where(pos[k])
                raise fault(f"duplicate of {schedule.devices[dd][ii]} at device {dd} position {ii}")
            self.conflict = self.conflict or pos[k] == _FUSED
            pos[k] = g
            if p.kind == BW:
                w = self.key(Pass(W, p.mb, p.stage))
                self.conflict = self.conflict or pos[w] != -1
                pos[w] = pos[w] if pos[w] >= 0 else _FUSED
            base = p.mb * self.stride
            (dep,) = dependencies(p, S) or (None,)
            links.append((base + 3 * S, 0.0) if dep is None else
                         (self.key(dep), lag(schedule.profile.t_comm, schedule.device_of(dep), d)))
        self.duration.append(schedule.duration(op))
        self.dep_key.append(links[0][0])
        self.lag.append(links[0][1])
        self.extra += [(g, *link) for link in links[1:]]

    def _check_complete(self) -> None:
        """Every F and backward present, and a W exactly for each backward run as B."""
        if not self.conflict and -1 not in self.pos:
            return
        S, pos = self.S, self.pos
        for mb in range(self.m):
            for s in range(S):
                dev = self.schedule.device_of(Pass(F, mb, s))
                f, b, w = (self.key(Pass(kind, mb, s)) for kind in _SLOTS)
                if pos[f] < 0:
                    raise ScheduleError(f"device {dev}: missing pass {s}F{mb}")
                if pos[b] < 0:
                    raise ScheduleError(f"device {dev}: missing pass {s}B{mb} or {s}BW{mb}")
                op = self.op(pos[b])
                kind = (op.b if isinstance(op, Pair) else op).kind
                if kind == B and pos[w] < 0:
                    raise ScheduleError(f"device {dev}: missing pass {s}W{mb} (after {s}B{mb})")
                if kind == BW and pos[w] >= 0:
                    d, i = self.where(pos[w])
                    raise ScheduleError(f"device {d} position {i}: {s}W{mb} is extra, {s}BW{mb} already computes it")

    def preds(self) -> Preds:
        """Each op's dependencies for the timing engine: its first pass's, and an F&B pair's backward's."""
        pos, n = self.pos, len(self.duration)
        node = [pos[k] for k in self.dep_key]
        if not self.extra:
            return Preds([node], [self.lag])
        second, gaps = [n] * n, [0.0] * n
        for g, k, gap in self.extra:
            second[g], gaps[g] = pos[k], gap
        return Preds([node, second], [self.lag, gaps])


def _time(index: _Index) -> tuple[list[tuple[float, ...]], list[tuple[float, ...]]]:
    """As-soon-as-possible start and end of every op; a deadlock names each blocked pass."""
    schedule, first = index.schedule, index.first
    devices = schedule.devices
    orders = [range(first[d], first[d + 1]) for d in range(len(devices))]
    timing = asap(orders, index.duration, index.preds(), 0.0)
    if timing.deadlocked(orders):
        lines = []
        for d, ops in enumerate(devices):
            i = timing.reached[d]
            if i < len(ops):
                waits = [dep for p in passes_of(ops[i]) for dep in dependencies(p, index.S)
                         if timing.end[index.pos[index.key(dep)]] is None]
                dd, ii = index.where(index.pos[index.key(waits[0])])
                lines.append(f"device {d} position {i} ({ops[i]}) waits for {devices[dd][ii]} "
                             f"(device {dd} position {ii})")
        raise ScheduleError("deadlock: " + "; ".join(lines))
    return ([tuple(timing.start[first[d]:first[d + 1]]) for d in range(len(devices))],
            [tuple(timing.end[first[d]:first[d + 1]]) for d in range(len(devices))])


def _memory(schedule: Schedule, starts: Sequence[Sequence[float]], ends: Sequence[Sequence[float]]
            ) -> tuple[tuple[MemoryTrace, ...], tuple[float, ...]]:
    """Running activation memory per device (``memory.levels``) as steps in time: at each F's start, each B's and
    W's end, and a recomputing B's start; raise where it exceeds the limit."""
    traces, peaks = [], []
    for d in range(schedule.num_devices):
        limit = schedule.limit_of(d)
        start, end = starts[d], ends[d]
        top = -math.inf
        times, values = array("d", [0.0]), array("d", [0.0])
        for i, op, p, cur, inside in levels(schedule, d):
            times.append(start[i] if p[0] == F or inside else end[i])
            values.append(cur)
            if cur > top:
                top = cur
                if limit is not None and exceeds(cur, limit):
                    raise MemoryLimitError(
                        f"device {d} position {i} ({op}): memory {cur:g} exceeds the limit {limit:g}")
        traces.append(MemoryTrace(times, values))
        peaks.append(max(0.0, top))
    return tuple(traces), tuple(peaks)


def back_to_back(schedule: Schedule) -> Iterator[list[float]]:
    """Each device's last end (its origin where it runs nothing) after 1, 2, ... back-to-back steps of the valid
    ``schedule`` (``transforms.repeat``: no barrier, a device starts a step once it has ended its part of the one
    before), timed a step at a time from the ends of the one before: each step costs one timing of ``schedule``."""
    index = _Index(schedule)
    first, preds = index.first, index.preds()
    orders = [range(first[d], first[d + 1]) for d in range(schedule.num_devices)]
    ends = [0.0] * schedule.num_devices
    while True:
        end = asap(orders, index.duration, preds, ends).end
        ends = [end[order[-1]] if order else origin for order, origin in zip(orders, ends)]
        yield ends


def simulate(schedule: Schedule) -> Timeline:
    """Validate ``schedule`` and time it as soon as possible; raise ``ScheduleError`` if invalid."""
    starts, ends = _time(_Index(schedule))
    traces, peaks = _memory(schedule, starts, ends)
    return Timeline(schedule, tuple(starts), tuple(ends), traces, peaks)
