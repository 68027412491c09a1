"""The search of partitions: each placement's split bound and balanced partition, the baselines' splits, then
stage boundaries moved one layer at a time while a move makes the heuristic's step shorter (or the step of the
runtime's own order, for a runtime that runs its own)."""

from __future__ import annotations

import concurrent.futures as cf
import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from zbsolve.base.errors import InfeasibleError, InputError
from zbsolve.core.placement import Placement, make_placement
from zbsolve.core.schedule import Schedule
from zbsolve.core.simulator import Timeline, simulate
from zbsolve.core.step_time import StepTimes
from zbsolve.core.transforms import with_limit
from zbsolve.costmodel.model import Model
from zbsolve.optimize.solve import solve_request
from zbsolve.optimize.warm_start import after_search
from zbsolve.planning.baselines import SPLITS, own_order_time
from zbsolve.planning.memory_terms import MemoryTerms
from zbsolve.planning.result import Candidate
from zbsolve.planning.split_bound import Figures, split_bound
from zbsolve.problem.costs import Costs
from zbsolve.problem.partition import timed
from zbsolve.problem.recompute import Recompute, parse_recompute
from zbsolve.problem.request import Request
from zbsolve.problem.splits import split_ranges

BOUND_SECONDS = 5.0
"""The least time a placement's split model gets (a model of 80 layers in 32 stages takes about that)."""
MEMORY_SHARE = 0.5
"""How much more time a placement's split bound gets for its memory terms (``split_bound``'s second model)."""
CANDIDATE_SECONDS = 30.0
"""The most seconds the heuristic may take on one candidate."""
FIRST_SHARE = 0.5
"""The share of the time left to the search that the search's first candidate may take: what finishing the plan
takes is measured on its schedule, so it cannot be kept before."""
MOVES_PER_ROUND = 8
"""Boundary moves timed per round of the search (the most promising by the split model's figure)."""


class Timed(NamedTuple):
    """What timing a candidate gives: its step, and the schedule that makes it with its costs."""

    step_time: float
    """Seconds of a step with the barrier (infinity when nothing fits)."""
    schedule: Schedule | None = None
    """The schedule timed (None when nothing fits, or for the runtime's own order, which is built again alike)."""
    costs: Costs | None = None
    """Its costs: the partition, the recomputation chosen and the device memory."""
    seconds: float = 0.0
    """Seconds the job took where it ran, from its start (not from its submission) to its result."""


