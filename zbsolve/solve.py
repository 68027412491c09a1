"""solve(): the best schedule the optimizer finds for a profile and a memory budget.

The paper's heuristic (and the handcrafted families that fit the budget) give the warm start;
a backend improves it; the result is always re-simulated, and never worse than the warm start.
Ctrl-C during a solve stops the backend and returns the best schedule found so far (status
"feasible" if it beats the warm start, else "heuristic"); the log says it was interrupted.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from zbsolve.backends import BACKENDS, BackendResult, Log
from zbsolve.bound import lower_bound, warmup_bound
from zbsolve.document import to_document
from zbsolve.checks import TOLERANCE, check_count
from zbsolve.errors import InputError, ZbsolveError
from zbsolve.families import FAMILIES, PLACEMENT_FAMILIES, make_schedule
from zbsolve.formulation import Formulation, formulate
from zbsolve.heuristic import heuristic
from zbsolve.placement import CHUNKS, vshape
from zbsolve.profile import Profile
from zbsolve.render import figures_html, figures_table
from zbsolve.schedule import Schedule
from zbsolve.simulator import Timeline, simulate
from zbsolve.spec import PlacementName, Spec, make_spec
from zbsolve.timing import OBJECTIVES, Objective
from zbsolve.transforms import with_limit
from zbsolve.vgreedy import v_greedy

SolverName = Literal["cpsat", "cbc", "heuristic"]
"""A backend by name, or "heuristic" for the warm start alone."""
SOLVERS: tuple[str, ...] = get_args(SolverName)
TIME_LIMIT = 60.0
"""Seconds a solve may take unless told."""
BOUND_SHARE, BOUND_SECONDS = 0.15, 15.0
"""The warm-up relaxation bound gets this share of the time limit, at most this many seconds."""
RESERVE_SHARE, RESERVE_SECONDS = 0.03, 3.0
"""Kept back from the backend for rebuilding and re-simulating its schedule, so a solve ends within its limit."""


@dataclass(frozen=True)
class SolveResult:
    """What ``solve`` found: a validated schedule, its figures, and how good it provably is."""

    schedule: Schedule
    """The schedule (validated by the simulator)."""
    timeline: Timeline
    """The simulator's timing of ``schedule``."""
    objective: float
    """Objective value: longest per-device span ("span") or makespan, in profile time units."""
    objective_kind: str
    """Which objective was minimised: "span" or "makespan"."""
    lower_bound: float
    """A proven lower bound on the objective, in profile time units."""
    gap: float
    """(objective - lower_bound) / objective; 0 means proven optimal."""
    status: str
    """"optimal" (proven), "feasible" (improved, not proven) or "heuristic" (the warm start)."""
    solver: str
    """The solver asked for: "cpsat", "cbc" or "heuristic"."""
    solve_time: float
    """Wall time of the whole solve, in seconds."""
    solver_log: str
    """What the warm start and the backend did, line by line."""

    @property
    def bubble_rate(self) -> float:
        """1 - total work / (devices x makespan)."""
        return self.timeline.bubble_rate

    @property
    def paper_bubble(self) -> float:
        """The paper's bubble rate: (max span - max work) / max span."""
        return self.timeline.paper_bubble

    @property
    def peak_memory(self) -> tuple[float, ...]:
        """Peak activation memory per device."""
        return self.timeline.peak_memory

    def summary(self) -> dict[str, object]:
        """The headline figures as plain values."""
        return {"solver": self.solver, "status": self.status, "objective": self.objective_kind,
                "value": self.objective, "lower_bound": self.lower_bound, "gap": self.gap,
                "paper_bubble": self.paper_bubble, "bubble_rate": self.bubble_rate,
                "makespan": self.timeline.makespan, "peak_memory": list(self.peak_memory),
                "solve_time": self.solve_time}

    def to_json(self, path: str | Path | None = None) -> dict:
        """The schedule document with a "solver" section; written to ``path`` when given."""
        doc = to_document(self.timeline, solver={**self.summary(), "log": self.solver_log})
        if path is not None:
            Path(path).write_text(json.dumps(doc, indent=1) + "\n")
        return doc

    def _repr_html_(self) -> str:
        return figures_html(self.summary())

    def __rich__(self) -> object:
        return figures_table(self.summary(), f"zbsolve {self.solver}")


def _check_search(solver: str, time_limit: object, objective: str, workers: object) -> None:
    """Validate the search options (the problem itself is validated by ``make_spec``)."""
    if solver not in SOLVERS:
        raise InputError(f"solver = {solver!r} is unknown; choose one of {', '.join(SOLVERS)}")
    if objective not in OBJECTIVES:
        raise InputError(f"objective = {objective!r} is unknown; choose one of {', '.join(OBJECTIVES)}")
    if isinstance(time_limit, bool) or not isinstance(time_limit, (int, float)) or not time_limit > 0 \
            or not math.isfinite(time_limit):
        raise InputError(f"time_limit = {time_limit!r} must be a positive number of seconds")
    if workers is not None:
        check_count("workers", workers)


