"""The memory-bubble frontier: the optimizer's best paper bubble at each memory limit, per placement,
beside the handcrafted families as (peak memory, bubble) points.

Independent solves run in parallel processes (``ProcessPool``, one solver thread each). A schedule found under
a smaller limit also fits every larger one, so each placement's frontier is made non-increasing in memory
by carrying the better schedule up. A ``progress`` callback hears of every finished solve; an interrupt
(Ctrl-C, or SIGTERM inside ``zbsolve.base.interrupt.signals_as_interrupt()``) stops the solves still running and keeps
the finished ones (the others are rows with status "interrupted").
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from concurrent.futures import as_completed
from dataclasses import dataclass

from zbsolve.base.checks import check_positive
from zbsolve.base.errors import InfeasibleError, InputError, ZbsolveError
from zbsolve.base.parallel import ProcessPool, shutdown_pool
from zbsolve.core import measures
from zbsolve.core.placement import CHUNKS, SUPPORTED_PLACEMENTS, check_placement
from zbsolve.core.profile import Profile
from zbsolve.core.schedule import Schedule, build
from zbsolve.core.simulator import simulate
from zbsolve.core.spec import make_spec
from zbsolve.optimize.result import meets_bound
from zbsolve.optimize.solve import solve_request
from zbsolve.problem.memory_factor import reference_peak
from zbsolve.problem.request import DEFAULT_PLACEMENTS, FRONTIER_TIME_LIMIT, Request
from zbsolve.schedulers.families import PLACEMENT_FAMILIES, make_schedule


@dataclass(frozen=True)
class FrontierRow:
    """The best schedule found for one placement under one memory limit."""

    placement: str
    mem_limit: float
    """Memory limit in profile units."""
    factor: float
    """The limit as a multiple of 1F1B's peak (mem_limit / Frontier.reference_peak)."""
    paper_bubble: float | None
    """(max span - max work) / max span; None when no schedule fits."""
    bubble_rate: float | None
    """1 - total work / (devices x makespan); None when no schedule fits."""
    status: str
    """solve()'s status, "infeasible", "carried" (a smaller limit's schedule was better) or "interrupted"."""
    gap: float | None
    """Relative gap to the limit's lower bound; None when no schedule fits."""
    schedule: Schedule | None
    """The schedule (None when no schedule fits)."""

    @property
    def bound_met(self) -> bool:
        """Whether the schedule meets the limit's lower bound (``solve.meets_bound``)."""
        return meets_bound(self.gap)

    def as_dict(self) -> dict[str, object]:
        """The row's figures as plain values (no schedule)."""
        return {"placement": self.placement, "mem_limit": self.mem_limit, "factor": self.factor,
                "paper_bubble": self.paper_bubble, "bubble_rate": self.bubble_rate, "status": self.status,
                "gap": self.gap, "bound_met": self.bound_met}


@dataclass(frozen=True)
class FamilyPoint:
    """A handcrafted family's schedule: its peak memory and bubble."""

    name: str
    placement: str
    peak_memory: float
    factor: float
    """peak_memory / 1F1B's peak."""
    paper_bubble: float

    def as_dict(self) -> dict[str, object]:
        """The point as plain values."""
        return {"name": self.name, "placement": self.placement, "peak_memory": self.peak_memory,
                "factor": self.factor, "paper_bubble": self.paper_bubble}


@dataclass(frozen=True)
class Frontier:
    """Frontier rows (by placement, then limit) and the families' points."""

    rows: tuple[FrontierRow, ...]
    families: tuple[FamilyPoint, ...]
    reference_peak: float
    """1F1B's peak memory: the unit of ``factor``."""
    interrupted: bool = False
    """Whether Ctrl-C stopped some solves (their rows have status "interrupted" unless carried)."""

    def to_json(self) -> dict[str, object]:
        """Rows and family points as plain values."""
        return {"reference_peak": self.reference_peak, "interrupted": self.interrupted,
                "rows": [r.as_dict() for r in self.rows], "families": [f.as_dict() for f in self.families]}


_Solved = tuple[str, Schedule | None, float, str, float]
"""One solve's outcome: (placement, schedule, lower bound, status, gap)."""


def _solve_one(profile: Profile, request: Request) -> _Solved:
    """One frontier solve in a worker process: (placement, schedule, lower bound, status, gap)."""
    try:
        result = solve_request(profile, request)
    except InfeasibleError:
        return request.placement, None, math.inf, "infeasible", math.nan
    return request.placement, result.schedule, result.lower_bound, result.status, result.gap


