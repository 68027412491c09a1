"""The simulator: the one judge of every schedule.

``simulate`` times a schedule as soon as possible from its per-device orders, checks it
(every pass exactly once, on its device, dependencies satisfiable, no deadlock, memory within
the limit) and returns its ``Timeline``. It knows nothing of how the schedule was made.
"""

from __future__ import annotations

from dataclasses import dataclass

from zbsolve.errors import MemoryLimitError, ScheduleError
from zbsolve.checks import exceeds
from zbsolve.dependencies import dependencies, identity, lag
from zbsolve.schedule import B, BW, F, KINDS, W, Pair, Pass, Schedule, passes_of
from zbsolve.timing import asap, device_objective


@dataclass(frozen=True)
class Timeline:
    """A validated schedule with its as-soon-as-possible timing and memory."""

    schedule: Schedule
    """The schedule that was simulated."""
    start: tuple[tuple[float, ...], ...]
    """start[d][i]: start time of device d's i-th op."""
    end: tuple[tuple[float, ...], ...]
    """end[d][i]: end time of device d's i-th op."""
    memory: tuple[tuple[tuple[float, float], ...], ...]
    """memory[d]: (time, activation memory from then on) steps of device d."""
    peak_memory: tuple[float, ...]
    """Peak activation memory per device."""

    @property
    def makespan(self) -> float:
        """Time from 0 to the last end on any device."""
        return max((e[-1] for e in self.end if e), default=0.0)

    @property
    def work(self) -> tuple[float, ...]:
        """Busy time per device."""
        return tuple(sum(e - s for s, e in zip(ss, es)) for ss, es in zip(self.start, self.end))

    @property
    def span(self) -> tuple[float, ...]:
        """Per device, time from its first start to its last end."""
        return self.device_objective("span")

    def device_objective(self, objective: str) -> tuple[float, ...]:
        """Per device, its share of ``objective``: its span, or its last end for "makespan"."""
        return tuple(device_objective(ss[0], es[-1], objective) if ss else 0.0 for ss, es in zip(self.start, self.end))

    def objective(self, objective: str) -> float:
        """The schedule's ``objective``: longest per-device span ("span") or makespan ("makespan")."""
        return max(self.device_objective(objective))

    @property
    def bubble_rate(self) -> float:
        """Idle share of all devices: 1 - work / (p * makespan), floored at 0 against rounding."""
        return max(0.0, 1.0 - sum(self.work) / (len(self.end) * self.makespan))

    @property
    def paper_bubble(self) -> float:
        """The paper's bubble rate: (max span - max work) / max span."""
        span = max(self.span)
        return max(0.0, (span - max(self.work)) / span)

    @property
    def peak(self) -> float:
        """Largest peak activation memory over devices."""
        return max(self.peak_memory)

    def figures(self) -> dict[str, object]:
        """The headline figures as plain values."""
        return {"makespan": self.makespan, "bubble_rate": self.bubble_rate, "paper_bubble": self.paper_bubble,
                "peak_memory": self.peak, "peak_memory_per_device": list(self.peak_memory)}


