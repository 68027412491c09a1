"""solve(): the best schedule the optimizer finds for a profile and a memory budget.

Every handcrafted family of the placement that fits the memory limit comes first (the floor: each is built
and simulated in linear time, whatever the time limit, so no solve returns a schedule worse than these); the
paper's heuristic and the V-shape greedy follow (the warm start is the best of them); a backend improves it; the
result is always re-simulated, and never worse than the warm start.

Every later phase draws on one deadline, ``time.monotonic()`` at the call plus ``time_limit``, less the time
kept for the step times and for writing the document. The first schedule's simulation is timed, and every later
phase's cost is estimated as a multiple of it (``COSTS``): a phase that does not fit in the time left is
skipped, with a log line saying so, and the heuristic and the V-shape greedy stop trying variants in time for
what follows them.

An interrupt (``KeyboardInterrupt``: Ctrl-C, or SIGTERM inside ``zbsolve.base.interrupt.signals_as_interrupt()``)
in any phase after the first schedule exists returns the best schedule found so far, with ``interrupted`` set
and a log line saying so; before it, the interrupt propagates.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from zbsolve.optimize.backends import BACKENDS, BackendResult, Log
from zbsolve.optimize.bound import lower_bound, warmup_bound
from zbsolve.base.checks import TOLERANCE, check_count, exceeds, room
from zbsolve.problem.costs import DEFAULT_RESERVE, Costs, default_device_memory, memory_figures, model_costs, profile_costs
from zbsolve.io.document import to_document
from zbsolve.base.shown import Shown
from zbsolve.base.errors import BudgetError, InfeasibleError, InputError, ZbsolveError
from zbsolve.schedulers.families import PLACEMENT_FAMILIES, make_schedule
from zbsolve.base.files import write_atomic
from zbsolve.optimize.formulation import Formulation, formulate
from zbsolve.schedulers.heuristic import heuristic, min_feasible_limits, one_at_a_time
from zbsolve.problem.model import Model
from zbsolve.core.placement import CHUNKS, make_placement, vshape
from zbsolve.problem.problem_file import load_costs
from zbsolve.core.profile import Profile
from zbsolve.core.schedule import Schedule, build, passes_of
from zbsolve.core.simulator import Timeline, simulate
from zbsolve.core.spec import SUPPORTED_PLACEMENTS, PlacementName, Spec, make_spec
from zbsolve.core.step_time import StepTimes, step_times
from zbsolve.core.timing import OBJECTIVES, Objective
from zbsolve.core.transforms import with_limit
from zbsolve.schedulers.vgreedy import v_greedy

SolverName = Literal["cpsat", "cbc", "heuristic"]
"""A backend by name, or "heuristic" for the warm start alone."""
SOLVERS: tuple[str, ...] = get_args(SolverName)
TIME_LIMIT = 60.0
"""Seconds a solve may take unless told."""
BOUND_SHARE, BOUND_SECONDS = 0.15, 15.0
"""The warm-up relaxation bound gets this share of the time left, at most this many seconds."""
ONE_AT_A_TIME = "one-at-a-time"
"""The schedule that runs one microbatch at a time on every device: the least memory, valid whenever any is."""
COSTS = {"family": 20.0, "heuristic variant": 4.5, "v-greedy variant": 4.0, "simulate": 1.6, "re-simulate": 2.2,
         "formulate": 8.5, "lower bound": 2.0, "warm-up bound": 1.3, "search": 6.0, "step times": 9.0, "document": 7.0}
"""Cost of each phase in units of the first schedule's simulation, the largest measured with p = 64 to 128 and
m = 512 to 1024: building and simulating a family (V-Half's and V-Min's builds are the slowest); one variant of
the heuristic and one run of the V-shape greedy; simulating a warm start; rebuilding and simulating the backend's
order; the formulation; the cheap lower bound with the warm start's order; building the warm-up relaxation; the
least search worth starting (timing the warm start, building a small window, checking its order); the step times
of the result (``zbsolve.core.step_time``); its schedule document, built and written."""
BOUND_MET = 1e-5
"""The largest gap that reads as the bound met: what rounding times to integers for the solver leaves."""
KEPT = ("step times", "document")
"""The phases after the search, whose time every solve keeps before its deadline."""


def status_text(status: str, bound_met: bool) -> str:
    """A solve's status as a reader takes it: one not proven optimal whose schedule meets the lower bound all the same
    (a bound on times rounded for the solver) reads "<status> (bound met)", e.g. "heuristic (bound met)"."""
    return f"{status} (bound met)" if bound_met and status != "optimal" else status


def meets_bound(gap: float | None) -> bool:
    """Whether a schedule ``gap`` (relative) above its lower bound meets it, up to ``BOUND_MET``; None (no
    bound) does not."""
    return gap is not None and gap <= BOUND_MET


@dataclass(frozen=True, repr=False)
class SolveResult(Shown):
    """What ``solve`` found: a validated schedule, its figures, and how good it provably is."""

    schedule: Schedule
    """The schedule (validated by the simulator)."""
    timeline: Timeline
    """The simulator's timing of ``schedule``."""
    step_times: StepTimes
    """Step time with and without an optimizer barrier, and their bubbles."""
    objective: float
    """Objective value: makespan (the step time with an optimizer barrier) or longest per-device span ("span"),
    in profile time units."""
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
    interrupted: bool = False
    """Whether an interrupt stopped the solve (the schedule is the best found until then)."""
    costs: Costs | None = field(default=None)
    """Where the profile's figures come from: the model and its partition, and the device memory."""

    @property
    def step_time(self) -> float:
        """One training step with an optimizer barrier: the makespan."""
        return self.timeline.makespan

    @property
    def step_time_no_barrier(self) -> float:
        """One training step when steps overlap (no barrier): the steady-state period."""
        return self.step_times.step_time_no_barrier

    @property
    def bubble_rate(self) -> float:
        """1 - total work / (devices x makespan)."""
        return self.timeline.bubble_rate

    @property
    def bound_met(self) -> bool:
        """Whether the schedule meets the lower bound: proven optimal, or within ``BOUND_MET`` of it where the
        bound is on times rounded for the solver."""
        return meets_bound(self.gap)

    @property
    def status_text(self) -> str:
        """The status as a reader takes it (``status_text``): "heuristic (bound met)" for a warm start that meets
        the bound."""
        return status_text(self.status, self.bound_met)

    @property
    def paper_bubble(self) -> float:
        """The paper's bubble rate: (max span - max work) / max span."""
        return self.timeline.paper_bubble

    @property
    def peak_memory(self) -> tuple[float, ...]:
        """Peak activation memory per device."""
        return self.timeline.peak_memory

    def summary(self) -> dict[str, object]:
        """The headline figures as plain values: step times and bubbles first, then the paper's bubble; memory per
        device in GiB (static bytes, peak activations, their sum) when the profile is in bytes."""
        figures = {"solver": self.solver, "status": self.status, "objective": self.objective_kind,
                   "value": self.objective, "lower_bound": self.lower_bound, "gap": self.gap,
                   "bound_met": self.bound_met,
                   **self.step_times.figures(), "paper_bubble": self.paper_bubble, "makespan": self.timeline.makespan}
        if self.costs is not None and self.costs.in_bytes:
            figures.update(memory_figures(self.costs, self.timeline))
        else:
            figures["peak_memory"] = list(self.peak_memory)
        return {**figures, "solve_time": self.solve_time, "interrupted": self.interrupted}

    def to_json(self, path: str | Path | None = None) -> dict:
        """The schedule document with a "solver" section (and the costs' "partition" and "device_memory");
        written to ``path`` (whole or not at all) when given."""
        extra = self.costs.section() if self.costs is not None else {}
        doc = to_document(self.timeline, **extra, solver={**self.summary(), "log": self.solver_log})
        if path is not None:
            write_atomic(path, json.dumps(doc, indent=1) + "\n")
        return doc

    def __repr__(self) -> str:
        return (f"SolveResult(status={self.status!r}, objective={self.objective:.6g}, gap={self.gap:.4g}, "
                f"solver={self.solver!r}, interrupted={self.interrupted})")



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


