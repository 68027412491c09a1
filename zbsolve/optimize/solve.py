"""solve(): the best schedule the optimizer finds for a profile and a memory budget.

The first schedule comes first, whatever the time limit: the placement's cheapest family to build that fits the
memory limit, or one microbatch at a time (each built and simulated in linear time, so no solve returns a schedule
worse than it). Its simulation is timed, and the time its step times and its document take is measured on it and
kept before the deadline. The floor follows, whatever the time left: every family of the placement that fits
(``warm_start.floor``: each builds in a few simulations' time), so no solve returns a schedule worse than a family
it can build. Then the paper's heuristic, the V-shape greedy and the periodic pattern (the warm start is the best of
them all); a backend improves it; the result is always re-simulated, and never worse than the warm start.

Every phase after the floor draws on one deadline, ``time.monotonic()`` at the call plus ``time_limit``,
less the time kept for the step times and for writing the document. Each search phase's cost is estimated as a
multiple of the first schedule's simulation (``COSTS``): a phase that does not fit in the time left is skipped,
with a log line saying so, and the heuristic and the V-shape greedy stop trying variants in time for what follows
them.

An interrupt (``KeyboardInterrupt``: Ctrl-C, or SIGTERM inside ``zbsolve.base.interrupt.signals_as_interrupt()``)
in any phase after the first schedule exists returns the best schedule found so far, with ``interrupted`` set
and a log line saying so; a signal while the problem is resolved and the first schedule built is answered once
that schedule exists (it takes linear time), so only a ``KeyboardInterrupt`` raised there by code propagates.
A time limit shorter than the first schedule, the families, its step times and its document need on this machine
(timed on a smaller problem first) is refused before anything is built.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence

from zbsolve.base.errors import InfeasibleError, InputError
from zbsolve.base.interrupt import deferred
from zbsolve.core.measures import gap
from zbsolve.core.objective import Objective
from zbsolve.core.placement import CHUNKS, PlacementName
from zbsolve.core.profile import Profile
from zbsolve.core.schedule import pair_count
from zbsolve.core.simulator import simulate
from zbsolve.core.spec import Spec
from zbsolve.core.step_time import step_times
from zbsolve.costmodel.model import Model
from zbsolve.optimize.backends import BACKENDS, BackendResult, Log
from zbsolve.optimize.bound import lower_bound, warmup_bound
from zbsolve.optimize.budget import Budget
from zbsolve.optimize.formulation import Formulation, formulate
from zbsolve.optimize.pairing import overlap_pairs, pairs_possible
from zbsolve.optimize.recompute_fit import fit_recompute
from zbsolve.optimize.result import SolveResult
from zbsolve.optimize.warm_start import Best, check_time, first, floor, measure, warm_start
from zbsolve.problem.costs import DEFAULT_RESERVE, Costs
from zbsolve.problem.problem_file import Problem, completed, load_input
from zbsolve.problem.recompute import parse_recompute
from zbsolve.problem.request import TIME_LIMIT, Request, SolverName, resolve
from zbsolve.schedulers.one_at_a_time import check_feasible

BOUND_SHARE, BOUND_SECONDS = 0.15, 15.0
"""The warm-up relaxation bound gets this share of the time left, at most this many seconds."""
OVERLAP_SHARE = 0.3
"""The share of the time left after the floor that the search for overlapped pairs keeps, where pairs may run."""
FIT_SHARE = 0.1
"""The share of the time left that timing one per-stage recomputation choice may take."""


def _check_feasible(spec: Spec, costs: Costs) -> None:
    """Raise InfeasibleError, stating the smallest feasible limit, when some device's limit is below what one
    microbatch needs there (in GiB, naming the shortfall, when the device memory is given)."""
    def shortfall(d: int, need: float) -> str:
        return costs.shortfall(d, {"static": costs.static_bytes[d], "one microbatch's activations": need})

    check_feasible(spec.profile, spec.placement, spec.limits, shortfall if costs.device_memory is not None else None)



def _run_backend(solver: str, form: Formulation, order: list[list[int]], time_limit: float, workers: int,
                 seed: int, lower: int, report: Callable[[str], None] | None) -> BackendResult:
    """The backend's result; its log lines go to ``report`` as they come."""
    return BACKENDS[solver](form, order, time_limit=time_limit, workers=workers, seed=seed, lower=lower, report=report)