def _check_passes(schedule: Schedule) -> dict[tuple[str, int, int], tuple[int, int]]:
    """Every pass valid, on its device, exactly once; return where each pass sits."""
    S, m = schedule.num_stages, schedule.num_microbatches
    where: dict[Pass, tuple[int, int]] = {}
    kinds: dict[Pass, str] = {}
    for d, ops in enumerate(schedule.devices):
        for i, op in enumerate(ops):
            at = f"device {d} position {i} ({op})"
            if isinstance(op, Pair) and (op.f.kind != F or op.b.kind not in (B, BW)):
                raise ScheduleError(f"{at}: an F&B pair needs an F and a B or BW")
            for p in passes_of(op):
                if p.kind not in KINDS:
                    raise ScheduleError(f"{at}: unknown pass kind {p.kind!r}")
                if not 0 <= p.mb < m:
                    raise ScheduleError(f"{at}: microbatch {p.mb} out of range 0..{m - 1}")
                if not 0 <= p.stage < S:
                    raise ScheduleError(f"{at}: stage {p.stage} out of range 0..{S - 1}")
                if (want := schedule.device_of(p)) != d:
                    raise ScheduleError(f"{at}: pass {p} belongs on device {want}")
                k = identity(p)
                if k in where:
                    dd, ii = where[k]
                    raise ScheduleError(f"{at}: duplicate of {schedule.devices[dd][ii]} at device {dd} position {ii}")
                where[k], kinds[k] = (d, i), p.kind
    for mb in range(m):
        for s in range(S):
            dev = schedule.device_of(Pass(F, mb, s))
            for k, name in ((Pass(F, mb, s), f"{s}F{mb}"), (Pass(B, mb, s), f"{s}B{mb} or {s}BW{mb}")):
                if k not in where:
                    raise ScheduleError(f"device {dev}: missing pass {name}")
            has_w = Pass(W, mb, s) in where
            if kinds[Pass(B, mb, s)] == B and not has_w:
                raise ScheduleError(f"device {dev}: missing pass {s}W{mb} (after {s}B{mb})")
            if kinds[Pass(B, mb, s)] == BW and has_w:
                d, i = where[Pass(W, mb, s)]
                raise ScheduleError(f"device {d} position {i}: {s}W{mb} is extra, {s}BW{mb} already computes it")
    return where


def _time(schedule: Schedule, where: dict[Pass, tuple[int, int]]) -> tuple[list[list[float]], list[list[float]]]:
    """As-soon-as-possible start and end of every op; a deadlock names each blocked pass."""
    S, comm, devices = schedule.num_stages, schedule.profile.t_comm, schedule.devices
    first = [0]
    for ops in devices:
        first.append(first[-1] + len(ops))
    orders = [range(first[d], first[d + 1]) for d in range(len(devices))]
    duration = [schedule.duration(op) for ops in devices for op in ops]
    preds = []
    for d, ops in enumerate(devices):
        for op in ops:
            links = []
            for p in passes_of(op):
                for dep in dependencies(p, S):
                    dd, ii = where[dep]
                    links.append((first[dd] + ii, lag(comm, dd, d)))
            preds.append(links)
    timing = asap(orders, duration, preds, 0.0)
    if timing.deadlocked(orders):
        lines = []
        for d, ops in enumerate(devices):
            i = timing.reached[d]
            if i < len(ops):
                waits = [dep for p in passes_of(ops[i]) for dep in dependencies(p, S)
                         if timing.end[first[where[dep][0]] + where[dep][1]] is None]
                dd, ii = where[waits[0]]
                lines.append(f"device {d} position {i} ({ops[i]}) waits for {devices[dd][ii]} "
                             f"(device {dd} position {ii})")
        raise ScheduleError("deadlock: " + "; ".join(lines))
    return ([timing.start[first[d]:first[d + 1]] for d in range(len(devices))],
            [timing.end[first[d]:first[d + 1]] for d in range(len(devices))])


def _memory(schedule: Schedule, starts: list[list[float]], ends: list[list[float]]
            ) -> tuple[tuple[tuple[tuple[float, float], ...], ...], tuple[float, ...]]:
    """Running activation memory per device; raise where it exceeds the limit."""
    traces, peaks = [], []
    for d, ops in enumerate(schedule.devices):
        limit = schedule.limit_of(d)
        cur, peak, trace = 0.0, 0.0, [(0.0, 0.0)]
        for i, op in enumerate(ops):
            for p in passes_of(op):
                cur += schedule.memory_delta(p)
                trace.append((starts[d][i] if p.kind == F else ends[d][i], cur))
                peak = max(peak, cur)
                if limit is not None and exceeds(cur, limit):
                    raise MemoryLimitError(f"device {d} position {i} ({op}): memory {cur:g} exceeds the limit {limit:g}")
        traces.append(tuple(trace))
        peaks.append(peak)
    return tuple(traces), tuple(peaks)


def simulate(schedule: Schedule) -> Timeline:
    """Validate ``schedule`` and time it as soon as possible; raise ``ScheduleError`` if invalid."""
    where = _check_passes(schedule)
    starts, ends = _time(schedule, where)
    traces, peaks = _memory(schedule, starts, ends)
    return Timeline(schedule, tuple(map(tuple, starts)), tuple(map(tuple, ends)), traces, peaks)