def _warm_start(spec: Spec, kind: str, log: list[str]) -> Timeline:
    """The best of the heuristic, the V-shape greedy (two-chunk V-shape) and the handcrafted families
    that fit the memory limit."""
    best = simulate(heuristic(spec.profile, spec.placement, spec.num_microbatches, spec.mem_limit))
    log.append(f"heuristic: objective {best.objective(kind):.6g}")
    for name, candidate in _other_starts(spec):
        log.append(f"{name}: objective {candidate.objective(kind):.6g}")
        if candidate.objective(kind) < best.objective(kind):
            best = candidate
    return best


def _other_starts(spec: Spec) -> Iterator[tuple[str, Timeline]]:
    """The V-shape greedy's and the warm-start families' timelines that exist and fit the memory limit."""
    p, m = spec.num_devices, spec.num_microbatches
    if spec.placement == vshape(p):
        greedy = v_greedy(spec.profile, p, m, spec.mem_limit)
        if greedy is not None:
            yield "v-greedy", simulate(greedy)
    families = PLACEMENT_FAMILIES.get(spec.placement_name, ()) if spec.chunks in (1, CHUNKS) else ()
    for name in families:
        if name not in FAMILIES:
            continue
        try:
            yield name, simulate(with_limit(make_schedule(name, spec.profile, p, m), spec.mem_limit))
        except ZbsolveError:
            continue


def _run_backend(solver: str, form: Formulation, order: list[list[int]], time_limit: float, workers: int,
                 seed: int, lower: int, report: Callable[[str], None] | None) -> BackendResult:
    """The backend's result; its log lines go to ``report`` as they come."""
    return BACKENDS[solver](form, order, time_limit=time_limit, workers=workers, seed=seed, lower=lower, report=report)


def solve(profile: Profile, mem_limit: float | Sequence[float] | None, *, num_microbatches: int,
          num_devices: int | None = None, placement: PlacementName = "sequential", solver: SolverName = "cpsat",
          time_limit: float = TIME_LIMIT, objective: Objective = "span", workers: int | None = None,
          seed: int = 0, chunks: int = CHUNKS, progress: Callable[[str], None] | None = None) -> SolveResult:
    """Find a schedule minimising ``objective`` under ``mem_limit`` (profile memory units; one number,
    one per device, or None for unlimited). ``placement`` "interleaved" and "vshape" run ``chunks``
    stages per device: a one-stage-per-device (or scalar) profile is split into chunks, a profile of
    ``chunks * num_devices`` stages is taken as the chunks' (``chunks`` is ignored for "sequential").
    ``progress`` is passed each solver log line as it comes (warm starts, bounds, improvements). Ctrl-C
    returns the best schedule found so far. Raises InputError on bad arguments and InfeasibleError
    (stating the smallest feasible limit) when no schedule fits the limit."""
    began = time.monotonic()
    spec = make_spec(profile, mem_limit, num_microbatches=num_microbatches, num_devices=num_devices,
                     placement=placement, chunks=chunks)
    _check_search(solver, time_limit, objective, workers)
    workers = workers or os.cpu_count() or 1
    form = formulate(spec.profile, spec.placement, spec.num_microbatches, spec.mem_limit, objective)
    log = Log(progress)
    if not form.exact_time:
        log.append(f"times scaled by {form.time_scale} and rounded to integers for the solver")
    warm = _warm_start(spec, objective, log)
    lower = lower_bound(form)
    timeline, status, bound = warm, "heuristic", lower
    order = form.order_of(warm.schedule)
    if form.value(form.asap(order)) <= lower:
        log.append("the warm start meets the lower bound: optimal")
    elif solver != "heuristic":
        try:
            lower = bound = warmup_bound(form, min(BOUND_SHARE * time_limit, BOUND_SECONDS), workers)
            log.append(f"warm-up relaxation bound: {form.to_time(lower):.6g}")
            left = time_limit - (time.monotonic() - began) - min(RESERVE_SHARE * time_limit, RESERVE_SECONDS)
            result = _run_backend(solver, form, order, left, workers, seed, lower, progress)
        except KeyboardInterrupt:
            result = BackendResult(None, False, None, "interrupted before the solver returned", True)
        log.extend([result.log])  # already reported line by line
        if result.interrupted:
            log.append("interrupted: returning the best schedule found so far")
        if result.order is not None:
            candidate = simulate(form.schedule(result.order, solver))
            if candidate.objective(objective) <= warm.objective(objective):
                timeline = candidate
                status = "optimal" if result.optimal and form.exact_time else "feasible"
            else:
                log.append("the solver's schedule is worse than the warm start: keeping the warm start")
        if result.bound is not None:
            bound = max(bound, result.bound)
    value = timeline.objective(objective)
    bound_time = min(form.to_time(bound), value)
    if status == "optimal":
        bound_time = value
    elif value - bound_time <= TOLERANCE * max(1.0, value) and form.exact_time:
        status = "optimal"
    gap = (value - bound_time) / value if value > 0 else 0.0
    return SolveResult(timeline.schedule, timeline, value, objective, bound_time, gap, status, solver,
                       time.monotonic() - began, "\n".join(log))