def _search(spec: Spec, request: Request, budget: Budget, log: Log, best: Best) -> None:
    """Every search phase after the families in turn; where F and B may run as overlapped pairs (``best.overlap``),
    the phases without pairs keep ``OVERLAP_SHARE`` of the time for the pair search that follows them."""
    objective = request.objective
    if not best.overlap:
        _unpaired_phases(spec, request, budget, log, best)
        return
    keep = OVERLAP_SHARE * budget.left()
    budget.deadline -= keep
    try:
        _unpaired_phases(spec, request, budget, log, best)
    finally:
        budget.deadline += keep
    starts = [best.unpaired] + ([best.timeline] if best.timeline is not best.unpaired else [])
    for k, start in enumerate(t for t in starts if t is not None):
        paired = overlap_pairs(start, objective, budget.deadline - (budget.left() / 2 if k == 0 else 0.0))
        log.append(f"overlapped pairs from {start.schedule.name}: {pair_count(paired.schedule)} F&B pairs")
        best.offer(paired.schedule.name, paired, log)


def _unpaired_phases(spec: Spec, request: Request, budget: Budget, log: Log, best: Best) -> None:
    """Every phase of passes run one at a time in turn, each keeping what it finds in ``best``: the warm starts, the
    formulation and its lower bounds, the solver's search."""
    workers = request.workers or os.cpu_count() or 1
    if not _warm_starts(spec, request, budget, log, best, workers):
        return
    bounded = _bounds(spec, request, budget, log, best, workers)
    if bounded is None or not budget.allows("search", log, budget.cost("re-simulate")):
        return
    form, lower = bounded
    _solver_search(form, lower, request, budget, log, best, workers)


def _warm_starts(spec: Spec, request: Request, budget: Budget, log: Log, best: Best, workers: int) -> bool:
    """The warm starts, leaving time for the formulation, the bound, a search and its re-simulation when these take
    at most half of what is left; whether the later phases may run."""
    later = sum(budget.cost(phase) for phase in ("formulate", "lower bound", "search", "re-simulate"))
    warm_start(spec, budget, later if later < budget.left() / 2 else 0.0, log, best, workers, request.periodic)
    if best.optimal():
        log.append("the warm start meets the devices' work: optimal")
        return False
    if spec.profile.backward_allocates() and request.solver == "cbc":
        log.append("B raises the memory here (recomputation), which CBC's form does not model: the best warm start "
                   "is the result")
        return False
    return budget.allows("formulate", log, budget.cost("lower bound"))


def _bounds(spec: Spec, request: Request, budget: Budget, log: Log, best: Best,
            workers: int) -> tuple[Formulation, int] | None:
    """The formulation and its lower bounds (earliest starts, work and memory; with one stage per device, the
    warm-up relaxation where time allows); None where the warm start meets them or the solver is the heuristic."""
    form = formulate(spec.profile, spec.placement, spec.num_microbatches, spec.mem_limit, request.objective)
    if not form.exact_time:
        log.append(f"times scaled by {form.time_scale} and rounded to integers for the solver")
    lower = lower_bound(form)
    log.append(f"lower bound: {form.to_time(lower):.6g}")
    best.proven(form.to_time(lower), form.exact_time)
    if best.optimal():
        log.append("the warm start meets the lower bound: optimal")
        return None
    if request.solver == "heuristic":
        return None
    share = min(BOUND_SHARE * budget.left(), BOUND_SECONDS)
    if spec.chunks == 1 and budget.allows("warm-up bound", log, share + budget.cost("search")):
        lower = warmup_bound(form, share, workers)
        log.append(f"warm-up relaxation bound: {form.to_time(lower):.6g}")
        best.proven(form.to_time(lower), form.exact_time)
        if best.optimal():
            log.append("the warm start meets the warm-up relaxation bound: optimal")
            return None
    return _searched_form(form, spec, request, best, log), lower


def _searched_form(form: Formulation, spec: Spec, request: Request, best: Best, log: Log) -> Formulation:
    """``form``, or where the best warm start's order does not fit it as B then W (its fused backwards hold less
    than B alone keeps for W), the formulation with the backwards that need less memory fused (``formulate``'s
    ``fuse``), which takes every order the simulator does; its own bounds bound only its orders, so none is kept."""
    warm = best.warm
    assert warm is not None  # the warm starts keep a schedule
    if form.memory_ok(form.order_of(warm.schedule)):
        return form
    fused = formulate(spec.profile, spec.placement, spec.num_microbatches, spec.mem_limit, request.objective, True)
    log.append(f"the warm start fits only with its backwards fused: stages {', '.join(map(str, sorted(fused.fused)))} "
               "run B and W as one BW in the search")
    return fused


