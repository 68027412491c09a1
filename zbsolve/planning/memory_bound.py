"""The split bound's memory terms: what a device's activation budget forces on every schedule, over every partition
and every recomputation a plan may choose, minimised with the split bound's head + work by CP-SAT.

A microbatch that a stage has started (its F begun: F's bytes count from its start) and not yet released (its W
ended) holds at least the stage's *hold* on that device: what F keeps until B ends, then what W reads until W ends,
so at least the smaller of the two, layer by layer (a recomputing B holds more while it runs). No microbatch holds
less than nothing, so a device whose activation budget (device memory - reserve - the static bytes of its stages)
admits at most k holds of stage s never has more than k microbatches of s in flight. On any placement of one route:

- **chain**: the i-th F of s to start waits for a release on s of a microbatch whose F started no earlier than the
  (i-k)-th, and a release comes at least T after its F started (T: F of s, the round trip through the later
  stages and back, B and W of s, each pass at the least it lasts in an overlapped pair, ``core.overlap.most_saved``,
  plus the least transfer for each device crossed), so the device's last pass ends at least head + ceil(m/k) T
  after the step begins (head: the forward of the stages before s, which no overlapped pair can shorten);
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
choices a plan may make (``menu``: every choice a plan or a baseline it may take can make is one such assignment),
shrinking the hold and lengthening B.
Times are floored where they add and ceiled where they subtract, bytes floored beside a budget ceiled, so the scaled
model never exceeds a schedule's step by more than a unit for each term rounded up: its optimum, or its proven bound
when the time runs out, less those units, bounds the step of every schedule on every partition with every
recomputation of the menu.
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
from zbsolve.core.overlap import OVERLAP_SAVING, OVERLAP_SLOWDOWN, most_saved
from zbsolve.core.placement import Placement
from zbsolve.io.exports import check_target
from zbsolve.costmodel.model import Model
from zbsolve.problem.partition import TIMES
from zbsolve.problem.recompute import parse_recompute
from zbsolve.problem.recompute_costs import layer_costs

RESOLUTION = 10**9
"""The model's largest step is scaled to about this many integer units."""
BYTES = 1024
"""The unit memory is counted in (bytes floored to it, the budget ceiled)."""
RATES = 2
"""The layer kinds (the most common) whose F per byte held bounds the F a device runs before its first B."""


class Option(NamedTuple):
    """One way a layer may run, as the memory terms read it."""

    hold: float
    """Bytes a microbatch holds from its F's start to its W's end, at least."""
    t_b: float
    """Seconds of its B run alone."""
    least_b: float
    """Seconds of its B at the least it lasts in an overlapped pair."""


@dataclass(frozen=True)
class Memory:
    """What the memory terms read besides the model and the placement."""

    room: int
    """Bytes of a device for static bytes and activations: device memory - reserve."""
    options: tuple[tuple[Option, ...], ...]
    """Per layer, the ways a plan may run it (``menu``)."""


class Outcome(NamedTuple):
    """What the memory model proves and finds."""

    bound: float
    """Seconds no schedule beats (infinite where no partition fits)."""
    counts: tuple[int, ...] | None
    """Layers per stage of the best partition found (None when none was)."""
    value: float
    """Its figure, in seconds (infinite when none was found)."""
    optimal: bool
    """Whether CP-SAT proved it optimal."""


def least(seconds: float, comm: float) -> float:
    """The least a pass of ``seconds`` (``comm`` of them communication) lasts inside an overlapped pair: a pair lasts
    at least its two passes less ``most_saved`` of them, and that saving is the sum of each pass's own."""
    return seconds - most_saved(seconds - comm, comm, OVERLAP_SAVING, OVERLAP_SLOWDOWN)


