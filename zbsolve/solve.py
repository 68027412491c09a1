"""solve(): the best schedule the optimizer finds for a profile and a memory budget.

The paper's heuristic (and the handcrafted families that fit the budget) give the warm start;
a backend improves it; the result is always re-simulated, and never worse than the warm start.
Ctrl-C during a solve stops the backend and returns the best schedule found so far (status
"feasible" if it beats the warm start, else "heuristic"); the log says it was interrupted.
"""

from __future__ import annotations

import html
import json
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from zbsolve.backends import BackendResult, Log
from zbsolve.backends.cpsat import solve_cpsat
from zbsolve.bound import lower_bound, warmup_bound
from zbsolve.document import to_document
from zbsolve.errors import InputError, ZbsolveError
from zbsolve.families import FAMILIES, make_schedule
from zbsolve.formulation import OBJECTIVES, Formulation, formulate
from zbsolve.heuristic import heuristic
from zbsolve.placement import PLACEMENTS, Placement, make_placement, sequential, vshape
from zbsolve.profile import Profile
from zbsolve.schedule import Schedule, build
from zbsolve.simulator import Timeline, simulate
from zbsolve.vgreedy import v_greedy

SOLVERS = ("cpsat", "cbc", "heuristic")
SUPPORTED_PLACEMENTS = ("sequential", "interleaved", "vshape")
WARM_START_FAMILIES = {"sequential": ("zb-h1", "zb-h2", "1f1b"), "interleaved": ("1f1b-i",),
                       "vshape": ("zb-v", "v-half", "v-min")}
"""Handcrafted families tried beside the heuristic as warm starts (when they fit the memory limit), by
placement (the V families for two chunks only)."""
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
    bubble_rate: float
    """1 - total work / (devices x makespan)."""
    paper_bubble: float
    """The paper's bubble rate: (max span - max work) / max span."""
    peak_memory: tuple[float, ...]
    """Peak activation memory per device."""

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
        rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(_fmt(v))}</td></tr>"
                       for k, v in self.summary().items())
        return f"<table>{rows}</table>"

    def __rich__(self) -> object:
        from rich.table import Table

        table = Table("figure", "value", title=f"zbsolve {self.solver}")
        for k, v in self.summary().items():
            table.add_row(k, _fmt(v))
        return table


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list):
        return ", ".join(_fmt(v) for v in value)
    return str(value)


def _objective(timeline: Timeline, kind: str) -> float:
    return max(timeline.span) if kind == "span" else timeline.makespan


def _check_inputs(profile: Profile, mem_limit: object, num_microbatches: int, num_devices: int | None,
                  placement: str, solver: str, time_limit: float, objective: str, workers: int | None,
                  chunks: int) -> int:
    """Validate the arguments; return the number of devices."""
    if not isinstance(profile, Profile):
        raise InputError(f"profile = {profile!r} must be a Profile")
    if solver not in SOLVERS:
        raise InputError(f"solver = {solver!r} is unknown; choose one of {', '.join(SOLVERS)}")
    if objective not in OBJECTIVES:
        raise InputError(f"objective = {objective!r} is unknown; choose one of {', '.join(OBJECTIVES)}")
    if placement not in PLACEMENTS:
        raise InputError(f"placement = {placement!r} is unknown; choose one of {', '.join(PLACEMENTS)}")
    if placement not in SUPPORTED_PLACEMENTS:
        raise InputError(f"placement = {placement!r} is not supported by the optimizer yet "
                         f"(supported: {', '.join(SUPPORTED_PLACEMENTS)})")
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
        raise InputError(f"chunks = {chunks!r} must be an integer >= 1 (smallest valid: 1)")
    if placement == "vshape" and chunks % 2:
        raise InputError(f"chunks = {chunks} must be even for the vshape placement (smallest valid: 2)")
    if isinstance(time_limit, bool) or not isinstance(time_limit, (int, float)) or not time_limit > 0 \
            or not math.isfinite(time_limit):
        raise InputError(f"time_limit = {time_limit!r} must be a positive number of seconds")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise InputError(f"workers = {workers!r} must be an integer >= 1 or None")
    limits = mem_limit if isinstance(mem_limit, (list, tuple)) else [mem_limit]
    if not all(x is None or (isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x))
               for x in limits) or (isinstance(mem_limit, (list, tuple)) and None in limits):
        raise InputError(f"mem_limit = {mem_limit!r} must be a number, one number per device, or None")
    if isinstance(num_microbatches, bool) or not isinstance(num_microbatches, int) or num_microbatches < 1:
        raise InputError(f"num_microbatches = {num_microbatches!r} must be an integer >= 1")
    if num_devices is None:
        if profile.num_stages is None:
            raise InputError("num_devices = None: give num_devices when every profile field is a scalar")
        return profile.num_stages
    if isinstance(num_devices, bool) or not isinstance(num_devices, int) or num_devices < 1:
        raise InputError(f"num_devices = {num_devices!r} must be an integer >= 1")
    stages = (None, num_devices) if placement == "sequential" else (None, num_devices, chunks * num_devices)
    if profile.num_stages not in stages:
        n = profile.num_stages
        hint = (f"; a {n}-stage profile over {num_devices} devices is one of {n // num_devices} chunks: "
                f"placement='vshape' or 'interleaved' with chunks={n // num_devices}"
                if placement == "sequential" and n % num_devices == 0 and n > num_devices else "")
        raise InputError(f"num_devices = {num_devices}, but the profile has {n} stages"
                         + (hint if placement == "sequential" else f" (give {num_devices} or {chunks * num_devices})"))
    return num_devices


