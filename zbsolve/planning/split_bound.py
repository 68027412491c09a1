"""The split bound: over every partition of a model's layers into a placement's stages, the least step time that
no schedule can beat, and a partition that reaches it.

A device cannot start before the forward of microbatch 0 has crossed the stages before its first one (its
head), and then runs all of its passes one at a time, so a step lasts at least head + work on every device (where a
device holds two stages and passes communicate, its work less all the communication an overlapped pair could hide,
``core.overlap``). The integer program below (OR-Tools CP-SAT) chooses the stage boundaries that minimise the
largest head + work; its
optimum (or its proven bound, when the time runs out, and never less than the devices' work shared evenly) is a
lower bound on the step time of any schedule on any partition of this placement, and its partition is where the
planner's search starts. Given the device memory and the recomputation a plan may choose, a second model adds what
memory forces where only k microbatches fit in flight (``planning.memory_bound``: the chain of releases, the idle
of warm-up and cool-down, activation bytes over time, over every partition and recomputation); the bound is the
larger of the two, and its partition the second's.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from ortools.sat.python import cp_model

from zbsolve.base.interrupt import solve_or_interrupt
from zbsolve.core.placement import Placement
from zbsolve.costmodel.model import Model
from zbsolve.optimize.bound_terms import RESOLUTION, device_stages, least_hop, pair_saving, stage_boundaries
from zbsolve.planning.memory_bound import memory_bound
from zbsolve.planning.memory_terms import MemoryTerms


@dataclass(frozen=True)
class SplitBound:
    """What the split model proves and finds."""

    bound: float
    """Seconds no schedule on any partition of the placement beats (infinite where no partition exists)."""
    counts: tuple[int, ...] | None
    """Layers per stage of the best partition found (None when the time ran out before one was)."""
    value: float
    """Its largest head + work, in seconds, or with memory its figure in the memory model (the bound when proven
    optimal)."""
    optimal: bool
    """Whether CP-SAT proved the partition optimal."""


def split_bound(model: Model, placement: Placement, num_microbatches: int, *, time_limit: float = 10.0,
                heads: bool = True, workers: int = 1, memory: MemoryTerms | None = None) -> SplitBound:
    """Minimise over partitions of ``model`` into ``placement``'s stages the largest (head + work) over devices;
    ``heads=False`` balances the work alone (a partition to try, whose value is no bound on the step). With
    ``memory`` (a placement of one route), the first model has two thirds of the time, and the memory model
    (``memory_bound``), from the first's partition and above its bound, what it leaves."""
    began = time.monotonic()
    found = _head_and_work(model, placement, num_microbatches, heads,
                           time_limit if memory is None else time_limit * 2 / 3, workers)
    if memory is None or not heads or len(placement.routes) > 1 or not math.isfinite(found.bound):
        return found
    more = memory_bound(model, placement, num_microbatches, memory, floor=found.bound, hint=found.counts,
                        time_limit=time_limit - (time.monotonic() - began), workers=workers)
    if more.counts is None:
        return SplitBound(more.bound, found.counts if math.isfinite(more.bound) else None, found.value, False)
    return SplitBound(more.bound, more.counts, more.value, more.optimal)