def _check_feasible(spec: Spec, costs: Costs) -> None:
    """Raise InfeasibleError, stating the smallest feasible limit, when some device's limit is below what one
    microbatch needs there (in GiB, naming the shortfall, when the device memory is given)."""
    need = min_feasible_limits(spec.profile, spec.placement)
    for d, (limit, n) in enumerate(zip(spec.limits, need)):
        if n <= room(limit):
            continue
        if costs.device_memory is not None:
            uses = {"static": costs.static_bytes[d], "one microbatch's activations": n}
            raise InfeasibleError(costs.shortfall(d, uses), min_feasible=max(need))
        raise InfeasibleError(f"mem_limit {limit:g} on device {d} is below {n:g}, the memory one microbatch "
                              f"needs there; the smallest feasible limit is {max(need):g}", min_feasible=max(need))


@dataclass
class _Budget:
    """The one deadline of a solve, and the unit of ``COSTS``."""

    deadline: float
    started: float
    """``time.monotonic()`` when the solve began."""
    unit: float = 0.0
    """Seconds the first schedule's simulation took."""

    def left(self) -> float:
        """Seconds until the deadline (negative once it has passed)."""
        return self.deadline - time.monotonic()

    def cost(self, phase: str) -> float:
        """Estimated seconds of ``phase``."""
        return COSTS[phase] * self.unit

    def kept(self) -> float:
        """Estimated seconds of the phases after the search (``KEPT``), kept before the deadline."""
        return sum(self.cost(phase) for phase in KEPT)

    def allows(self, phase: str, log: Log, then: float = 0.0, name: str | None = None) -> bool:
        """Whether ``phase`` fits in the time left, keeping ``then`` seconds for what must follow; if not, log
        why (naming it ``name``, by default the phase)."""
        need = self.cost(phase) + then
        if need <= self.left():
            return True
        log.append(f"{name or phase}: skipped, it needs about {need:.2g}s and {max(0.0, self.left()):.2g}s are left")
        return False