def _warm_start(profile: Profile, layout: Placement, families: Sequence[str], m: int,
                mem_limit: float | Sequence[float] | None, kind: str, log: list[str]) -> Timeline:
    """The best of the heuristic, the V-shape greedy (two-chunk V-shape) and the handcrafted ``families``
    that fit the memory limit."""
    best = simulate(heuristic(profile, layout, m, mem_limit))
    log.append(f"heuristic: objective {_objective(best, kind):.6g}")
    for name, candidate in _other_starts(profile, layout, families, m, mem_limit):
        log.append(f"{name}: objective {_objective(candidate, kind):.6g}")
        if _objective(candidate, kind) < _objective(best, kind):
            best = candidate
    return best


def _other_starts(profile: Profile, layout: Placement, families: Sequence[str], m: int,
                  mem_limit: float | Sequence[float] | None) -> Iterator[tuple[str, Timeline]]:
    """The V-shape greedy's and the ``families``' timelines that exist and fit the memory limit."""
    p = layout.num_devices
    if layout == vshape(p):
        greedy = v_greedy(profile, p, m, mem_limit)
        if greedy is not None:
            yield "v-greedy", simulate(greedy)
    for name in families:
        if name not in FAMILIES:
            continue
        try:
            family = make_schedule(name, profile, p, m)
            yield name, simulate(build(name, family.placement, m, family.profile, family.devices, mem_limit))
        except ZbsolveError:
            continue


def _run_backend(solver: str, form: Formulation, order: list[list[int]], time_limit: float, workers: int,
                 seed: int, lower: int, report: Callable[[str], None] | None) -> BackendResult:
    """The backend's result; its log lines go to ``report`` as they come."""
    if solver == "cpsat":
        return solve_cpsat(form, order, time_limit=time_limit, workers=workers, seed=seed, lower=lower, report=report)
    from zbsolve.backends.cbc import solve_cbc

    result = solve_cbc(form, order, time_limit=time_limit, workers=workers, lower=lower)
    if report is not None:
        report(result.log)
    return result


def solve(profile: Profile, mem_limit: float | Sequence[float] | None, *, num_microbatches: int,
          num_devices: int | None = None, placement: str = "sequential", solver: str = "cpsat",
          time_limit: float = 60.0, objective: str = "span", workers: int | None = None,
          seed: int = 0, chunks: int = 2, progress: Callable[[str], None] | None = None) -> SolveResult:
    """Find a schedule minimising ``objective`` under ``mem_limit`` (profile memory units; one number,
    one per device, or None for unlimited). ``placement`` "interleaved" and "vshape" run ``chunks``
    stages per device: a one-stage-per-device (or scalar) profile is split into chunks, a profile of
    ``chunks * num_devices`` stages is taken as the chunks' (``chunks`` is ignored for "sequential").
    ``progress`` is passed each solver log line as it comes (warm starts, bounds, improvements). Ctrl-C
    returns the best schedule found so far. Raises InputError on bad arguments and InfeasibleError
    (stating the smallest feasible limit) when no schedule fits the limit."""
    began = time.monotonic()
    p = _check_inputs(profile, mem_limit, num_microbatches, num_devices, placement, solver, time_limit, objective,
                      workers, chunks)
    m = num_microbatches
    workers = workers or os.cpu_count() or 1
    if placement == "sequential":
        layout, families = sequential(p), WARM_START_FAMILIES["sequential"]
    else:
        layout = make_placement(placement, p, chunks)
        profile = profile.per_chunk(p, chunks, f"placement {placement!r}")
        families = WARM_START_FAMILIES.get(placement, ()) if chunks == 2 else ()
    form = formulate(profile, layout, m, mem_limit, objective)
    log = Log(progress)
    if not form.exact_time:
        log.append(f"times scaled by {form.time_scale} and rounded to integers for the solver")
    warm = _warm_start(form.profile, layout, families, m, mem_limit, objective, log)
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
            if _objective(candidate, objective) <= _objective(warm, objective):
                timeline = candidate
                status = "optimal" if result.optimal and form.exact_time else "feasible"
            else:
                log.append("the solver's schedule is worse than the warm start: keeping the warm start")
        if result.bound is not None:
            bound = max(bound, result.bound)
    value = _objective(timeline, objective)
    bound_time = min(form.to_time(bound), value)
    if status == "optimal":
        bound_time = value
    elif value - bound_time <= 1e-9 * max(1.0, value) and form.exact_time:
        status = "optimal"
    gap = (value - bound_time) / value if value > 0 else 0.0
    return SolveResult(timeline.schedule, timeline, value, objective, bound_time, gap, status, solver,
                       time.monotonic() - began, "\n".join(log), timeline.bubble_rate, timeline.paper_bubble,
                       timeline.peak_memory)