def menu(model: Model, recompute: str, target: str, room: int) -> Memory | None:
    """The memory terms' reading of a plan of ``model`` asked for ``recompute`` for ``target`` with ``room`` bytes a
    device: each block's options are those of the choice asked for (whole and not where it recomputes some blocks),
    or, where the plan decides ("auto", per-stage counts not given), every one its runtime's row may take (none, whole,
    selective, any of the row's Megatron modules: ``targets.may_take``). None where some option would keep fewer than
    no bytes (the terms need every microbatch to hold something)."""
    row = check_target(target)
    choice = None if recompute == "auto" else parse_recompute(recompute)
    if choice is None or choice.undecided:
        kinds: list[tuple[bool, bool, tuple[str, ...]]] = [(False, False, ())]
        kinds += [(True, False, ())] if {"full", "uniform", "per-stage"} & set(row.recompute) else []
        kinds += [(False, True, ())] if row.selective else []
        kinds += [(False, False, tuple(c)) for n in range(1, len(row.modules) + 1)
                  for c in itertools.combinations(row.modules, n)]
    else:
        base = (False, choice.selective, choice.modules)
        kinds = ([base] if choice.mode in ("none",) else [(True, False, ())] if choice.mode == "full"
                 else [base, (True, False, ())])
    options = []
    for i, layer in enumerate(model.layers):
        found = []
        for whole, selective, modules in kinds if layer.block else [(False, False, ())]:
            if selective and layer.t_sel is None or modules and not layer.recompute_modules:
                continue
            c = layer_costs(model, i, whole, selective, modules)
            if c["mem_f"] < 0:
                return None
            found.append(Option(min(c["mem_f"], -c["mem_w"]), c["t_b"], least(c["t_b"], c["comm_b"])))
        options.append(_pareto(found))
    return Memory(room, tuple(options))


def _pareto(options: list[Option]) -> tuple[Option, ...]:
    """``options`` less those another matches or beats in every figure."""
    kept: list[Option] = []
    for o in sorted(set(options)):
        if not any(k.hold <= o.hold and k.t_b <= o.t_b and k.least_b <= o.least_b for k in kept):
            kept.append(o)
    return tuple(kept)