def _solver_search(form: Formulation, lower: int, request: Request, budget: Budget, log: Log, best: Best,
                   workers: int) -> None:
    """The solver's search from the best warm start's order, its schedule taken where faster, its bound kept."""
    solver, objective = request.solver, request.objective
    warm = best.warm
    assert warm is not None  # the warm starts keep a schedule
    order = form.order_of(warm.schedule)
    if form.fused:  # its times may be scaled apart from the bound's formulation
        lower = math.floor(best.bound * form.time_scale)
    try:
        result = _run_backend(solver, form, order, budget.left() - budget.cost("re-simulate"), workers, request.seed,
                              lower, log.report)
    except KeyboardInterrupt:
        result = BackendResult(None, False, None, "interrupted before the solver returned", True)
    log.extend([result.log])  # already reported line by line
    best.interrupted = result.interrupted
    if result.order is not None:
        # the warm start's order itself (its fused BW passes split into B then W, ``Formulation.order_of``) is
        # another schedule, as fast or faster: it is taken when faster
        candidate = simulate(form.schedule(result.order, solver))
        value, warm_value = candidate.objective(objective), warm.objective(objective)
        if value < warm_value or result.order != order and value <= warm_value:
            if best.overlap:
                best.offer(solver, candidate, log)
            else:
                best.timeline = candidate
            if best.timeline is candidate:
                best.status = "feasible"
        elif result.order != order:
            log.append("the solver's schedule is worse than the warm start: keeping the warm start")
    if result.bound is not None and not form.fused:
        best.proven(form.to_time(result.bound), form.exact_time)
    assert best.timeline is not None, "the warm start is kept"
    if result.optimal and form.exact_time and not form.fused and best.timeline.schedule.name == solver:
        best.proven(best.value, True)


def _warm_step(model: Model, request: Request, began: float) -> float:
    """The step time of ``request``'s warm starts alone (infinity when nothing fits), in a share of its time."""
    share = max(0.05, (request.time_limit - (time.monotonic() - began)) * FIT_SHARE)
    try:
        return solve_request(model, request.model_copy(update={"solver": "heuristic", "time_limit": share}),
                             document=False).step_time
    except InfeasibleError:
        return math.inf


def solve(profile: Profile | Model | str | os.PathLike, mem_limit: float | Sequence[float] | None = None, *,
          num_microbatches: int | None = None, num_devices: int | None = None,
          placement: PlacementName | None = None,
          solver: SolverName = "cpsat", time_limit: float = TIME_LIMIT, objective: Objective = "makespan",
          workers: int | None = None, seed: int = 0, chunks: int = CHUNKS,
          progress: Callable[[str], None] | None = None,
          device_memory: int | str | None = None, reserve: int | str = DEFAULT_RESERVE,
          partition: str | Sequence[int] = "uniform", mem_factor: float | None = None,
          recompute: str = "none") -> SolveResult:
    """Find a schedule minimising ``objective`` (the makespan: the step time with an optimizer barrier; or "span",
    for a runtime without one) under ``mem_limit`` (profile memory units; one number, one per device, or None for
    unlimited) within ``time_limit`` seconds.

    ``profile`` is a per-stage ``Profile`` or a ``Model`` (layers with costs in seconds and bytes), or the path of
    a file holding either, cut into the placement's stages by ``partition`` ("uniform", "balanced" or layer counts
    per stage), or of a problem file, which states what is not given (``num_devices``, ``num_microbatches``, its
    memory limit and ``placement``, as ``zbsolve solve`` reads it; elsewhere ``num_microbatches`` is required and
    ``placement`` is "sequential" by default).
    ``device_memory`` (bytes, or text such as "80GiB") replaces ``mem_limit``: each device's activation budget is
    the device memory minus the static bytes of the stages it holds minus ``reserve``; a model whose setting names
    a GPU preset gets that GPU's memory unless a limit is given. ``placement`` "interleaved" and "vshape" run
    ``chunks`` stages per device: a one-stage-per-device (or scalar) profile is split into chunks, a profile of
    ``chunks * num_devices`` stages is taken as the chunks' (``chunks`` is ignored for "sequential").
    ``mem_factor`` gives the limit as a multiple of 1F1B's peak instead. ``recompute`` (none, full, uniform:N,
    per-stage:N,N,..., or per-stage: the counts chosen by ``optimize.recompute_fit``; selective, or "selective+"
    before uniform or per-stage) says which of a model's blocks run their forward, or their norms and MLP activation
    function, again inside their B (``zbsolve.problem.recompute``). The arguments are checked once, as one
    ``Request`` (``solve_request`` takes one). ``progress`` is passed each solver log line as it comes (warm
    starts, bounds, improvements). The first schedule (the placement's cheapest family that fits, else one
    microbatch at a time) is built whatever the time limit, and the result is never worse than it, nor than any of
    the placement's families that fits (built whatever the time limit too, unless interrupted). An interrupt
    (after a recomputation is chosen) returns the best schedule found so far with ``interrupted`` set, the first
    schedule finished first. Raises InputError on bad arguments or on a time limit shorter than the first schedule
    needs on this machine (``check_time``, naming the least that could hold), and InfeasibleError (stating the
    smallest feasible limit, or the device and its shortfall in GiB) when no schedule fits."""
    began = time.monotonic()
    fields = dict(mem_limit=mem_limit, num_microbatches=num_microbatches, num_devices=num_devices,
                  placement=placement, solver=solver, time_limit=time_limit, objective=objective, workers=workers,
                  seed=seed, chunks=chunks, device_memory=device_memory, reserve=reserve, partition=partition,
                  mem_factor=mem_factor, recompute=recompute)
    if isinstance(profile, (str, os.PathLike)):
        given = load_input(profile, "zbsolve.solve")
        if isinstance(given, Problem):
            fields = completed(given, fields)
        profile = given.profile if isinstance(given, Problem) else given
    if fields["num_microbatches"] is None:
        raise InputError("num_microbatches: give it (only a problem file states it)")
    request = Request(**{**fields, "placement": fields["placement"] or "sequential"})
    return solve_request(profile, request, progress, began, check=True)