def _head_and_work(model: Model, placement: Placement, num_microbatches: int, heads: bool, time_limit: float,
                   workers: int) -> SplitBound:
    """``split_bound`` without memory."""
    # -- data ----------------------------------------------------------------------------------------------
    m, S, L = num_microbatches, placement.num_stages, len(model.layers)
    figures = Figures.of(model, placement, m, heads)
    work, forward, hop, held = figures.work, figures.forward, figures.hop, figures.held
    longest = m * work[-1] + (forward[-1] + S * hop if heads else 0.0)  # the step's figure at its largest
    scale = RESOLUTION / longest if longest > 0 else 1.0
    W = [math.floor(m * x * scale) for x in work]
    Fh = [math.floor(x * scale) for x in forward]
    H = math.floor(hop * scale)

    # -- variables ---------------------------------------------------------------------------------------
    cp = cp_model.CpModel()
    bounds = stage_boundaries(cp, model, S)
    at_work = [cp.new_int_var(0, W[-1], f"w{s}") for s in range(S + 1)]
    at_forward = [cp.new_int_var(0, max(Fh), f"f{s}") for s in range(S + 1)]
    objective = cp.new_int_var(0, W[-1] + max(Fh) + S * H, "objective")

    # -- constraints ---------------------------------------------------------------------------------------
    for s in range(S + 1):
        cp.add_element(bounds[s], W, at_work[s])
        cp.add_element(bounds[s], Fh, at_forward[s])
    for stages in held:
        first = stages[0]
        cp.add(objective >= at_forward[first] + first * H + sum(at_work[s + 1] - at_work[s] for s in stages))

    # -- objective, a hint (even blocks of layers), and solve ----------------------------------------------------
    cp.minimize(objective)
    for s in range(1, S):
        cp.add_hint(bounds[s], round(s * L / S))
    solver, status = solve_or_interrupt(cp, time_limit, workers)
    # A device's figure reads its stages' prefixes, each floored: the scaled figure can be off by a unit per prefix.
    slack = 2 * max(len(stages) for stages in held) + 2
    proven = max((solver.best_objective_bound - slack) / scale, figures.even_share()) if heads else 0.0
    if status == cp_model.INFEASIBLE:  # no partition of this placement exists, so no schedule on it to bound
        return SplitBound(math.inf, None, math.inf, True)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return SplitBound(proven, None, math.inf, False)
    ends = [solver.value(b) for b in bounds]
    counts = tuple(b - a for a, b in zip(ends, ends[1:]))
    return SplitBound(proven, counts, figures.largest(ends), status == cp_model.OPTIMAL)


@dataclass(frozen=True)
class Figures:
    """What the split model reads of a model and a placement: prefix sums of the layers' work and forward times,
    the least hop between stages, and the stages each device holds."""

    work: list[float]
    """work[i]: F + B + W seconds of layers before i, one microbatch."""
    forward: list[float]
    """forward[i]: F seconds of layers before i (0 everywhere without heads)."""
    hop: float
    """Seconds of the cheapest move between stages (0 without heads)."""
    held: list[list[int]]
    """Per device, its stages in order."""
    num_microbatches: int
    """m."""

    @classmethod
    def of(cls, model: Model, placement: Placement, num_microbatches: int, heads: bool = True) -> "Figures":
        """The figures of ``model`` on ``placement``; ``heads=False`` leaves the heads out. Where a device holds two
        stages, a layer's work is less the most a pair can save of it (``optimize.bound_terms.pair_saving``)."""
        held = device_stages(placement)
        paired = any(len(stages) > 1 for stages in held)
        work, forward = [0.0], [0.0]
        for layer in model.layers:
            comm = (layer.comm_f or 0.0) + (layer.comm_b or 0.0)
            saved = pair_saving(layer.t_f + layer.t_b - comm, comm) if paired else 0.0
            work.append(work[-1] + layer.t_f + layer.t_b + layer.t_w - saved)
            forward.append(forward[-1] + (layer.t_f if heads else 0.0))
        return cls(work, forward, least_hop(model) if heads else 0.0, held, num_microbatches)

    def even_share(self) -> float:
        """The devices' work shared evenly (m x every layer's work / devices): no partition leaves its busiest device
        less, so it bounds the step however little of the split model was solved."""
        return self.num_microbatches * self.work[-1] / len(self.held)

    def largest(self, ends: Sequence[int]) -> float:
        """The largest head + work over devices of the partition with stage boundaries ``ends``, in seconds."""
        return max(self.forward[ends[stages[0]]] + stages[0] * self.hop
                   + self.num_microbatches * sum(self.work[ends[s + 1]] - self.work[ends[s]] for s in stages)
                   for stages in self.held)

    def largest_of(self, counts: Sequence[int]) -> float:
        """``largest`` of the partition with ``counts`` layers per stage."""
        return self.largest([0, *itertools.accumulate(counts)])