def thresholds(num_microbatches: int, num_devices: int) -> list[int]:
    """The in-flight counts k < m the model distinguishes: every one up to 2p + 2 (where warm-up and cool-down idle
    change), and beyond, the largest k of each value of ceil(m/k) (where the chain changes). A device admitting k'
    not listed is taken as the next listed above, which claims less."""
    m = num_microbatches
    return sorted({k for k in range(1, m) if k <= 2 * num_devices + 2 or -(-m // k) != -(-m // (k + 1))})


def boundaries(cp: cp_model.CpModel, model: Model, num_stages: int) -> list:
    """Stage boundaries as variables (0 and the layer count fixed at the ends), each stage at least one layer with
    some F, B and W time; the split model's and the memory model's."""
    L, S = len(model.layers), num_stages
    bounds = [cp.new_constant(0)] + [cp.new_int_var(s, L - S + s, f"b{s}") for s in range(1, S)] \
        + [cp.new_constant(L)]
    for s in range(S):
        cp.add(bounds[s + 1] >= bounds[s] + 1)
    for name in TIMES:  # how many layers before each index have a positive time: every stage needs one
        counts = list(itertools.accumulate((getattr(layer, name) > 0 for layer in model.layers), initial=0))
        at = [cp.new_int_var(0, counts[-1], "") for _ in range(S + 1)]
        for s in range(S + 1):
            cp.add_element(bounds[s], counts, at[s])
        for s in range(S):
            cp.add(at[s + 1] >= at[s] + 1)
    return bounds


def memory_bound(model: Model, placement: Placement, num_microbatches: int, memory: Memory, hop: float, *,
                 floor: float, hint: Sequence[int] | None, time_limit: float, workers: int = 1) -> Outcome:
    """Minimise over partitions of ``model`` into ``placement``'s stages (one route) and over each layer's options
    the largest of the bounds above over devices, never below ``floor`` seconds (a bound already proven);
    ``hop`` is the least transfer between devices, ``hint`` layers per stage of a partition to start from."""
    layers, m, S, L = model.layers, num_microbatches, placement.num_stages, len(model.layers)
    route = placement.routes[0]
    held = [[s for s in range(S) if route[s] == d] for d in range(placement.num_devices)]
    total = sum(x.t_f + x.t_w for x in layers) + sum(max(o.t_b for o in opts) for opts in memory.options)
    scale = RESOLUTION / ((m + 4) * (total + 2 * S * hop)) if total > 0 else 1.0

    def lo(x: float) -> int:
        return math.floor(x * scale)

    def prefix(values: Sequence[int]) -> list[int]:
        return list(itertools.accumulate(values, initial=0))

    room = math.ceil((memory.room + TOLERANCE * max(1, memory.room)) / BYTES) + 1
    H = lo(hop)
    # Per layer: its hold (floored to BYTES), least B (scaled, floored) and B alone (ceiled) for each option. A layer
    # of several options is of the class of its options: a stage takes n of its class's layers with each option.
    figures = [tuple((int(o.hold) // BYTES, lo(o.least_b), math.ceil(o.t_b * scale)) for o in opts)
               for opts in memory.options]
    fixed = [f[0] if len(f) == 1 else (0, 0, 0) for f in figures]
    short_f = [lo(least(x.t_f, x.comm_f or 0.0)) for x in layers]
    classes = sorted({f for f in figures if len(f) > 1})
    long_f = [math.ceil(x.t_f * scale) for x in layers]
    # The rates of the most common layers (F per byte held, their option recomputing least), and each layer's F
    # beyond its hold at that rate, per option: a device's F before its first B is at most rate x budget + excess.
    kind_f = {f: max(x for x, g in zip(long_f, figures) if g == f) for f in set(figures)}  # each kind's longest F
    common = collections.Counter(f for f in figures if f[-1][0] > 0).most_common(RATES)
    rates = [(kind_f[f], f[-1][0]) for f, _ in common]

    def excess(rate: tuple[int, int], forward: int, hold: int) -> int:  # F beyond ``hold`` at ``rate``, ceiled
        return max(0, -(-(forward * rate[1] - rate[0] * hold) // rate[1]))

    beyond = [([excess(r, x, f[0][0]) if len(f) == 1 else 0 for x, f in zip(long_f, figures)],
               {c: [excess(r, kind_f[c], o[0]) for o in c] for c in classes}) for r in rates]
    tables: dict[object, list[int]] = {
        "forward": prefix([lo(x.t_f) for x in layers]),  # heads and the first forward: no pair shortens them
        "work": prefix([f + lo(least(x.t_w, 0.0)) + b[1] for x, f, b in zip(layers, short_f, fixed)]),
        "trip": prefix([f + b[1] for f, b in zip(short_f, fixed)]),
        "back": prefix([b[1] for b in fixed]),
        "fill": prefix([math.ceil(x.t_w * scale) + b[2] for x, b in zip(layers, fixed)]),
        "long_f": prefix(long_f),
        "static": prefix([x.static_bytes // BYTES if x.shares is None else 0 for x in layers]),
        "hold": prefix([b[0] for b in fixed]),
        **{c: prefix([f == c for f in figures]) for c in classes},
        **{("beyond", i): prefix(fixed_excess) for i, (fixed_excess, _) in enumerate(beyond)}}

    cp = cp_model.CpModel()
    bounds = boundaries(cp, model, S)
    looked: dict[tuple[object, int], object] = {}

    def at(name: object, s: int):  # the prefix table ``name`` at stage boundary s
        table = tables[name]
        if s in (0, S):
            return table[0 if s == 0 else L]
        if (name, s) not in looked:
            looked[name, s] = cp.new_int_var(0, table[-1], "")
            cp.add_element(bounds[s], table, looked[name, s])
        return looked[name, s]

    def span(name: object, s: int):
        return at(name, s + 1) - at(name, s)

    taken = [[[cp.new_int_var(0, tables[c][-1], "") for _ in c] for c in classes] for _ in range(S)]
    for s in range(S):
        for c, n in zip(classes, taken[s]):
            cp.add(sum(n) == span(c, s))

    def chosen(j: int, s: int):  # the hold (j = 0), least B (1) or B alone (2) of stage s's layers of a class
        return sum(x * o[j] for c, n in zip(classes, taken[s]) for x, o in zip(n, c))

    hold = [span("hold", s) + chosen(0, s) for s in range(S)]
    short_b = [chosen(1, s) for s in range(S)]
    cross = [int(route[t] != route[t + 1]) for t in range(S - 1)]
    head = [at("forward", s) + sum(cross[:s]) * H for s in range(S)]
    trip = [tables["trip"][L] - at("trip", s + 1) + sum(short_b[s + 1:]) + 2 * sum(cross[s:]) * H for s in range(S)]
    chain = [span("work", s) + short_b[s] + trip[s] for s in range(S)]
    fill = [span("fill", s) + chosen(2, s) for s in range(S)]
    objective = cp.new_int_var(0, 2 * RESOLUTION, "objective")
    cp.add(objective >= lo(floor))
    ks = thresholds(m, placement.num_devices)
    for stages in held:
        work = m * sum(span("work", s) + short_b[s] for s in stages)
        device_static = sum(span("static", s) for s in stages)
        top = stages[-1]
        first_b = (tables["forward"][L] + sum(cross) * H + tables["back"][L] - at("back", top + 1)
                   + sum(short_b[top + 1:]) + sum(cross[top:]) * H)
        room_f = {s: cp.new_int_var(0, m * tables["long_f"][L], "") for s in stages}  # F the device runs before a B
        area = {s: cp.new_int_var(0, 2 * RESOLUTION, "") for s in stages}  # m hold T / budget, at least
        cp.add(objective >= head[stages[0]] + work)
        cp.add(objective >= head[stages[0]] + sum(area.values()))
        cp.add(objective >= work + first_b - sum(room_f.values()))
        one = len(stages) == 1
        if not one:  # before its first B every F started is in flight: their holds share one budget
            fewest = cp.new_int_var(0, room, "")
            cp.add_min_equality(fewest, [hold[s] for s in stages])
            longest = cp.new_int_var(0, tables["long_f"][L], "")
            cp.add_max_equality(longest, [span("long_f", s) for s in stages])
            for k in thresholds(m * len(stages) + 1, placement.num_devices):
                at_most = cp.new_bool_var("")  # the budget admits at most k of the device's least holds
                cp.add((k + 1) * fewest + device_static <= room).only_enforce_if(~at_most)
                cp.add(sum(room_f.values()) <= k * longest).only_enforce_if(at_most)
        for i, (rate, (_, class_excess)) in enumerate(zip(rates, beyond)):  # F started before the first B
            over = sum(span(("beyond", i), s) + sum(x * e for c, n in zip(classes, taken[s])
                                                    for x, e in zip(n, class_excess[c])) for s in stages)
            cp.add(rate[1] * sum(room_f.values()) <= rate[0] * (room - device_static) + rate[1] * m * over)
        if one:
            cp.add(objective >= head[top] + work + trip[top] - (m - 1) * fill[top])
        for s in stages:
            cp.add(room_f[s] <= m * span("long_f", s))
            cp.add(hold[s] + device_static <= room)  # one microbatch fits
            cp.add(objective >= head[s] + chain[s])
            before = None
            for k in ks:
                at_most = cp.new_bool_var(f"k{s}_{k}")  # the budget admits at most k holds of s
                cp.add((k + 1) * hold[s] + device_static <= room).only_enforce_if(~at_most)
                cp.add(room_f[s] <= k * span("long_f", s)).only_enforce_if(at_most)
                cp.add(objective >= head[s] + -(-m // k) * chain[s]).only_enforce_if(at_most)
                cp.add((k + 1) * area[s] >= m * chain[s]).only_enforce_if(at_most)
                if one:
                    cool = trip[s] - (k - 1) * fill[s]
                    cp.add(objective >= head[s] + work + cool).only_enforce_if(at_most)
                    cp.add(objective >= work + first_b - room_f[s] + cool).only_enforce_if(at_most)
                if before is not None:
                    cp.add_implication(before, at_most)
                before = at_most
    cp.minimize(objective)
    if hint is not None:  # that partition, no layer recomputing
        ends = prefix(hint)
        for s in range(S):
            if 0 < s:
                cp.add_hint(bounds[s], ends[s])
            for c, n in zip(classes, taken[s]):
                fast = min(range(len(c)), key=lambda o: c[o][2])
                for o, x in enumerate(n):
                    cp.add_hint(x, tables[c][ends[s + 1]] - tables[c][ends[s]] if o == fast else 0)

    solver, status = solve_or_interrupt(cp, time_limit, workers)
    if status == cp_model.INFEASIBLE:
        return Outcome(math.inf, None, math.inf, True)
    slack = 1 + max(len(stages) for stages in held)  # each device's areas rounded up, a unit each
    proven = max(floor, (solver.best_objective_bound - slack) / scale)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return Outcome(proven, None, math.inf, False)
    ends = [solver.value(b) for b in bounds]
    return Outcome(proven, tuple(b - a for a, b in itertools.pairwise(ends)), solver.objective_value / scale,
                   status == cp_model.OPTIMAL)
