"""plan(): the split of a model's layers into stages, the placement and the schedule, chosen together for the
shortest step time (with an optimizer barrier) that fits the device memory.

Under one time limit:

1. **Split bound.** Per placement, CP-SAT finds the partition minimising the largest (head + work) over devices
   (``zbsolve.planning.split_bound``): a lower bound on the step time of every schedule on every partition of that
   placement, and the first candidate.
2. **Candidates.** That partition, the work-balancing partition, and the baselines' splits (uniform,
   torchtitan's, Megatron's) are timed by the heuristic and the simulator (``solve(..., solver="heuristic")``),
   in parallel processes (or on a Dask cluster); then each placement's best is improved by moving one stage
   boundary by one layer at a time (the moves ranked by the largest (head + work) they leave) until none improves,
   and the search goes on from the best partitions not yet searched from until its share of the time is spent.
3. **Schedule.** The three best candidates are solved by CP-SAT, sharing the time left. The plan is the best
   schedule found, and never worse than a baseline that fits (a baseline that beats it is taken, and the log says
   so).
"""

from __future__ import annotations

import concurrent.futures as cf
import itertools
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from zbsolve.schedulers.builtins import BUILTINS, builtin_schedule
from zbsolve.base.checks import check_count, check_size
from zbsolve.problem.costs import (
    DEFAULT_RESERVE,
    Costs,
    default_device_memory,
    device_static_bytes,
    memory_and_reserve,
    memory_figures,
    model_costs,
)
from zbsolve.io.document import to_document
from zbsolve.base.shown import Shown
from zbsolve.base.errors import InfeasibleError, InputError, ZbsolveError
from zbsolve.base.files import write_atomic
from zbsolve.base.parallel import make_executor
from zbsolve.schedulers.one_at_a_time import min_feasible_limits
from zbsolve.problem.model import Model, partition, stage_profile, untimed
from zbsolve.core.placement import make_placement
from zbsolve.core.simulator import Timeline, simulate
from zbsolve.optimize.solve import solve
from zbsolve.core.spec import PlanPlacement
from zbsolve.planning.split_bound import Figures, split_bound
from zbsolve.problem.splits import megatron_split, torchtitan_split
from zbsolve.core.step_time import StepTimes, step_times
from zbsolve.core.transforms import with_limit
from zbsolve.base.units import gib

AUTO = (("sequential", 1), ("interleaved", 2), ("vshape", 2))
"""(placement, stages per device) that "auto" searches."""
TIME_LIMIT = 60.0
"""Seconds a plan may take unless told."""
BOUND_SHARE, SEARCH_SHARE = 0.15, 0.5
"""Shares of the time limit for the split bounds and for the search of partitions (the rest is the final CP-SAT
solves')."""
BOUND_SECONDS = 5.0
"""The least time a placement's split model gets (a model of 80 layers in 32 stages takes about that)."""
CANDIDATE_SECONDS = 30.0
"""The most seconds the heuristic may take on one candidate."""
MOVES_PER_ROUND = 8
"""Boundary moves timed per round of the search (the most promising by the split model's figure)."""
SPLITS = ("uniform", "torchtitan", "megatron")
"""The splits of the baselines: equal blocks per stage, torchtitan's default, Megatron's with the embedding and
the loss counted as layers."""


@dataclass(frozen=True)
class Candidate:
    """A partition of a placement, timed by the heuristic and the simulator."""

    placement: str
    """"sequential", "interleaved" or "vshape"."""
    chunks: int
    """Stages per device."""
    counts: tuple[int, ...]
    """Layers per stage."""
    origin: str
    """Where it comes from: "split bound", "balance", a baseline's split, or "move"."""
    step_time: float
    """Seconds of a step with the barrier (infinity when nothing fits)."""