def solve_request(profile: Profile | Model, request: Request, progress: Callable[[str], None] | None = None,
                  began: float | None = None, check: bool = False, document: bool = True) -> SolveResult:
    """``solve`` on a checked request; ``began`` (``time.monotonic()``) when the time limit started, by default
    now. With ``check`` (``solve``'s and ``zbsolve solve``'s), a time limit shorter than the first schedule needs on
    this machine is refused (``check_time``); without (the planner's, the frontier's and a grid's own solves), the
    solve takes the time it is given, its first schedule whatever it costs. Without ``document`` (the planner's
    solves, whose results are neither written nor shown), no time is kept for the result's document or its step
    times: those are made when first read (``SolveResult.step_times``)."""
    began = time.monotonic() if began is None else began
    if isinstance(profile, Model) and parse_recompute(request.recompute).undecided:
        chosen = fit_recompute(profile, request, lambda r: _warm_step(profile, r, began))
        request = request.model_copy(update={"recompute": str(chosen)})
    log, best, budget = Log(progress), Best(request.objective), Budget(began + request.time_limit, began)
    try:
        with deferred() as came:  # a signal before the first schedule exists stops the solve once it does
            spec, costs = resolve(profile, request)
            _check_feasible(spec, costs)
            best.overlap = request.pairs and pairs_possible(spec.profile, spec.placement)
            if check:
                check_time(spec, request.time_limit, began)
            tried = first(spec, budget, log, best)
        if came:
            raise KeyboardInterrupt
        measure(budget, log, best, document)
        floor(spec, log, best, tried)
        _search(spec, request, budget, log, best)
    except KeyboardInterrupt:
        if best.timeline is None:
            raise
        best.interrupted = True
    if best.optimal():
        best.status = "optimal"
    timeline, value = best.timeline, best.value
    assert timeline is not None, "the first schedule is offered before the search, or the interrupt is raised"
    bound = min(best.bound, value)
    measured, times = best.measured or (None, None)
    if measured is not timeline:
        times = None  # made when first read, unless the result becomes a document
        if document:
            try:
                times = step_times(timeline)  # in the time kept for it
            except KeyboardInterrupt:  # the search is over: the figures of its result are finished all the same
                best.interrupted = True
                times = step_times(timeline)
    if best.interrupted:
        log.append("interrupted: returning the best schedule found so far")
    return SolveResult(timeline.schedule, timeline, times, value, request.objective, bound, gap(value, bound),
                       best.status, request.solver, time.monotonic() - began, "\n".join(log), best.interrupted, costs)