def frontier(profile: Profile, mem_limits: Sequence[float] | None = None, *, factors: Sequence[float] | None = None,
             num_microbatches: int, num_devices: int | None = None,
             placements: Sequence[str] = DEFAULT_PLACEMENTS, time_limit: float = FRONTIER_TIME_LIMIT,
             jobs: int | None = None, progress: Callable[[int, int], None] | None = None) -> Frontier:
    """Solve every (placement, memory limit) pair, ``jobs`` at a time in worker processes (default: all
    cores); ``progress(done, total)`` is called as solves finish. The limits are ``mem_limits`` in profile
    units or ``factors`` (multiples of 1F1B's peak activation memory): give exactly one. ``profile`` has one
    stage per device, is scalar, or has two chunk stages per device (merged for the sequential placement
    and for 1F1B's reference peak). An interrupt returns the finished solves with ``interrupted`` set."""
    p = num_devices if num_devices is not None else profile.num_stages
    if p is None:
        raise InputError("num_devices = None: give num_devices when every profile field is a scalar")
    if isinstance(jobs, bool) or jobs is not None and (not isinstance(jobs, int) or jobs < 1):
        raise InputError(f"jobs = {jobs!r} must be an integer >= 1 (smallest valid: 1) or None")
    for name in placements:
        check_placement(name, SUPPORTED_PLACEMENTS)
    values = _limit_values(mem_limits, factors)
    m = num_microbatches
    merged = profile.merge_chunks(p, CHUNKS)
    for name in placements:  # every problem is checked (its size too) before the first solve
        make_spec(merged if name == "sequential" else profile, None, num_microbatches=m, num_devices=p, placement=name,
                  chunks=CHUNKS)
    peak = reference_peak(profile, p, m)
    limits = [(x, x / peak) if mem_limits is not None else (x * peak, x) for x in values]
    # the objective is the span, as the frontier compares the paper's bubble
    request = Request(num_microbatches=m, num_devices=p, chunks=CHUNKS, objective="span", time_limit=time_limit,
                      workers=1)
    tasks = [(merged if name == "sequential" else profile, request.model_copy(update={"mem_limit": float(x),
                                                                                       "placement": name}))
             for name in placements for x, _ in limits]
    results, interrupted = _solve_all(tasks, jobs, progress)
    rows = []
    for k, name in enumerate(placements):
        solved = [results.get(k * len(limits) + j, (name, None, math.inf, "interrupted", math.nan))
                  for j in range(len(limits))]
        rows.extend(_placement_rows(name, limits, solved, m))
    return Frontier(tuple(rows), tuple(_family_points(profile, merged, p, m, placements, peak)), peak, interrupted)


def _limit_values(mem_limits: Sequence[float] | None, factors: Sequence[float] | None) -> list[float]:
    """The memory limits given, as ``mem_limits`` or as ``factors`` (exactly one), checked and sorted, each once."""
    if (mem_limits is None) == (factors is None):
        raise InputError("give mem_limits or factors, exactly one")
    kind = "mem_limit" if mem_limits is not None else "factor"
    given = mem_limits if mem_limits is not None else factors
    assert given is not None, "exactly one of mem_limits and factors is given"
    values = sorted(set(given))
    if not values:
        raise InputError(f"{kind}s is empty: give at least one memory limit")
    for x in values:
        check_positive(kind, x)
    return values


def _solve_all(tasks: list[tuple[Profile, Request]], jobs: int | None,
               progress: Callable[[int, int], None] | None) -> tuple[dict[int, _Solved], bool]:
    """The solves of ``tasks`` by index, ``jobs`` at a time in worker processes, and whether an interrupt stopped
    them (the finished ones are kept)."""
    results: dict[int, _Solved] = {}
    pool = ProcessPool(min(len(tasks), jobs or os.cpu_count() or 1))
    interrupted = False
    try:
        futures = {pool.submit(_solve_one, *task): k for k, task in enumerate(tasks)}
        for future in as_completed(futures):
            results[futures[future]] = future.result()
            if progress is not None:
                progress(len(results), len(tasks))
    except KeyboardInterrupt:
        interrupted = True
    finally:
        shutdown_pool(pool, not interrupted)
    return results, interrupted


def _placement_rows(name: str, limits: list[tuple[float, float]], solved: list[_Solved], m: int) -> list[FrontierRow]:
    """One placement's rows, one per (limit, factor) in increasing order from its solve there, a smaller limit's
    schedule carried up where it has the shorter span (rebuilt under this limit)."""
    rows = []
    best: Schedule | None = None
    best_span = math.inf
    for (x, factor), (_, schedule, bound, status, gap) in zip(limits, solved):
        timeline = simulate(schedule) if schedule is not None else None
        carried = best is not None and (timeline is None or best_span < max(timeline.span))
        if best is not None and carried:
            schedule = build(best.name, best.placement, m, best.profile, best.devices, x)
            timeline, status = simulate(schedule), "carried"
        if schedule is None or timeline is None:
            rows.append(FrontierRow(name, x, factor, None, None, status, None, None))
            continue
        span = max(timeline.span)
        shown: float | None = gap  # a carried schedule's gap is to this limit's bound
        if carried:
            shown = max(0.0, measures.gap(span, bound)) if math.isfinite(bound) else None
        rows.append(FrontierRow(name, x, factor, timeline.paper_bubble, timeline.bubble_rate, status, shown,
                                schedule))
        best, best_span = schedule, span
    return rows


def _family_points(profile: Profile, merged: Profile, p: int, m: int, placements: Sequence[str],
                   peak: float) -> list[FamilyPoint]:
    points = []
    for placement in placements:
        for name in PLACEMENT_FAMILIES.get(placement, ()):
            try:
                timeline = simulate(make_schedule(name, merged if placement == "sequential" else profile, p, m))
            except ZbsolveError:
                continue
            points.append(FamilyPoint(name, placement, timeline.peak, timeline.peak / peak, timeline.paper_bubble))
    return points