@dataclass
class Search:
    """The problem, the deadline, and what the search has found."""

    model: Model
    request: Request
    """The plan's request: devices, microbatches, device memory and reserve (in bytes)."""
    deadline: float
    executor: cf.Executor
    parallel: int
    """Candidates the executor times at once (assumed 1 for an executor given from outside, unless told)."""
    log: list[str]
    progress: Callable[[str], None] | None
    accepts: Callable[[tuple[int, ...]], bool] = lambda counts: True
    """Whether the plan's runtime can take a partition (``targets.partition_refusal``); others are never timed."""
    own_schedule: Callable[[Model, int, int, Recompute], str | None] = lambda *_: None
    """The built-in schedule the plan's runtime runs for the model over so many devices with so many stages per
    device and a recomputation whatever the plan's order (``Target.schedule_of``), every candidate timed with it;
    None: each timed with the heuristic's order."""
    memory: MemoryTerms | None = None
    """What the split bounds' memory terms read: the device memory less the reserve and the recomputation the plan
    may choose (``planning.memory_terms``); None leaves them out."""
    timed: dict[tuple[str, int, str, tuple[int, ...]], Candidate] = field(default_factory=dict)
    """Every candidate timed, by (placement, chunks, recompute, counts)."""
    bound: float = math.inf
    """The least split bound of the placements searched, once every one is solved (infinity before: unknown)."""
    job_seconds: float | None = None
    """The longest a candidate's job has taken where it ran (``Timed.seconds``; None before the first)."""
    finish: tuple[Candidate, Timeline, StepTimes, float] | None = None
    """The first candidate kept, its schedule re-simulated under its activation budgets, its step times, and the
    seconds these and its document's text took (``finished``): what finishing a plan of this size takes, measured."""
    kept: tuple[Candidate, Schedule, Costs] | None = None
    """The fastest candidate timed with a schedule, that schedule and its costs: the plan unless a later phase
    beats it, so that no plan is slower than a schedule its search timed."""

    def log_line(self, line: str) -> None:
        """Add ``line`` to the log and tell ``progress``."""
        self.log.append(line)
        if self.progress is not None:
            self.progress(line)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    @property
    def num_devices(self) -> int:
        """The plan's devices."""
        p = self.request.num_devices
        assert p is not None, "a plan's request has its devices"
        return p

    def starts(self, stop_at: float, running: bool = False) -> bool:
        """Whether a job may start now (beside others where ``running``): the search's first job, alone, whatever
        the time (a plan needs one); later ones where the longest a job has taken still ends by ``stop_at``, and by the
        deadline less twice what finishing takes (``finish``: the plan's schedule made again, its document written)."""
        if self.job_seconds is None:
            return not running and not self.timed
        end = stop_at if self.finish is None else min(stop_at, self.deadline - 2 * self.finish[-1])
        return time.monotonic() + self.job_seconds <= end

    def time_all(self, jobs: Sequence[tuple[str, int, str, tuple[int, ...], str]], stop_at: float) -> list[Candidate]:
        """Time every (placement, chunks, recompute, counts, origin) not timed before, ``parallel`` at a time, each
        started only where ``starts`` says so, so that none is left running at ``stop_at``; the timed ones, in
        order."""
        new: dict[tuple[str, int, str, tuple[int, ...]], str] = {}
        for pl, c, rc, counts, origin in jobs:
            if (pl, c, rc, counts) not in self.timed and self.accepts(counts):
                new.setdefault((pl, c, rc, counts), origin)
        end = time.time() + stop_at - time.monotonic()  # the wall clock a worker reads as it starts
        p = self.num_devices
        waiting = list(new.items())
        running: dict[cf.Future, tuple[str, int, str, tuple[int, ...], str]] = {}
        while waiting or running:
            while waiting and len(running) < self.parallel and self.starts(stop_at, bool(running)):
                (pl, c, rc, counts), origin = waiting.pop(0)
                first = self.job_seconds is None  # its schedule measures finishing: it leaves time for that
                future = self.executor.submit(time_candidate, self.model, self.request.model_copy(update={
                    "placement": pl, "chunks": c, "recompute": rc, "partition": counts, "solver": "heuristic",
                    "time_limit": CANDIDATE_SECONDS, "workers": 1, "periodic": False}),
                    self.own_schedule(self.model, p, c, parse_recompute(rc)),
                    time.time() + FIRST_SHARE * (stop_at - time.monotonic()) if first else end)
                running[future] = (pl, c, rc, counts, origin)
            if not running:
                break
            done, _ = cf.wait(running, return_when=cf.FIRST_COMPLETED)
            for future in done:
                self._keep(future, running.pop(future))
        return [self.timed[job[:4]] for job in jobs if job[:4] in self.timed]

    def _keep(self, future: cf.Future, job: tuple[str, int, str, tuple[int, ...], str]) -> None:
        pl, c, rc, counts, origin = job
        timed: Timed = future.result()
        self.job_seconds = max(self.job_seconds or 0.0, timed.seconds)
        candidate = self.timed[pl, c, rc, counts] = Candidate(pl, c, counts, origin, timed.step_time, rc)
        if timed.schedule is not None and timed.costs is not None and (
                self.kept is None or timed.step_time < self.kept[0].step_time):
            self.kept = (candidate, timed.schedule, timed.costs)
            if self.finish is None:
                self.finish = finished(candidate, timed.schedule, timed.costs)