@dataclass(frozen=True)
class Baseline:
    """A built-in torch schedule on a baseline split, simulated on the same costs."""

    split: str
    """"uniform", "torchtitan" or "megatron"."""
    schedule: str
    """torch's schedule name (GPipe, 1F1B, Interleaved1F1B, InterleavedZeroBubble, ZBVZeroBubble, DualPipeV)."""
    counts: tuple[int, ...] | None
    """Layers per stage (None when the split does not exist for this model)."""
    step_time: float | None
    """Seconds of a step with the barrier."""
    bubble: float | None
    """1 - work / (devices x step_time)."""
    memory_gib: tuple[float, ...] | None
    """Per device, static bytes + peak activations, GiB."""
    fits: bool
    """Whether every device's memory and the reserve fit the device memory."""
    note: str = ""
    """Why there is no figure, when there is none."""

    def row(self) -> dict[str, object]:
        """The baseline as a table row."""
        return {"split": self.split, "schedule": self.schedule, "step_time": self.step_time, "bubble": self.bubble,
                "max GiB": max(self.memory_gib) if self.memory_gib else None, "fits": self.fits,
                "note": self.note}


@dataclass(frozen=True, repr=False)
class PlanResult(Shown):
    """The plan: partition, placement, schedule, step times, the bound over partitions, and the baselines."""

    placement: str
    """The chosen placement."""
    chunks: int
    """Stages per device."""
    costs: Costs
    """The model, its partition (``costs.stages``) and the device memory."""
    timeline: Timeline
    """The schedule (``timeline.schedule``) as the simulator times it."""
    source: str
    """Who made the schedule: "cpsat", "heuristic" or "baseline <split> <schedule>"."""
    lower_bound: float
    """Seconds no schedule on any partition of the placements searched beats."""
    baselines: tuple[Baseline, ...]
    """Built-in schedules on the baseline splits."""
    candidates: tuple[Candidate, ...]
    """Every partition timed, in the order timed."""
    plan_time: float
    """Wall time of the plan, seconds."""
    log: str
    """What each phase did."""
    interrupted: bool = False
    """Whether an interrupt stopped the search (the plan is the best found until then)."""

    @property
    def step_time(self) -> float:
        """Seconds of one step with an optimizer barrier: the makespan."""
        return self.timeline.makespan

    @cached_property
    def step_times(self) -> StepTimes:
        """Step time with and without the barrier, and their bubbles."""
        return step_times(self.timeline)

    @property
    def gap(self) -> float:
        """(step_time - lower_bound) / step_time."""
        return (self.step_time - self.lower_bound) / self.step_time if self.step_time > 0 else 0.0

    @property
    def counts(self) -> tuple[int, ...]:
        """Layers per stage."""
        return tuple(b - a for a, b in self.costs.stages)

    def best_baseline(self, split: str | None = None) -> Baseline | None:
        """The fastest baseline that fits (on ``split`` alone when given)."""
        fitting = [b for b in self.baselines if b.fits and b.step_time is not None and split in (None, b.split)]
        return min(fitting, key=lambda b: b.step_time, default=None)

    def summary(self) -> dict[str, object]:
        """The headline figures as plain values."""
        uniform, titan = self.best_baseline("uniform"), self.best_baseline("torchtitan")
        return {"placement": self.placement, "chunks": self.chunks, "partition": list(self.counts),
                "source": self.source, **self.step_times.figures(), "lower_bound": self.lower_bound, "gap": self.gap,
                "best uniform baseline": _named(uniform), "vs best uniform": _ratio(self.step_time, uniform),
                "best torchtitan baseline": _named(titan), "vs best torchtitan": _ratio(self.step_time, titan),
                **memory_figures(self.costs, self.timeline), "plan_time": self.plan_time,
                "interrupted": self.interrupted}

    def to_json(self, path: str | Path | None = None) -> dict:
        """The schedule document with the costs' sections and a "plan" section (bound, baselines, candidates);
        written to ``path`` (whole or not at all) when given."""
        plan = {**self.summary(), "baselines": [b.__dict__ | {"counts": list(b.counts or []) or None}
                                                for b in self.baselines],
                "candidates": [c.__dict__ | {"counts": list(c.counts)} for c in self.candidates], "log": self.log}
        doc = to_document(self.timeline, **self.costs.section(), plan=_finite(plan))
        if path is not None:
            write_atomic(path, json.dumps(doc, indent=1) + "\n")
        return doc

    def __repr__(self) -> str:
        return (f"PlanResult(placement={self.placement!r}, partition={list(self.counts)}, "
                f"step_time={self.step_time:.6g}, gap={self.gap:.4g}, source={self.source!r})")



