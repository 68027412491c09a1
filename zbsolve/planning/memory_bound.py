"""The split bound's memory terms: what a device's activation budget forces on every schedule, over every partition
and every recomputation a plan may choose, minimised with the split bound's head + work by CP-SAT.

A microbatch that a stage has started (its F begun: F's bytes count from its start) and not yet released (its W
ended) holds at least the stage's *hold* on that device: what F keeps until B ends, then what W reads until W ends,
so at least the smaller of the two, layer by layer (a recomputing B holds more while it runs). No microbatch holds
less than nothing, so a device whose activation budget (device memory - reserve - the static bytes of its stages)
admits at most k holds of stage s never has more than k microbatches of s in flight. On any placement of one route:

- **chain**: the i-th F of s to start waits for a release on s of a microbatch whose F started no earlier than the
  (i-k)-th, and a release comes at least T after its F started (T: F of s, the round trip through the later
  stages and back, B and W of s, each pass at the least it lasts in an overlapped pair
  (``optimize.bound_terms.least_in_pair``), plus the least transfer for each device crossed), so the device's last
  pass ends at least head + ceil(m/k) T after the step begins (head: the forward of the stages before s, which no
  overlapped pair can shorten);
- **warm-up**: until the device's first B can start (at the earliest, the first forward through every stage and
  the B back down to its highest stage), it runs only F, at most min(m, k) of each of its stages: the rest of that
  time it idles. Until then no microbatch is released, so its stages share one budget: the F it runs is at most
  k' times its longest stage's F, k' the holds of its least stage the budget admits, and at most the budget times
  the F per byte held of the commonest layers (``RATES``), plus m times each of its layers' F beyond that rate;
- **cool-down** (a device of one stage): after its last F, that microbatch's B waits a round trip, which only the B
  and W of the k - 1 other microbatches in flight can fill. Warm-up and cool-down are disjoint when k < m (the
  (k+1)-th F waits for a release, so some B runs before the last F); otherwise the larger of the two counts;
- **bytes over time**: the device never holds more than its budget, and each microbatch holds each stage's hold
  for at least that stage's T, so from its head to its last pass's end the device's time is at least
  m x (hold x T) / budget summed over its stages (taken as m T / (k + 1), the budget being under k + 1 holds).

So every device's last pass ends at least head + work + its idle after the step begins, at least each stage's
chain, and at least head + its bytes over time. Recomputation enters layer by layer: each layer takes any of the
choices a plan may make (``memory_terms``: every choice a plan or a baseline it may take can make is one such
assignment), shrinking the hold and lengthening B.
Times are floored where they add and ceiled where they subtract, bytes floored beside a budget ceiled, so the scaled
model never exceeds a schedule's step by more than a unit for each term rounded up: its optimum, or its proven bound
when the time runs out, less those units, bounds the step of every schedule on every partition with every
recomputation ``memory_terms`` reads.
"""

from __future__ import annotations

import collections
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from ortools.sat.python import cp_model

from zbsolve.base.checks import TOLERANCE
from zbsolve.base.interrupt import solve_or_interrupt
from zbsolve.core.placement import Placement
from zbsolve.costmodel.model import Model
from zbsolve.optimize.bound_terms import RESOLUTION, least_hop, least_in_pair, route_stages, stage_boundaries
from zbsolve.planning.memory_terms import MemoryTerms

BYTES = 1024
"""The unit memory is counted in (bytes floored to it, the budget ceiled)."""
RATES = 2
"""The layer kinds (the most common) whose F per byte held bounds the F a device runs before its first B."""


class MemoryBound(NamedTuple):
    """What the memory model proves and finds."""

    bound: float
    """Seconds no schedule beats (infinite where no partition fits)."""
    counts: tuple[int, ...] | None
    """Layers per stage of the best partition found (None when none was)."""
    value: float
    """Its figure, in seconds (infinite when none was found)."""
    optimal: bool
    """Whether CP-SAT proved it optimal."""