def finished(candidate: Candidate, schedule: Schedule, costs: Costs) -> tuple[Candidate, Timeline, StepTimes, float]:
    """``candidate``'s ``schedule`` re-simulated under its activation budgets, its step times, and the seconds these
    and its document's text took."""
    began = time.monotonic()
    timeline = simulate(with_limit(schedule, costs.limits()))
    times, *_ = after_search(timeline)
    return candidate, timeline, times, time.monotonic() - began


def time_candidate(model: Model, request: Request, own: str | None = None, end: float | None = None) -> Timed:
    """The step of the schedule ``request`` asks for (the heuristic's, on one partition, with that schedule and its
    costs; the built-in ``own`` where the runtime runs its own order, ``baselines.own_order_time``), infinity when
    nothing fits, and the seconds this took. ``end`` (``time.time()``) shortens the request's time limit to what is
    left when the job starts, at least a second."""
    began = time.monotonic()
    if end is not None:
        request = request.model_copy(update={"time_limit": max(1.0, min(request.time_limit, end - time.time()))})
    if own is not None:
        return Timed(own_order_time(model, request, own), seconds=time.monotonic() - began)
    try:
        result = solve_request(model, request, document=False)
    except InfeasibleError:
        return Timed(math.inf, seconds=time.monotonic() - began)
    return Timed(result.step_time, result.schedule, result.costs, time.monotonic() - began)