@dataclass
class _Best:
    """The best schedule found so far, what is proven about the problem, and how the solve ended."""

    objective: str
    timeline: Timeline | None = None
    status: str = "heuristic"
    bound: float = 0.0
    """A proven lower bound on the objective, in profile time units."""
    exact: bool = True
    """Whether the bound is on the problem itself (not on one with rounded times): only then can it prove optimality."""
    interrupted: bool = False
    """Whether an interrupt stopped the solve."""

    @property
    def value(self) -> float:
        """The objective of the best schedule."""
        return self.timeline.objective(self.objective) if self.timeline is not None else math.inf

    def offer(self, name: str, timeline: Timeline, log: Log) -> None:
        """Keep ``timeline`` if it beats the best so far."""
        log.append(f"{name}: objective {timeline.objective(self.objective):.6g}")
        if timeline.objective(self.objective) < self.value:
            self.timeline = timeline

    def proven(self, bound: float, exact: bool) -> None:
        """Add a proven lower bound."""
        if bound > self.bound:
            self.bound, self.exact = bound, exact

    def optimal(self) -> bool:
        """Whether the bound proves the best schedule optimal."""
        return self.timeline is not None and self.exact and self.value - self.bound <= TOLERANCE * max(1.0, self.value)


def _floor(spec: Spec, budget: _Budget, log: Log, best: _Best) -> list[str]:
    """Offer the first family of the placement that fits the memory limit (``PLACEMENT_FAMILIES``: the best of
    them), and ``ONE_AT_A_TIME`` (valid under every limit that any schedule meets) as soon as the first family
    does not fit: the floor of every solve, built in linear time whatever the time left. The first simulation's
    time is the budget's unit, and from then on the budget keeps the time of ``KEPT``; the devices' work bounds
    the objective. Returns the families after the one that fits, left for the warm start."""
    def offer(name: str, schedule: Schedule) -> None:
        began = time.monotonic()
        timeline = simulate(schedule)
        if not budget.unit:
            budget.unit = time.monotonic() - began
            budget.deadline -= budget.kept()
        best.offer(name, timeline, log)

    names = list(PLACEMENT_FAMILIES.get(spec.placement_name, ()) if spec.chunks in (1, CHUNKS) else ())
    while names:
        name = names.pop(0)
        schedule = _family(spec, name)
        if isinstance(schedule, Schedule):
            offer(name, schedule)
            break
        log.append(f"{name}: {schedule}")
        if best.timeline is None:
            offer(ONE_AT_A_TIME, _one_at_a_time(spec))
    if best.timeline is None:
        offer(ONE_AT_A_TIME, _one_at_a_time(spec))
    best.proven(max(best.timeline.work), True)
    log.append(f"floor: built in {time.monotonic() - budget.started:.2f}s; {budget.kept():.2f}s kept for the step "
               "times and the document")
    return names