def _named(baseline: Baseline | None) -> str | None:
    return None if baseline is None else f"{baseline.schedule} ({baseline.split})"


def _ratio(step: float, baseline: Baseline | None) -> float | None:
    return None if baseline is None or not baseline.step_time else step / baseline.step_time


def _finite(value: object) -> object:
    """``value`` with infinite floats as None, for JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


# -- baselines ------------------------------------------------------------------------------------------------
def baselines(model: Model, num_devices: int, num_microbatches: int, device_memory: int,
              reserve: int = DEFAULT_RESERVE) -> list[Baseline]:
    """Every built-in torch schedule on every baseline split, simulated on the model's costs."""
    rows = []
    for split in SPLITS:
        for name, builtin in BUILTINS.items():
            layout = make_placement(builtin.placement, num_devices, builtin.chunks)
            try:
                ranges = _split(split, model, layout.num_stages)
            except InputError as exc:
                rows.append(Baseline(split, name, None, None, None, None, False, str(exc)))
                continue
            counts = tuple(b - a for a, b in ranges)
            try:
                timeline = simulate(builtin_schedule(name, stage_profile(model, ranges), num_devices,
                                                     num_microbatches))
            except ZbsolveError as exc:
                rows.append(Baseline(split, name, counts, None, None, None, False, str(exc)))
                continue
            static = device_static_bytes(model.layers, ranges, timeline.schedule.placement)
            used = tuple(s + a for s, a in zip(static, timeline.peak_memory))
            rows.append(Baseline(split, name, counts, timeline.makespan, timeline.bubble_rate,
                                 tuple(gib(u) for u in used), all(u + reserve <= device_memory for u in used)))
    return rows


def _split(split: str, model: Model, num_stages: int) -> list[tuple[int, int]]:
    if split == "uniform":
        return partition(model, num_stages)
    if split == "torchtitan":
        return torchtitan_split(model, num_stages)
    return megatron_split(model, num_stages)


# -- the search -----------------------------------------------------------------------------------------------
@dataclass
class _Search:
    """The problem, the deadline, and what the search has found."""

    model: Model
    num_devices: int
    num_microbatches: int
    device_memory: int
    reserve: int
    deadline: float
    executor: cf.Executor
    parallel: int
    """Candidates the executor times at once (assumed 1 for an executor given from outside, unless told)."""
    log: list[str]
    progress: Callable[[str], None] | None
    timed: dict[tuple[str, int, tuple[int, ...]], Candidate] = field(default_factory=dict)

    def say(self, line: str) -> None:
        self.log.append(line)
        if self.progress is not None:
            self.progress(line)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def time_all(self, jobs: Sequence[tuple[str, int, tuple[int, ...], str]], until: float) -> list[Candidate]:
        """Time every (placement, chunks, counts, origin) not timed before, in parallel, until ``until`` (then
        the ones not started are dropped, and the first is waited for when none has finished); the timed ones,
        in order."""
        new: dict[tuple[str, int, tuple[int, ...]], str] = {}
        for pl, c, counts, origin in jobs:
            if (pl, c, counts) not in self.timed:
                new.setdefault((pl, c, counts), origin)
        limit = max(1.0, min(CANDIDATE_SECONDS, self.left()))
        futures = {self.executor.submit(_time_candidate, self.model, self.num_devices, self.num_microbatches, pl, c,
                                        counts, self.device_memory, self.reserve, limit): (pl, c, counts, origin)
                   for (pl, c, counts), origin in new.items()}
        try:
            for future in cf.as_completed(futures, timeout=max(0.0, until - time.monotonic())):
                self._keep(future, futures[future])
        except cf.TimeoutError:
            done = [f for f in futures if f.done()]
            keep = done or list(futures)[:1]  # when none has finished, the first is waited for
            for future in futures:
                if future not in keep:
                    future.cancel()
            for future in keep:
                self._keep(future, futures[future])
        return [self.timed[pl, c, counts] for pl, c, counts, _ in jobs if (pl, c, counts) in self.timed]

    def _keep(self, future: cf.Future, job: tuple[str, int, tuple[int, ...], str]) -> None:
        pl, c, counts, origin = job
        self.timed[pl, c, counts] = Candidate(pl, c, counts, origin, future.result())


