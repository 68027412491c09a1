"""Formulation: the scheduling problem as integer data that every backend shares.

Passes F, B, W of every (microbatch, stage); dependency edges with their communication lag;
per-device disjunction (one pass at a time); the memory limit; the objective. Times are scaled
to integers (a power of 10), memory deltas to integers by exact rational arithmetic and their
gcd. Symmetry reduction: on a device, passes of one kind of one stage run in microbatch order,
so a device's first pass is F of microbatch 0 on its lowest stage and its last is a last W.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from zbsolve.base.checks import check_count, check_limit, slack
from zbsolve.base.errors import InputError
from zbsolve.core.dependencies import dependencies, identity, lag
from zbsolve.core.memory import fuses, need
from zbsolve.core.objective import check_objective, device_share, offset, step
from zbsolve.core.placement import Placement
from zbsolve.core.profile import Profile
from zbsolve.core.schedule import BW, B, F, Pair, Pass, Schedule, W, build
from zbsolve.core.timing import asap
from zbsolve.core.transforms import split_bw

_MAX_TIME_SCALE = 10**6


@dataclass(frozen=True, eq=False)
class Formulation:
    """One scheduling problem in integer form; pass ``i`` is ``passes[i]``."""

    placement: Placement
    """Stage-to-device map (one route)."""
    profile: Profile
    """Costs, one value per stage."""
    num_microbatches: int
    """Number of microbatches m."""
    mem_limit: float | tuple[float, ...] | None
    """The memory limit as given (profile units)."""
    objective: str
    """"span" (longest per-device span) or "makespan"."""
    passes: tuple[Pass, ...]
    """Every pass, in a topological order of ``edges`` and ``chains``."""
    device: tuple[int, ...]
    """Device of each pass."""
    duration: tuple[int, ...]
    """Scaled integer duration of each pass."""
    mem_delta: tuple[int, ...]
    """Scaled integer memory change of each pass."""
    mem_held: tuple[int, ...]
    """Scaled integer memory each pass holds while it runs, above the level before it (a recomputing B's)."""
    limit: tuple[int | None, ...]
    """Scaled integer memory limit per device (None: unlimited)."""
    time_scale: int
    """Integer time = profile time x time_scale."""
    exact_time: bool
    """False when scaled times had to be rounded."""
    mem_unit: Fraction
    """Profile memory = integer memory x mem_unit."""
    edges: tuple[tuple[int, int, int], ...]
    """(pred, succ, lag): succ starts at least ``lag`` after pred ends."""
    chains: tuple[tuple[int, ...], ...]
    """Passes of one kind of one stage in microbatch order (each runs after the previous)."""
    earliest: tuple[int, ...]
    """Earliest start of each pass."""
    first: tuple[int, ...]
    """Per device, the pass that starts it."""
    last: tuple[tuple[int, ...], ...]
    """Per device, the passes one of which ends it (the last W of each of its stages)."""
    tail: tuple[int, ...]
    """Per device, its scaled tail: seconds after its last pass that belong to its step (``Profile.device_tails``)."""
    fused: frozenset[int] = frozenset()
    """The stages whose backward runs as one BW (B and W fused): their B pass is the BW (its time, its memory
    change and what it holds), their W a pass of no time and no memory that marks where the BW's W would be."""

    @property
    def num_devices(self) -> int:
        """Number of devices p."""
        return self.placement.num_devices

    @property
    def offset(self) -> tuple[int, ...]:
        """Per device, what the objective subtracts from its last end (its first start for "span", less its
        tail)."""
        return tuple(offset(self.earliest[i], self.objective, tail) for i, tail in zip(self.first, self.tail))

    @property
    def work(self) -> tuple[int, ...]:
        """Busy time per device."""
        work = [0] * self.num_devices
        for d, t in zip(self.device, self.duration):
            work[d] += t
        return tuple(work)

    def device_passes(self) -> list[list[int]]:
        """Per device, its passes (in index order)."""
        out: list[list[int]] = [[] for _ in range(self.num_devices)]
        for i, d in enumerate(self.device):
            out[d].append(i)
        return out

    def stage_counts(self) -> list[int]:
        """Per device, how many stages it runs."""
        counts = [0] * self.num_devices
        for d in self.placement.routes[0]:
            counts[d] += 1
        return counts

    def to_time(self, value: float) -> float:
        """A scaled time back in profile units."""
        return value / self.time_scale

    # -- orders ---------------------------------------------------------------------
    def order_of(self, schedule: Schedule) -> list[list[int]]:
        """Per device, the pass indices of ``schedule`` in its order (BW split into B then W), same-kind
        passes put in microbatch order (lossless: memory depends only on the kinds' sequence)."""
        index = {p: i for i, p in enumerate(self.passes)}
        order: list[list[int]] = []
        for d, ops in enumerate(schedule.devices):
            idx = []
            for op in ops:
                if isinstance(op, Pair):
                    raise InputError(f"warm start op {op} on device {d}: F&B pairs are not supported by the optimizer")
                for p in split_bw(op):
                    if p not in index:
                        raise InputError(f"warm start pass {p} on device {d} is not a pass of this problem")
                    idx.append(index[p])
            slots: dict[tuple[str, int], list[int]] = {}
            for i in idx:
                slots.setdefault((self.passes[i].kind, self.passes[i].stage), []).append(i)
            sorted_slots = {k: iter(sorted(v, key=lambda i: self.passes[i].mb)) for k, v in slots.items()}
            order.append([next(sorted_slots[(self.passes[i].kind, self.passes[i].stage)]) for i in idx])
        return order

    def predecessors(self) -> list[list[tuple[int, int]]]:
        """Per pass, its (predecessor, lag) pairs: dependency edges and same-kind chain order (lag 0)."""
        return predecessors(len(self.passes), self.edges, self.chains)

    def asap(self, order: Sequence[Sequence[int]]) -> list[int]:
        """Scaled as-soon-as-possible start of every pass for per-device ``order``; raise on deadlock."""
        preds: list[list[tuple[int, int]]] = [[] for _ in self.passes]
        for a, b, gap in self.edges:
            preds[b].append((a, gap))
        timing = asap(order, self.duration, preds)
        if timing.deadlocked(order):
            raise InputError("order deadlocks: some pass waits for a pass placed after it")
        return timing.start

    def value(self, start: Sequence[int]) -> int:
        """Scaled objective of a timing: max over devices of last end minus offset (``spans``)."""
        return step(self.spans(start))

    def spans(self, start: Sequence[int]) -> list[int]:
        """Per device, its scaled share: last end minus offset (its tail added)."""
        return [device_share(self.earliest[first], max(start[i] + self.duration[i] for i in last), self.objective, tail)
                for first, last, tail in zip(self.first, self.last, self.tail)]

    def memory_ok(self, order: Sequence[Sequence[int]]) -> bool:
        """Whether every device's running memory stays within its limit."""
        for limit, seq in zip(self.limit, order):
            if limit is None:
                continue
            level = 0
            for i in seq:
                if level + need(self.mem_delta[i], self.mem_held[i]) > limit:
                    return False
                level += self.mem_delta[i]
        return True

    def order_from_starts(self, start: Sequence[int]) -> list[list[int]]:
        """Per device, passes sorted by start time."""
        return [sorted(ps, key=lambda i: (start[i], i)) for ps in self.device_passes()]

    def schedule(self, order: Sequence[Sequence[int]], name: str) -> Schedule:
        """The Schedule running ``order`` (unvalidated): a fused stage's B as its BW, its W left out."""
        def op(p: Pass) -> Pass | None:
            if p.stage not in self.fused or p.kind == F:
                return p
            return Pass(BW, p.mb, p.stage) if p.kind == B else None
        return build(name, self.placement, self.num_microbatches, self.profile,
                     [[q for i in seq if (q := op(self.passes[i])) is not None] for seq in order], self.mem_limit)

    # -- bounds -----------------------------------------------------------------------
    def latest(self, bound: int) -> list[int]:
        """Latest start of every pass if the objective is at most ``bound``."""
        succs: list[list[tuple[int, int]]] = [[] for _ in self.passes]
        for a, b, gap in self.edges:
            succs[a].append((b, gap))
        after = _certain_work(self.passes, self.duration, self.num_microbatches, self.placement.num_stages, False)
        offset = self.offset
        ls = [0] * len(self.passes)
        for i in range(len(self.passes) - 1, -1, -1):
            t = offset[self.device[i]] + bound - after[i] - self.duration[i]
            for b, gap in succs[i]:
                t = min(t, ls[b] - gap - self.duration[i])
            ls[i] = t
        return ls

    def index_of(self, kind: str, mb: int, stage: int) -> int:
        """Index of pass (kind, mb, stage)."""
        return _index(kind, mb, stage, self.num_microbatches, self.placement.num_stages)


def _index(kind: str, mb: int, stage: int, m: int, S: int) -> int:
    """F block, B block (stages descending), W block: a topological order of the edges and chains."""
    return (F, B, W).index(kind) * m * S + mb * S + (S - 1 - stage if kind == B else stage)


def _certain_work(passes: Sequence[Pass], duration: Sequence[int], m: int, S: int, before: bool) -> list[int]:
    """Per pass, work of same-stage passes that surely run before (or after) it on its device."""
    out = []
    for p in passes:
        tf, tb, tw = (duration[_index(k, 0, p.stage, m, S)] for k in (F, B, W))
        k = p.mb
        if before:
            n = {F: (k, 0, 0), B: (k + 1, k, 0), W: (k + 1, k + 1, k)}[p.kind]
        else:
            n = {F: (m - 1 - k, m - k, m - k), B: (0, m - 1 - k, m - k), W: (0, 0, m - 1 - k)}[p.kind]
        out.append(n[0] * tf + n[1] * tb + n[2] * tw)
    return out


def _time_scale(values: Sequence[float]) -> tuple[int, bool]:
    """Smallest power of 10 (up to 1e6) that makes every value integral; whether one exists."""
    scale = 1
    while scale <= _MAX_TIME_SCALE:
        if all(abs(v * scale - round(v * scale)) <= slack(v * scale) for v in values):
            return scale, True
        scale *= 10
    return _MAX_TIME_SCALE, False


def _mem_unit(values: Sequence[float]) -> Fraction:
    """The largest unit of which every memory delta is an integer multiple."""
    fracs = [Fraction(v).limit_denominator(10**9) for v in values if v != 0]
    if not fracs:
        return Fraction(1)
    den = math.lcm(*(f.denominator for f in fracs))
    return Fraction(math.gcd(*(int(f * den) for f in fracs)), den)


def _scaled(value: float, unit: Fraction) -> int:
    """A memory figure in integer units of ``unit`` (exact: ``unit`` divides it)."""
    return int(Fraction(value).limit_denominator(10**9) / unit)


def _scaled_limit(limit: float | None, unit: Fraction) -> int | None:
    if limit is None:
        return None
    x = Fraction(limit).limit_denominator(10**9) / unit
    return math.floor(x + Fraction(1, 10**9) * max(Fraction(1), abs(x)))


def formulate(profile: Profile, placement: Placement, num_microbatches: int,
              mem_limit: float | Sequence[float] | None = None, objective: str = "span",
              fuse: bool = False) -> Formulation:
    """The integer formulation of a problem (one route; F, B, W passes; memory counted from F starts and B, W ends,
    and inside a recomputing B), by the simulator's rules (``core.memory``, ``core.dependencies``). With ``fuse``,
    the stages whose backward needs less memory as one BW (``core.memory.fuses``) run it so: every order the
    simulator accepts is then feasible (a BW holds no more than B then W anywhere), though not at its best time
    where B and W apart would be faster."""
    check_objective(objective)
    if len(placement.routes) != 1:
        raise InputError(f"placement with {len(placement.routes)} routes is not supported by the optimizer")
    m, S, p = check_count("num_microbatches", num_microbatches), placement.num_stages, placement.num_devices
    profile = profile.expand(S)
    route = placement.routes[0]
    for s in range(S):
        mf, mb, mw = profile.memories(s)
        if mf < 0 or mw > 0:
            raise InputError(f"memory deltas of stage {s} = ({mf:g}, {mb:g}, {mw:g}): the optimizer needs "
                             "mem_f >= 0 and mem_w <= 0")
    limit = check_limit(mem_limit, p)
    limits = limit if isinstance(limit, tuple) else (limit,) * p
    tails = profile.device_tails(placement)
    fused = frozenset(s for s in range(S) if fuse and fuses(profile, s))
    bw = [(profile.time(BW, s), profile.delta(BW, s), profile.held_in(BW, s)) for s in fused]
    times = [t for s in range(S) for t in profile.durations(s)] + [t for t, *_ in bw] + [profile.t_comm, *tails]
    scale, exact = _time_scale(times)
    unit = _mem_unit([x for s in range(S) for x in (*profile.memories(s), profile.held_in(B, s))]
                     + [x for _, *mem in bw for x in mem])
    passes = sorted((Pass(kind, mb, s) for kind in (F, B, W) for mb in range(m) for s in range(S)),
                    key=lambda q: _index(q.kind, q.mb, q.stage, m, S))
    device = [route[q.stage] for q in passes]
    runs = [(BW if q.kind == B else None) if q.stage in fused and q.kind != F else q.kind for q in passes]
    duration = [0 if kind is None else round(profile.time(kind, q.stage) * scale) for q, kind in zip(passes, runs)]
    mem_delta = [0 if kind is None else _scaled(profile.delta(kind, q.stage), unit) for q, kind in zip(passes, runs)]
    mem_held = [0 if kind is None else _scaled(profile.held_in(kind, q.stage), unit) for q, kind in zip(passes, runs)]
    comm = round(profile.t_comm * scale)
    edges = []
    for mb in range(m):
        for s in range(S):
            for kind in (W, F, B):
                b = _index(kind, mb, s, m, S)
                for dep in dependencies(passes[b], S):
                    a = _index(identity(dep).kind, dep.mb, dep.stage, m, S)
                    edges.append((a, b, lag(comm, device[a], device[b])))
    chains = tuple(tuple(_index(k, mb, s, m, S) for mb in range(m)) for k in (F, B, W) for s in range(S))
    preds = predecessors(len(passes), edges, chains)
    es = _longest(preds, duration, [0] * len(passes))
    before = _certain_work(passes, duration, m, S, before=True)
    es = _longest(preds, duration, [es[_index(F, 0, q.stage, m, S)] + w for q, w in zip(passes, before)])
    first = [min((_index(F, 0, s, m, S) for s in range(S) if route[s] == d), default=-1) for d in range(p)]
    last = [tuple(_index(W, m - 1, s, m, S) for s in range(S) if route[s] == d) for d in range(p)]
    if -1 in first:
        raise InputError(f"device {first.index(-1)} runs no stage in this placement")
    return Formulation(placement, profile, m, limit,
                       objective, tuple(passes), tuple(device), tuple(duration), tuple(mem_delta), tuple(mem_held),
                       tuple(_scaled_limit(x, unit) for x in limits), scale, exact, unit,
                       tuple(edges), chains, tuple(es), tuple(first), tuple(last),
                       tuple(round(tail * scale) for tail in tails), fused)


def predecessors(n: int, edges: Sequence[tuple[int, int, int]],
                 chains: Sequence[Sequence[int]]) -> list[list[tuple[int, int]]]:
    """Per pass of ``n``, its (predecessor, lag) pairs from dependency ``edges`` and ``chains`` (lag 0)."""
    preds: list[list[tuple[int, int]]] = [[] for _ in range(n)]
    for a, b, gap in edges:
        preds[b].append((a, gap))
    for chain in chains:
        for a, b in itertools.pairwise(chain):
            preds[b].append((a, 0))
    return preds


def _longest(preds: Sequence[Sequence[tuple[int, int]]], duration: Sequence[int], floor: Sequence[int]) -> list[int]:
    """Earliest starts over a DAG given in topological index order, each at least ``floor``."""
    es = list(floor)
    for i, ps in enumerate(preds):
        for a, gap in ps:
            es[i] = max(es[i], es[a] + duration[a] + gap)
    return es