def _family(spec: Spec, name: str) -> Schedule | str:
    """Family ``name``'s schedule under the memory limit if it fits, else why not."""
    try:
        schedule = make_schedule(name, spec.profile, spec.num_devices, spec.num_microbatches)
    except ZbsolveError as exc:
        return str(exc)
    return with_limit(schedule, spec.mem_limit) if _fits(schedule, spec) else "over the memory limit"


def _fits(schedule: Schedule, spec: Spec) -> bool:
    """Whether ``schedule``'s running memory stays within the limit on every device (an order's memory is known
    without timing it)."""
    profile = schedule.profile
    for ops, limit in zip(schedule.devices, spec.limits):
        level = 0.0
        for op in ops:
            for q in passes_of(op):
                level += profile.delta(q.kind, q.stage)
                if exceeds(level, limit):
                    return False
    return True


def _one_at_a_time(spec: Spec) -> Schedule:
    """The heuristic's fallback order as a schedule of its own."""
    devices = one_at_a_time(spec.placement, spec.num_microbatches)
    return build(ONE_AT_A_TIME, spec.placement, spec.num_microbatches, spec.profile, devices, spec.mem_limit)


def _warm_start(spec: Spec, families: list[str], budget: _Budget, keep: float, log: Log, best: _Best) -> None:
    """Offer the heuristic's, the V-shape greedy's (two-chunk V-shape) and ``families``' schedules that fit the
    memory limit, each started only if it can end ``keep`` seconds before the deadline, until one meets the
    bound."""
    p, m = spec.num_devices, spec.num_microbatches
    after = keep + 2 * budget.cost("simulate")  # the generator validates its schedule by simulating it, then solve
    if not best.optimal() and budget.allows("heuristic variant", log, after, "heuristic"):
        try:
            schedule = heuristic(spec.profile, spec.placement, m, spec.mem_limit, deadline=budget.deadline - after)
            best.offer("heuristic", simulate(schedule), log)
        except BudgetError as exc:
            log.append(f"heuristic: {exc}")
    if spec.placement == vshape(p) and not best.optimal() \
            and budget.allows("v-greedy variant", log, after, "v-greedy"):
        try:
            greedy = v_greedy(spec.profile, p, m, spec.mem_limit, deadline=budget.deadline - after)
            if greedy is None:
                log.append("v-greedy: every run got stuck under this memory limit")
            else:
                best.offer("v-greedy", simulate(greedy), log)
        except BudgetError as exc:
            log.append(f"v-greedy: {exc}")
    for name in families:
        if best.optimal():
            return
        if not budget.allows("family", log, keep, name):
            continue
        schedule = _family(spec, name)
        if isinstance(schedule, Schedule):
            best.offer(name, simulate(schedule), log)
        else:
            log.append(f"{name}: {schedule}")