def moves(model: Model, counts: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Partitions one layer away: a boundary moved by one, every stage left with some F, B and W time."""
    out = []
    for s in range(len(counts) - 1):
        for step in (-1, 1):
            moved = list(counts)
            moved[s] += step
            moved[s + 1] -= step
            if min(moved[s], moved[s + 1]) >= 1 and timed(model, moved):
                out.append(tuple(moved))
    return out


def bounds(search: Search, options: list[tuple[str, int, str]], seconds: float, stop_at: float) -> None:
    """Solve the split model of every placement (bound and balance, in parallel, ``seconds`` in all, at least
    ``BOUND_SECONDS`` each), keep the least split bound (``Search.bound``: an interrupt after this keeps it; unknown
    where some placement's is not back by ``stop_at``), then time their partitions and the baselines' splits, round
    robin over the (placement, recomputation) options."""
    layouts = []
    for name, c in dict.fromkeys((name, c) for name, c, _ in options):
        layout = make_placement(name, search.num_devices, c)
        if layout.num_stages > len(search.model.layers):
            search.log_line(f"{name} x{c}: {layout.num_stages} stages but only {len(search.model.layers)} layers: "
                            "skipped")
        else:
            layouts.append((name, c, layout))
    n = max(1, len(layouts))
    # Each placement's bound model takes `each` (and MEMORY_SHARE more with memory terms), its balance model a
    # quarter of it, `parallel` at a time.
    more = 1.0 + (MEMORY_SHARE if search.memory is not None else 0.0)
    each = min(max(BOUND_SECONDS, 2 * seconds / n),
               max(0.5, 0.3 * search.left() * search.parallel / ((more + 0.25) * n)))
    m = search.request.num_microbatches
    futures = {(name, c, heads): search.executor.submit(split_bound, search.model, layout, m,
                                                          time_limit=each * more if heads else each / 4,
                                                          heads=heads,
                                                          memory=search.memory if heads else None)
               for name, c, layout in layouts for heads in (True, False)}
    # The first option's first baseline split is timed while the bound models run: the plan's first candidate (and
    # the measure of a job and of finishing, ``Search.starts``) does not wait for them.
    first = [(name, c, rc, counts, split) for name, c, layout in layouts[:1]
             for counts, split in _splits(search, layout) for n, k, rc in options[:1] if (n, k) == (name, c)]
    search.time_all(first[:1], stop_at)
    bound, queues, stopped_early = math.inf, [], False
    for name, c, layout in layouts:
        try:
            tight, even = (futures[name, c, heads].result(timeout=max(0.0, stop_at - time.monotonic()))
                           for heads in (True, False))
        except cf.TimeoutError:  # the search's time is up: this placement's bound unknown, and so the plan's
            stopped_early, found = True, []
            search.log_line(f"{name} x{c}: split bound unknown: not solved within the search's time")
        else:
            bound = min(bound, tight.bound)
            search.log_line(f"{name} x{c}: split bound " + (
                f"{tight.bound:.6g}s ({'proven' if tight.optimal else 'not proven'})" if math.isfinite(tight.bound)
                else "infinite: no partition gives every stage F, B and W time and fits the device memory"))
            found = [(x.counts, origin) for x, origin in ((tight, "split bound"), (even, "balance"))
                     if x.counts is not None]
        found += _splits(search, layout)
        queues += [[(name, c, rc, counts, origin) for counts, origin in found]
                   for n, k, rc in options if (n, k) == (name, c)]
    for future in futures.values():
        future.cancel()  # those not started, once the search's time is up
    search.bound = math.inf if stopped_early else bound
    # Round robin: every option's first partition is timed before any option's second, so that a deadline leaves
    # no placement untimed.
    jobs = [job for rank in itertools.zip_longest(*queues) for job in rank if job is not None]
    for candidate in search.time_all(jobs, stop_at):
        search.log_line(f"{candidate.label()} {candidate.origin} {list(candidate.counts)}: {candidate.step_time:.6g}s")


def _splits(search: Search, layout: Placement) -> list[tuple[tuple[int, ...], str]]:
    """The baselines' splits of the model over ``layout``'s stages that give every stage F, B and W time."""
    found = []
    for split in SPLITS:
        try:
            counts = tuple(b - a for a, b in split_ranges(split, search.model, layout.num_stages))
        except InputError:
            continue
        if timed(search.model, counts):
            found.append((counts, split))
    return found


def local_search(search: Search, options: list[tuple[str, int, str]], stop_at: float) -> None:
    """Local search until ``stop_at``: from each placement's best partition, then from the best partitions not yet
    searched from, move stage boundaries by one layer while a move improves the step."""
    visited: set[tuple[str, int, str, tuple[int, ...]]] = set()
    firsts = [best_of(search, _of_option(o)) for o in options]
    for first in [x for x in firsts if x is not None]:
        descend(search, first, stop_at, visited)
    while search.starts(stop_at):
        start = best_of(search, lambda x: x.key() not in visited)
        if start is None:
            return
        descend(search, start, stop_at, visited)


def _of_option(option: tuple[str, int, str]) -> Callable[[Candidate], bool]:
    """Whether a candidate is of ``option``: its (placement, chunks, recompute)."""
    return lambda x: (x.placement, x.chunks, x.recompute) == option


def best_of(search: Search, keep: Callable[[Candidate], bool]) -> Candidate | None:
    """The fastest timed candidate that ``keep`` accepts."""
    found = [x for x in search.timed.values() if math.isfinite(x.step_time) and keep(x)]
    return min(found, key=lambda x: x.step_time, default=None)


def descend(search: Search, current: Candidate, stop_at: float, visited: set) -> None:
    """Move one stage boundary by one layer while a move improves ``current``: the ``MOVES_PER_ROUND`` moves that
    leave the least (head + work) first, the others when none of those improves."""
    name, c, rc = current.placement, current.chunks, current.recompute
    layout = make_placement(name, search.num_devices, c)
    figures = Figures.of(search.model, layout, search.request.num_microbatches)
    visited.add(current.key())
    while search.starts(stop_at):
        ranked = sorted(moves(search.model, current.counts), key=figures.largest_of)
        better = None
        for batch in (ranked[:MOVES_PER_ROUND], ranked[MOVES_PER_ROUND:]):
            found = search.time_all([(name, c, rc, counts, "move") for counts in batch], stop_at)
            better = min((x for x in found if x.step_time < current.step_time), key=lambda x: x.step_time,
                         default=None)
            if better is not None or not search.starts(stop_at):
                break
        if better is None:
            return
        current = better
        visited.add(current.key())
        search.log_line(f"{current.label()} move {list(current.counts)}: {current.step_time:.6g}s")