def _time_candidate(model: Model, num_devices: int, num_microbatches: int, placement: str, chunks: int,
                    counts: tuple[int, ...], device_memory: int, reserve: int, time_limit: float) -> float:
    """Seconds of a step with the heuristic's schedule on this partition (infinity when nothing fits)."""
    try:
        result = solve(model, num_devices=num_devices, num_microbatches=num_microbatches, placement=placement,
                       chunks=chunks, partition=list(counts), device_memory=device_memory, reserve=reserve,
                       solver="heuristic", time_limit=time_limit, workers=1)
    except InfeasibleError:
        return math.inf
    return result.step_time


def _moves(model: Model, counts: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Partitions one layer away: a boundary moved by one, every stage left with some F, B and W time."""
    out = []
    for s in range(len(counts) - 1):
        for step in (-1, 1):
            moved = list(counts)
            moved[s] += step
            moved[s + 1] -= step
            if min(moved[s], moved[s + 1]) >= 1 and _timed(model, moved):
                out.append(tuple(moved))
    return out


def _timed(model: Model, counts: Sequence[int]) -> bool:
    """Whether every stage of the partition has some F, B and W time (as a profile needs)."""
    ends = [0, *itertools.accumulate(counts)]
    return all(untimed(model.layers[a:b]) is None for a, b in zip(ends, ends[1:]))


def search_placements(placement: str, chunks: int | None, num_devices: int, num_layers: int,
                      num_microbatches: int) -> list[tuple[str, int]]:
    """(placement, stages per device) a plan searches: those asked for with no more stages than layers; none left,
    or one over the size limit (``check_size``), is an ``InputError``."""
    if placement == "auto":
        asked = [(name, c if chunks is None or name == "sequential" else chunks) for name, c in AUTO]
    elif placement in ("sequential", "interleaved", "vshape"):
        asked = [(placement, 1 if placement == "sequential" else chunks or 2)]
    else:
        raise InputError(f"placement = {placement!r} is unknown; choose auto, sequential, interleaved or vshape")
    if placement == "vshape" and asked[0][1] % 2:
        raise InputError(f"chunks = {asked[0][1]} must be even for the vshape placement (smallest valid: 2)")
    fitting = [(name, c) for name, c in asked if c * num_devices <= num_layers]
    if not fitting:
        raise InputError(f"num_devices = {num_devices}: {asked[0][1] * num_devices} stages need at least as many "
                         f"layers, and the model has {num_layers}")
    for _, c in fitting:
        check_size(c * num_devices, num_microbatches)
    return fitting


def plan(model: Model | str | os.PathLike, *, num_devices: int, num_microbatches: int,
         device_memory: int | str | None = None, placement: PlanPlacement = "auto", chunks: int | None = None,
         time_limit: float = TIME_LIMIT,
         reserve: int | str = DEFAULT_RESERVE, jobs: int | None = None, executor: str | cf.Executor | None = None,
         progress: Callable[[str], None] | None = None) -> PlanResult:
    """Choose the partition of ``model``'s layers into stages, the placement ("auto": the best of sequential,
    interleaved and V-shape) and the schedule that make a training step with an optimizer barrier shortest, with
    every device's static bytes, peak activations and ``reserve`` within ``device_memory`` (default: the model's
    GPU's). ``model`` is a ``Model`` or the path of a model file.

    What runs in parallel: the split bounds of the placements and the timing of candidate partitions, ``jobs`` at a
    time in local worker processes (default: all cores; ``zbsolve.base.parallel.start_method``: a script without
    ``if __name__ == "__main__":`` and a notebook work as they are) or on ``executor``
    ("dask://HOST:PORT" or a ``concurrent.futures.Executor``); the final CP-SAT solves run in this process. An
    interrupt returns the best plan found so far."""
    began = time.monotonic()
    p, m = check_count("num_devices", num_devices), check_count("num_microbatches", num_microbatches)
    if isinstance(model, (str, os.PathLike)):
        model = Model.load(model)
    if not isinstance(model, Model):
        raise InputError(f"model = {model!r} must be a zbsolve.problem.model.Model or the path of a model file")
    missing = untimed(model.layers)
    if missing:
        raise InputError(f"{model.name}: {missing} = 0 on every layer: a model needs positive F, B and W times")
    if isinstance(time_limit, bool) or not isinstance(time_limit, (int, float)) or not time_limit > 0 \
            or not math.isfinite(time_limit):
        raise InputError(f"time_limit = {time_limit!r} must be a positive number of seconds")
    if chunks is not None:
        check_count("chunks", chunks)
    if jobs is not None:
        check_count("jobs", jobs)
    memory, spare = memory_and_reserve(_device_memory(model, device_memory), reserve)
    options = search_placements(placement, chunks, p, len(model.layers), m)
    log: list[str] = []
    parallel = jobs or (os.cpu_count() or 1 if executor is None else 1)
    pool, release = make_executor(executor, parallel)
    search = _Search(model, p, m, memory, spare, began + time_limit, pool, parallel, log, progress)
    interrupted, finished = False, False
    bound = math.inf
    try:
        bound = _bounds(search, options, time_limit * BOUND_SHARE, began + time_limit * (BOUND_SHARE + SEARCH_SHARE))
        _search(search, options, began + time_limit * (BOUND_SHARE + SEARCH_SHARE))
        finished = True
    except KeyboardInterrupt:
        interrupted = True
        search.say("interrupted: planning with the best partition found so far")
    finally:
        release(finished)
    rows = baselines(model, p, m, memory, spare)
    # A baseline can be the plan when it fits and its placement is one asked for.
    allowed = [b for b in rows if b.fits and b.step_time is not None
               and (BUILTINS[b.schedule].placement, BUILTINS[b.schedule].chunks) in options]
    if _best_of(search, lambda x: True) is None and not allowed:
        raise InfeasibleError(f"no partition of {model.name} over {p} devices fits device_memory "
                              f"{gib(memory):.2f} GiB (reserve {gib(spare):.2f} GiB) with any placement searched"
                              f"{_closest(search)}")
    timeline, source, costs, chosen = _schedule(search, interrupted)
    top = min(allowed, key=lambda b: b.step_time, default=None)
    if top is not None and (timeline is None or top.step_time < timeline.makespan):
        timeline, costs, chosen = _baseline_plan(model, p, m, memory, spare, top)
        source = f"baseline {top.split} {top.schedule}"
        search.say(f"the baseline {top.schedule} on the {top.split} split is the best schedule found: taking it")
    lower = min(bound, timeline.makespan) if math.isfinite(bound) else 0.0  # no bound computed proves nothing
    return PlanResult(chosen[0], chosen[1], costs, timeline, source, lower, tuple(rows),
                      tuple(search.timed.values()), time.monotonic() - began, "\n".join(log), interrupted)


def _closest(search: _Search) -> str:
    """What the candidate closest to fitting lacks (the device, its static bytes, one microbatch's activations and
    the reserve over the device memory) and what would help, or nothing when no candidate was timed."""
    misses = []
    for pl, c, counts in search.timed:
        layout = make_placement(pl, search.num_devices, c)
        profile, costs = model_costs(search.model, layout, list(counts), search.device_memory, search.reserve)
        uses = [{"static": static, "one microbatch's activations": need}
                for static, need in zip(costs.static_bytes, min_feasible_limits(profile, layout))]
        d = max(range(search.num_devices), key=lambda d: costs.over(uses[d]))
        misses.append((costs.over(uses[d]), pl, c, counts, costs, d, uses[d]))
    if not misses:
        return ""
    _, pl, c, counts, costs, d, uses = min(misses, key=lambda miss: miss[0])
    if costs.over({"static": uses["static"]}) > 0:
        helps = "more devices, or weights and optimizer states sharded further (zbsolve estimate --tp, --zero)"
    else:
        helps = ("more devices, a smaller microbatch or a shorter sequence (every candidate already runs one "
                 "microbatch at a time where it must); activation recomputation is not planned yet")
    return f"; the closest, {pl} x{c} {list(counts)}: {costs.shortfall(d, uses)}; what would help: {helps}"


def _device_memory(model: Model, device_memory: int | str | None) -> int | str:
    """The device memory as given, else the model's GPU's in bytes."""
    if device_memory is not None:
        return device_memory
    memory = default_device_memory(model)
    if memory is None:
        raise InputError("device_memory = None: give the memory per device (e.g. 80GiB); the model names no GPU "
                         "preset to take it from")
    return memory


def _bounds(search: _Search, options: list[tuple[str, int]], seconds: float, until: float) -> float:
    """Solve the split model of every placement (bound and balance, in parallel, ``seconds`` in all, at least
    ``BOUND_SECONDS`` each), then time their partitions and the baselines' splits; the least split bound."""
    layouts = []
    for name, c in options:
        layout = make_placement(name, search.num_devices, c)
        if layout.num_stages > len(search.model.layers):
            search.say(f"{name} x{c}: {layout.num_stages} stages but only {len(search.model.layers)} layers: skipped")
        else:
            layouts.append((name, c, layout))
    n = max(1, len(layouts))
    # Each placement's bound model takes `each`, its balance model a quarter of it, `parallel` at a time.
    each = min(max(BOUND_SECONDS, 2 * seconds / n), max(0.5, 0.3 * search.left() * search.parallel / (1.25 * n)))
    futures = {(name, c, heads): search.executor.submit(split_bound, search.model, layout, search.num_microbatches,
                                                          time_limit=each if heads else each / 4, heads=heads)
               for name, c, layout in layouts for heads in (True, False)}
    bound, jobs = math.inf, []
    for name, c, layout in layouts:
        tight, even = futures[name, c, True].result(), futures[name, c, False].result()
        bound = min(bound, tight.bound)
        search.say(f"{name} x{c}: split bound {tight.bound:.6g}s ({'proven' if tight.optimal else 'not proven'})")
        jobs += [(name, c, found.counts, origin) for found, origin in ((tight, "split bound"), (even, "balance"))
                 if found.counts is not None]
        for split in SPLITS:
            try:
                counts = tuple(b - a for a, b in _split(split, search.model, layout.num_stages))
            except InputError:
                continue
            if _timed(search.model, counts):
                jobs.append((name, c, counts, split))
    for candidate in search.time_all(jobs, until):
        search.say(f"{candidate.placement} x{candidate.chunks} {candidate.origin} {list(candidate.counts)}: "
                   f"{candidate.step_time:.6g}s")
    return bound