def _run_backend(solver: str, form: Formulation, order: list[list[int]], time_limit: float, workers: int,
                 seed: int, lower: int, report: Callable[[str], None] | None) -> BackendResult:
    """The backend's result; its log lines go to ``report`` as they come."""
    return BACKENDS[solver](form, order, time_limit=time_limit, workers=workers, seed=seed, lower=lower, report=report)


def _search(spec: Spec, solver: str, objective: str, workers: int, seed: int, budget: _Budget, log: Log,
            best: _Best) -> None:
    """Every phase in turn, each keeping what it finds in ``best``; the warm starts leave time for the formulation,
    the bound, a search and its re-simulation when these take at most half of what is left."""
    families = _floor(spec, budget, log, best)
    later = sum(budget.cost(phase) for phase in ("formulate", "lower bound", "search", "re-simulate"))
    _warm_start(spec, families, budget, later if later < budget.left() / 2 else 0.0, log, best)
    if best.optimal():
        log.append("the warm start meets the devices' work: optimal")
        return
    if not budget.allows("formulate", log, budget.cost("lower bound")):
        return
    form = formulate(spec.profile, spec.placement, spec.num_microbatches, spec.mem_limit, objective)
    if not form.exact_time:
        log.append(f"times scaled by {form.time_scale} and rounded to integers for the solver")
    lower = lower_bound(form)
    log.append(f"lower bound: {form.to_time(lower):.6g}")
    best.proven(form.to_time(lower), form.exact_time)
    if best.optimal():
        log.append("the warm start meets the lower bound: optimal")
        return
    if solver == "heuristic":
        return
    warm = best.timeline
    order = form.order_of(warm.schedule)
    share = min(BOUND_SHARE * budget.left(), BOUND_SECONDS)
    if spec.chunks == 1 and budget.allows("warm-up bound", log, share + budget.cost("search")):
        lower = warmup_bound(form, share, workers)
        log.append(f"warm-up relaxation bound: {form.to_time(lower):.6g}")
        best.proven(form.to_time(lower), form.exact_time)
        if best.optimal():
            log.append("the warm start meets the warm-up relaxation bound: optimal")
            return
    if not budget.allows("search", log, budget.cost("re-simulate")):
        return
    try:
        result = _run_backend(solver, form, order, budget.left() - budget.cost("re-simulate"), workers, seed, lower,
                              log.report)
    except KeyboardInterrupt:
        result = BackendResult(None, False, None, "interrupted before the solver returned", True)
    log.extend([result.log])  # already reported line by line
    best.interrupted = result.interrupted
    if result.order is not None and result.order != order:
        candidate = simulate(form.schedule(result.order, solver))
        if candidate.objective(objective) <= warm.objective(objective):
            best.timeline = candidate
            best.status = "feasible"
        else:
            log.append("the solver's schedule is worse than the warm start: keeping the warm start")
    if result.bound is not None:
        best.proven(form.to_time(result.bound), form.exact_time)
    if result.optimal and form.exact_time and best.timeline.schedule.name == solver:
        best.proven(best.value, True)