def thresholds(num_microbatches: int, num_devices: int) -> list[int]:
    """The in-flight counts k < m the model distinguishes: every one up to 2p + 2 (where warm-up and cool-down idle
    change), and beyond, the largest k of each value of ceil(m/k) (where the chain changes). A device admitting k'
    not listed is taken as the next listed above, which claims less."""
    m = num_microbatches
    return sorted({k for k in range(1, m) if k <= 2 * num_devices + 2 or -(-m // k) != -(-m // (k + 1))})


class ScaledOption(NamedTuple):
    """A ``RecomputeOption`` in the model's integer units."""

    hold: int
    """Its hold, floored to ``BYTES``."""
    least_b: int
    """Its least B in a pair, scaled and floored."""
    alone_b: int
    """Its B run alone, scaled and ceiled."""


_NONE = ScaledOption(0, 0, 0)
"""What a layer of several options adds to its stage's fixed terms (its class's counts add the rest)."""


class Rate(NamedTuple):
    """The F per byte held of a common layer kind: ``forward`` scaled seconds per ``hold`` units."""

    forward: int
    hold: int

    def excess(self, forward: int, hold: int) -> int:
        """F beyond ``hold`` at this rate, ceiled."""
        return max(0, -(-(forward * self.hold - self.forward * hold) // self.hold))


@dataclass(frozen=True)
class _Scaled:
    """What the memory model reads, in its integer units: per layer its options (a layer of several options is of
    the class of its options: a stage takes n of its class's layers with each option), prefix tables over layers
    by name, the F rates of the commonest layers and each class's F beyond them per option."""

    scale: float
    """Integer units per second."""
    budget: int
    """The device's usable bytes in ``BYTES``, ceiled."""
    hop: int
    """The least transfer between devices, scaled."""
    classes: list[tuple[ScaledOption, ...]]
    tables: dict[object, list[int]]
    rates: list[Rate]
    class_excess: list[dict[tuple[ScaledOption, ...], list[int]]]
    """Per rate, per class, each option's F beyond its hold at that rate."""

    def lo(self, seconds: float) -> int:
        """``seconds`` scaled, floored."""
        return math.floor(seconds * self.scale)


def _prefix(values: Sequence[int]) -> list[int]:
    return list(itertools.accumulate(values, initial=0))


def _scaled(model: Model, num_stages: int, m: int, memory: MemoryTerms, hop: float) -> _Scaled:
    """The model's data for ``memory`` (``_Scaled``)."""
    layers, S = model.layers, num_stages
    total = sum(x.t_f + x.t_w for x in layers) + sum(max(o.t_b for o in opts) for opts in memory.options)
    scale = RESOLUTION / ((m + 4) * (total + 2 * S * hop)) if total > 0 else 1.0

    def lo(x: float) -> int:
        return math.floor(x * scale)

    budget = math.ceil((memory.usable_bytes + TOLERANCE * max(1, memory.usable_bytes)) / BYTES) + 1
    figures = [tuple(ScaledOption(int(o.hold) // BYTES, lo(o.least_b), math.ceil(o.t_b * scale)) for o in opts)
               for opts in memory.options]
    fixed = [f[0] if len(f) == 1 else _NONE for f in figures]
    short_f = [lo(least_in_pair(x.t_f, x.comm_f or 0.0)) for x in layers]
    classes = sorted({f for f in figures if len(f) > 1})
    long_f = [math.ceil(x.t_f * scale) for x in layers]
    # The rates of the most common layers (F per byte held, their option recomputing least), and each layer's F
    # beyond its hold at that rate, per option: a device's F before its first B is at most rate x budget + excess.
    kind_f = {f: max(x for x, g in zip(long_f, figures) if g == f) for f in set(figures)}  # each kind's longest F
    common = collections.Counter(f for f in figures if f[-1].hold > 0).most_common(RATES)
    rates = [Rate(kind_f[f], f[-1].hold) for f, _ in common]
    fixed_excess = [[r.excess(x, f[0].hold) if len(f) == 1 else 0 for x, f in zip(long_f, figures)] for r in rates]
    class_excess = [{c: [r.excess(kind_f[c], o.hold) for o in c] for c in classes} for r in rates]
    tables: dict[object, list[int]] = {
        "forward": _prefix([lo(x.t_f) for x in layers]),  # heads and the first forward: no pair shortens them
        "work": _prefix([f + lo(least_in_pair(x.t_w, 0.0)) + b.least_b for x, f, b in zip(layers, short_f, fixed)]),
        "trip": _prefix([f + b.least_b for f, b in zip(short_f, fixed)]),
        "back": _prefix([b.least_b for b in fixed]),
        "fill": _prefix([math.ceil(x.t_w * scale) + b.alone_b for x, b in zip(layers, fixed)]),
        "long_f": _prefix(long_f),
        "static": _prefix([x.static_bytes // BYTES if x.shares is None else 0 for x in layers]),
        "hold": _prefix([b.hold for b in fixed]),
        **{c: _prefix([f == c for f in figures]) for c in classes},
        **{("beyond", i): _prefix(excess) for i, excess in enumerate(fixed_excess)}}
    return _Scaled(scale, budget, lo(hop), classes, tables, rates, class_excess)


class _PartitionModel:
    """The CP-SAT model over partitions and options: the stage boundaries, the prefix tables read at them, and
    how many of each class's layers each stage runs with each option (``taken``)."""

    def __init__(self, data: _Scaled, model: Model, num_stages: int) -> None:
        self.data, self.S, self.L = data, num_stages, len(model.layers)
        self.cp = cp_model.CpModel()
        self.bounds = stage_boundaries(self.cp, model, num_stages)
        self._looked: dict[tuple[object, int], cp_model.IntVar] = {}
        self.taken = [[[self.cp.new_int_var(0, data.tables[c][-1], "") for _ in c] for c in data.classes]
                      for _ in range(num_stages)]
        for s in range(num_stages):
            for c, n in zip(data.classes, self.taken[s]):
                self.cp.add(sum(n) == self.span(c, s))

    def total(self, name: object) -> int:
        """The table ``name`` over every layer."""
        return self.data.tables[name][self.L]

    def at(self, name: object, s: int) -> int | cp_model.IntVar:
        """The prefix table ``name`` at stage boundary s."""
        table = self.data.tables[name]
        if s in (0, self.S):
            return table[0 if s == 0 else self.L]
        if (name, s) not in self._looked:
            self._looked[name, s] = self.cp.new_int_var(0, table[-1], "")
            self.cp.add_element(self.bounds[s], table, self._looked[name, s])
        return self._looked[name, s]

    def span(self, name: object, s: int):
        """The table ``name`` over stage s's layers."""
        return self.at(name, s + 1) - self.at(name, s)

    def chosen(self, field: str, s: int):
        """The ``ScaledOption`` field of stage s's layers of a class, as their options are taken."""
        return sum(x * getattr(o, field) for c, n in zip(self.data.classes, self.taken[s]) for x, o in zip(n, c))

    def excess(self, i: int, s: int):
        """Stage s's F beyond its holds at rate i."""
        return self.span(("beyond", i), s) + sum(x * e for c, n in zip(self.data.classes, self.taken[s])
                                                  for x, e in zip(n, self.data.class_excess[i][c]))


class _Stages(NamedTuple):
    """Per stage, the terms of the bounds above, as expressions of the model."""

    hold: list
    short_b: list
    cross: list[int]
    """Per stage boundary, 1 where it crosses devices."""
    head: list
    trip: list
    chain: list
    fill: list


def _stage_terms(pm: _PartitionModel, route: Sequence[int]) -> _Stages:
    """The stages' holds, least B, heads, round trips, chains and cool-down fills."""
    S, H = pm.S, pm.data.hop
    hold = [pm.span("hold", s) + pm.chosen("hold", s) for s in range(S)]
    short_b = [pm.chosen("least_b", s) for s in range(S)]
    cross = [int(route[t] != route[t + 1]) for t in range(S - 1)]
    head = [pm.at("forward", s) + sum(cross[:s]) * H for s in range(S)]
    trip = [pm.total("trip") - pm.at("trip", s + 1) + sum(short_b[s + 1:]) + 2 * sum(cross[s:]) * H
            for s in range(S)]
    chain = [pm.span("work", s) + short_b[s] + trip[s] for s in range(S)]
    fill = [pm.span("fill", s) + pm.chosen("alone_b", s) for s in range(S)]
    return _Stages(hold, short_b, cross, head, trip, chain, fill)


def _add_device(pm: _PartitionModel, terms: _Stages, stages: list[int], objective, m: int, num_devices: int) -> None:
    """The bounds of the device running ``stages``: head + work + idle, bytes over time, and each stage's chain."""
    cp, H, budget = pm.cp, pm.data.hop, pm.data.budget
    work = m * sum(pm.span("work", s) + terms.short_b[s] for s in stages)
    device_static = sum(pm.span("static", s) for s in stages)
    last = stages[-1]
    first_b = (pm.total("forward") + sum(terms.cross) * H + pm.total("back") - pm.at("back", last + 1)
               + sum(terms.short_b[last + 1:]) + sum(terms.cross[last:]) * H)
    before_b = {s: cp.new_int_var(0, m * pm.total("long_f"), "") for s in stages}  # F the device runs before a B
    area = {s: cp.new_int_var(0, 2 * RESOLUTION, "") for s in stages}  # m hold T / budget, at least
    cp.add(objective >= terms.head[stages[0]] + work)
    cp.add(objective >= terms.head[stages[0]] + sum(area.values()))
    cp.add(objective >= work + first_b - sum(before_b.values()))
    one = len(stages) == 1
    if not one:
        _add_shared_budget(pm, terms, stages, device_static, before_b, m, num_devices)
    for i, rate in enumerate(pm.data.rates):  # F started before the first B
        over = sum(pm.excess(i, s) for s in stages)
        cp.add(rate.hold * sum(before_b.values()) <= rate.forward * (budget - device_static) + rate.hold * m * over)
    if one:
        cp.add(objective >= terms.head[last] + work + terms.trip[last] - (m - 1) * terms.fill[last])
    ks = thresholds(m, num_devices)
    for s in stages:
        cp.add(before_b[s] <= m * pm.span("long_f", s))
        cp.add(terms.hold[s] + device_static <= budget)  # one microbatch fits
        cp.add(objective >= terms.head[s] + terms.chain[s])
        before = None
        for k in ks:
            at_most = cp.new_bool_var(f"k{s}_{k}")  # the budget admits at most k holds of s
            cp.add((k + 1) * terms.hold[s] + device_static <= budget).only_enforce_if(~at_most)
            cp.add(before_b[s] <= k * pm.span("long_f", s)).only_enforce_if(at_most)
            cp.add(objective >= terms.head[s] + -(-m // k) * terms.chain[s]).only_enforce_if(at_most)
            cp.add((k + 1) * area[s] >= m * terms.chain[s]).only_enforce_if(at_most)
            if one:
                cool = terms.trip[s] - (k - 1) * terms.fill[s]
                cp.add(objective >= terms.head[s] + work + cool).only_enforce_if(at_most)
                cp.add(objective >= work + first_b - before_b[s] + cool).only_enforce_if(at_most)
            if before is not None:
                cp.add_implication(before, at_most)
            before = at_most


def _add_shared_budget(pm: _PartitionModel, terms: _Stages, stages: list[int], device_static, before_b: dict,
                       m: int, num_devices: int) -> None:
    """A device of several stages: before its first B every F started is in flight, so their holds share one
    budget, which admits at most k' holds of its least stage, each F at most its longest stage's."""
    cp, budget = pm.cp, pm.data.budget
    fewest = cp.new_int_var(0, budget, "")
    cp.add_min_equality(fewest, [terms.hold[s] for s in stages])
    longest = cp.new_int_var(0, pm.total("long_f"), "")
    cp.add_max_equality(longest, [pm.span("long_f", s) for s in stages])
    for k in thresholds(m * len(stages) + 1, num_devices):
        at_most = cp.new_bool_var("")  # the budget admits at most k of the device's least holds
        cp.add((k + 1) * fewest + device_static <= budget).only_enforce_if(~at_most)
        cp.add(sum(before_b.values()) <= k * longest).only_enforce_if(at_most)


def _add_hint(pm: _PartitionModel, hint: Sequence[int]) -> None:
    """Start from the partition of ``hint`` layers per stage, each layer's option the fastest B."""
    ends = _prefix(hint)
    for s in range(pm.S):
        if 0 < s:
            pm.cp.add_hint(pm.bounds[s], ends[s])
        for c, n in zip(pm.data.classes, pm.taken[s]):
            fast = min(range(len(c)), key=lambda o: c[o].alone_b)
            for o, x in enumerate(n):
                pm.cp.add_hint(x, pm.data.tables[c][ends[s + 1]] - pm.data.tables[c][ends[s]] if o == fast else 0)


def memory_bound(model: Model, placement: Placement, num_microbatches: int, memory: MemoryTerms, *, floor: float,
                 hint: Sequence[int] | None, time_limit: float, workers: int = 1) -> MemoryBound:
    """Minimise over partitions of ``model`` into ``placement``'s stages (one route) and over each layer's options
    the largest of the bounds above over devices, never below ``floor`` seconds (a bound already proven);
    ``hint`` is layers per stage of a partition to start from."""
    m, S = num_microbatches, placement.num_stages
    held = route_stages(placement.routes[0], placement.num_devices)
    data = _scaled(model, S, m, memory, least_hop(model))
    pm = _PartitionModel(data, model, S)
    terms = _stage_terms(pm, placement.routes[0])
    objective = pm.cp.new_int_var(0, 2 * RESOLUTION, "objective")
    pm.cp.add(objective >= data.lo(floor))
    for stages in held:
        _add_device(pm, terms, stages, objective, m, placement.num_devices)
    pm.cp.minimize(objective)
    if hint is not None:  # that partition, no layer recomputing
        _add_hint(pm, hint)

    solver, status = solve_or_interrupt(pm.cp, time_limit, workers)
    if status == cp_model.INFEASIBLE:
        return MemoryBound(math.inf, None, math.inf, True)
    slack = 1 + max(len(stages) for stages in held)  # each device's areas rounded up, a unit each
    proven = max(floor, (solver.best_objective_bound - slack) / data.scale)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return MemoryBound(proven, None, math.inf, False)
    ends = [solver.value(b) for b in pm.bounds]
    return MemoryBound(proven, tuple(b - a for a, b in itertools.pairwise(ends)), solver.objective_value / data.scale,
                       status == cp_model.OPTIMAL)