def _search(search: _Search, options: list[tuple[str, int]], until: float) -> None:
    """Local search until ``until``: from each placement's best partition, then from the best partitions not yet
    searched from, move stage boundaries by one layer while a move improves the step."""
    visited: set[tuple[str, int, tuple[int, ...]]] = set()
    firsts = [_best_of(search, lambda x, o=o: (x.placement, x.chunks) == o) for o in options]
    for start in [x for x in firsts if x is not None]:
        _descend(search, start, until, visited)
    while time.monotonic() < until:
        start = _best_of(search, lambda x: (x.placement, x.chunks, x.counts) not in visited)
        if start is None:
            return
        _descend(search, start, until, visited)


def _best_of(search: _Search, keep: Callable[[Candidate], bool]) -> Candidate | None:
    """The fastest timed candidate that ``keep`` accepts."""
    found = [x for x in search.timed.values() if math.isfinite(x.step_time) and keep(x)]
    return min(found, key=lambda x: x.step_time, default=None)


def _descend(search: _Search, current: Candidate, until: float, visited: set) -> None:
    """Move one stage boundary by one layer while a move improves ``current``: the ``MOVES_PER_ROUND`` moves that
    leave the least (head + work) first, the others when none of those improves."""
    name, c = current.placement, current.chunks
    figures = Figures.of(search.model, make_placement(name, search.num_devices, c), search.num_microbatches)
    visited.add((name, c, current.counts))
    while time.monotonic() < until:
        moves = sorted(_moves(search.model, current.counts), key=figures.largest_of)
        better = None
        for batch in (moves[:MOVES_PER_ROUND], moves[MOVES_PER_ROUND:]):
            timed = search.time_all([(name, c, counts, "move") for counts in batch], until)
            better = min((x for x in timed if x.step_time < current.step_time), key=lambda x: x.step_time,
                         default=None)
            if better is not None or time.monotonic() >= until:
                break
        if better is None:
            return
        current = better
        visited.add((name, c, current.counts))
        search.say(f"{name} x{c} move {list(current.counts)}: {current.step_time:.6g}s")