def solve(profile: Profile | Model | str | os.PathLike, mem_limit: float | Sequence[float] | None = None, *,
          num_microbatches: int, num_devices: int | None = None, placement: PlacementName = "sequential",
          solver: SolverName = "cpsat", time_limit: float = TIME_LIMIT, objective: Objective = "makespan",
          workers: int | None = None, seed: int = 0, chunks: int = CHUNKS,
          progress: Callable[[str], None] | None = None,
          device_memory: int | str | None = None, reserve: int | str = DEFAULT_RESERVE,
          partition: str | Sequence[int] = "uniform") -> SolveResult:
    """Find a schedule minimising ``objective`` (the makespan: the step time with an optimizer barrier; or "span",
    for a runtime without one) under ``mem_limit`` (profile memory units; one number, one per device, or None for
    unlimited) within ``time_limit`` seconds.

    ``profile`` is a per-stage ``Profile`` or a ``Model`` (layers with costs in seconds and bytes), or the path of
    a file holding either, cut into the placement's stages by ``partition`` ("uniform" or layer counts per stage).
    ``device_memory`` (bytes, or text such as "80GiB") replaces ``mem_limit``: each device's activation budget is
    the device memory minus the static bytes of the stages it holds minus ``reserve``; a model whose setting names
    a GPU preset gets that GPU's memory unless a limit is given. ``placement`` "interleaved" and "vshape" run
    ``chunks`` stages per device: a one-stage-per-device (or scalar) profile is split into chunks, a profile of
    ``chunks * num_devices`` stages is taken as the chunks' (``chunks`` is ignored for "sequential").
    ``progress`` is passed each solver log line as it comes (warm starts, bounds, improvements). The result is never
    worse than the floor: the first of the placement's families that fits (the best of them), built whatever the
    time limit. An interrupt once a schedule exists returns the best found so far with ``interrupted`` set (one
    before it propagates). Raises InputError on bad arguments and
    InfeasibleError (stating the smallest feasible limit, or the device and its shortfall in GiB) when no schedule
    fits."""
    began = time.monotonic()
    if isinstance(profile, (str, os.PathLike)):
        profile = load_costs(profile)
    profile, costs = _costs(profile, mem_limit, num_devices, placement, chunks, partition, device_memory, reserve)
    if costs.device_memory is not None:
        if mem_limit is not None:
            raise InputError("give mem_limit or device_memory, not both")
        mem_limit = costs.limits()
    spec = make_spec(profile, mem_limit, num_microbatches=num_microbatches, num_devices=num_devices,
                     placement=placement, chunks=chunks)
    _check_search(solver, time_limit, objective, workers)
    _check_feasible(spec, costs)
    log = Log(progress)
    best = _Best(objective)
    try:
        budget = _Budget(began + time_limit, began)
        _search(spec, solver, objective, workers or os.cpu_count() or 1, seed, budget, log, best)
    except KeyboardInterrupt:
        if best.timeline is None:
            raise
        best.interrupted = True
    if best.optimal():
        best.status = "optimal"
    value = best.value
    bound = min(best.bound, value)
    gap = (value - bound) / value if value > 0 else 0.0
    try:
        times = step_times(best.timeline)  # in the time kept for it
    except KeyboardInterrupt:  # the search is over: the figures of its result are finished all the same
        best.interrupted = True
        times = step_times(best.timeline)
    if best.interrupted:
        log.append("interrupted: returning the best schedule found so far")
    return SolveResult(best.timeline.schedule, best.timeline, times, value, objective, bound, gap, best.status, solver,
                       time.monotonic() - began, "\n".join(log), best.interrupted, costs)


def _costs(profile: Profile | Model, mem_limit: object, num_devices: int | None, placement: str, chunks: int,
           partition: str | Sequence[int], device_memory: int | str | None,
           reserve: int | str) -> tuple[Profile, Costs]:
    """The per-stage profile and its costs: a model cut into the placement's stages (its GPU's memory the device
    memory unless a limit is given), or a bare profile."""
    if isinstance(profile, Model):
        if device_memory is None and mem_limit is None:
            device_memory = default_device_memory(profile)
        if num_devices is None:
            raise InputError("num_devices = None: give num_devices to cut a model into stages")
        p = check_count("num_devices", num_devices)
        if placement not in SUPPORTED_PLACEMENTS:
            raise InputError(f"placement = {placement!r} is unknown; choose one of {', '.join(SUPPORTED_PLACEMENTS)}")
        layout = make_placement(placement, p, 1 if placement == "sequential" else check_count("chunks", chunks))
        return model_costs(profile, layout, partition, device_memory, reserve)
    if partition != "uniform":
        raise InputError(f"partition = {partition!r}: a partition cuts a model; this is a per-stage profile")
    if not isinstance(profile, Profile):
        raise InputError(f"profile = {profile!r} must be a Profile or a Model")
    p = num_devices if num_devices is not None else profile.num_stages
    return profile, profile_costs(p if isinstance(p, int) and p > 0 else 1, device_memory, reserve)