FINALISTS = 3
"""Candidates the final CP-SAT solves share the time left between, best first."""
FINISH_SECONDS = 0.5
"""Seconds kept after the final solves for re-simulating and returning the plan."""


def _schedule(search: _Search, interrupted: bool) -> tuple[Timeline | None, str, Costs | None, tuple[str, int]]:
    """The ``FINALISTS`` best candidates solved by CP-SAT in turn, each given an equal share of the time left (the
    best candidate's heuristic schedule when no time is left); the best schedule of them."""
    ranked = sorted((x for x in search.timed.values() if math.isfinite(x.step_time)), key=lambda x: x.step_time)
    if not ranked:
        return None, "", None, ("", 0)
    finalists = ranked[:FINALISTS] if search.left() > FINALISTS and not interrupted else ranked[:1]
    best: tuple[Timeline | None, str, Costs | None, tuple[str, int]] = (None, "", None, ("", 0))
    for k, candidate in enumerate(finalists):
        left = (search.left() - FINISH_SECONDS) / (len(finalists) - k)
        solver = "cpsat" if left > 1.0 and not interrupted else "heuristic"
        result = solve(search.model, num_devices=search.num_devices, num_microbatches=search.num_microbatches,
                       placement=candidate.placement, chunks=candidate.chunks, partition=list(candidate.counts),
                       device_memory=search.device_memory, reserve=search.reserve, solver=solver,
                       time_limit=max(left, 0.05), progress=search.progress)
        search.say(f"{solver} on {candidate.placement} x{candidate.chunks} {list(candidate.counts)}: "
                   f"{result.step_time:.6g}s ({result.status})")
        if best[0] is None or result.step_time < best[0].makespan:
            best = (result.timeline, solver, result.costs, (candidate.placement, candidate.chunks))
    return best


def _baseline_plan(model: Model, p: int, m: int, memory: int, reserve: int,
                   top: Baseline) -> tuple[Timeline, Costs, tuple[str, int]]:
    """A baseline taken as the plan: its schedule under the activation budgets, re-simulated."""
    name, c = BUILTINS[top.schedule].placement, BUILTINS[top.schedule].chunks
    layout = make_placement(name, p, c)
    profile, costs = model_costs(model, layout, list(top.counts), memory, reserve)
    schedule = with_limit(builtin_schedule(top.schedule, profile, p, m), costs.limits())
    return simulate(schedule), costs, (name, c)
