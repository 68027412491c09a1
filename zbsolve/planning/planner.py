"""plan(): the split of a model's layers into stages, the placement and the schedule, chosen together for the
shortest step time (with an optimizer barrier) that fits the device memory.

Under one time limit:

1. **Split bound.** Per placement, CP-SAT finds the partition minimising the largest (head + work) over devices
   (``zbsolve.planning.split_bound``), then with what the device memory forces on warm-up, cool-down and the chain of
   releases over every recomputation the plan may choose (``zbsolve.planning.memory_bound``): a lower bound on the
   step time of every schedule on every partition of that placement, and the first candidate.
2. **Candidates.** That partition, the work-balancing partition, and the baselines' splits (uniform,
   torchtitan's, Megatron's) are timed by the heuristic and the simulator (``solve(..., solver="heuristic")``),
   in parallel processes (or on a Dask cluster); then each placement's best is improved by moving one stage
   boundary by one layer at a time (the moves ranked by the largest (head + work) they leave) until none improves,
   and the search goes on from the best partitions not yet searched from until its share of the time is spent.
   The first candidate is timed beside the split bounds; finishing is measured on its schedule (a simulation, its
   step times and its document), and no later candidate starts that would still run when the search ends
   (``Search.starts``).
3. **Baselines.** torch's built-ins and Megatron's schedules on the baseline splits (``planning.baselines``), in
   this process until the time left is what finishing takes (measured): the rows not timed by then say so.
4. **Schedule.** The three best candidates are solved by CP-SAT, sharing the time left, the first of them the best
   baseline's split, placement and recomputation where that baseline beats every candidate (its solve's warm
   starts hold the handcrafted families, for the formulation to improve on). The plan is the best
   schedule any phase produced, re-simulated: the schedule the search timed on its fastest candidate (kept as it
   was timed, not built again with less time), the CP-SAT solves', or a baseline that fits and beats them (the log
   says so, and its last line names the phase kept). For a runtime that runs its own order (``Target.order``
   "own": Megatron), every candidate is timed with that order (``Target.schedule_of``) instead of the heuristic's,
   no solver runs, and the plan is that order on the best candidate, or a baseline of that order that beats it;
   its search keeps ``BASELINE_SHARE`` of the time for the baselines.
"""

from __future__ import annotations

import concurrent.futures as cf
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from zbsolve.base.checks import check_count
from zbsolve.base.errors import InfeasibleError, InputError
from zbsolve.base.parallel import make_executor
from zbsolve.core.placement import PlanPlacement
from zbsolve.core.simulator import Timeline
from zbsolve.core.step_time import StepTimes
from zbsolve.costmodel.model import Model
from zbsolve.io.targets import check_target
from zbsolve.io.targets.megatron.layout import layout_counts
from zbsolve.io.targets.target import Target
from zbsolve.optimize.solve import solve_request
from zbsolve.planning.baselines import NOT_TIMED, taken_baseline, timed_baselines
from zbsolve.planning.infeasible import nothing_fits
from zbsolve.planning.memory_terms import memory_terms
from zbsolve.planning.placement_choices import search_placements
from zbsolve.planning.result import OWN_ORDER, Baseline, Candidate, PlanResult, by_step_time
from zbsolve.planning.runs import BaselineSetting, builtin_run
from zbsolve.planning.search import Search, best_of, bounds, finished, local_search
from zbsolve.planning.targets import may_take, partition_refusal, recompute_choices, runnable
from zbsolve.problem.costs import DEFAULT_RESERVE, Costs, default_device_memory
from zbsolve.problem.partition import untimed
from zbsolve.problem.recompute import described, parse_recompute, selective_known
from zbsolve.problem.request import PLAN_TIME_LIMIT, Request

BOUND_SHARE, SEARCH_SHARE = 0.15, 0.5
"""Shares of the time limit for the split bounds and for the search of partitions (the rest is the baselines' and
the final CP-SAT solves')."""
BASELINE_SHARE = 0.15
"""The share of the time limit a runtime of its own order keeps from its search for the baselines."""
FINALISTS = 3
"""Candidates the final CP-SAT solves share the time left between, best first."""
FINISH_SECONDS = 0.5
"""Seconds kept after the final solves for re-simulating and returning the plan."""
SOLVE_SECONDS = 1.0
"""The least time a final CP-SAT solve is given: with less, the search's schedule stands."""


def plan(model: Model | str | os.PathLike, *, num_devices: int, num_microbatches: int,
         device_memory: int | str | None = None, placement: PlanPlacement = "auto", chunks: int | str | None = None,
         time_limit: float = PLAN_TIME_LIMIT, reserve: int | str = DEFAULT_RESERVE, jobs: int | None = None,
         executor: str | cf.Executor | None = None, progress: Callable[[str], None] | None = None,
         recompute: str = "none", target: str = "zbsolve", baseline_layout: str | None = None,
         megatron_ends: tuple[int | None, int | None] = (None, None), began: float | None = None) -> PlanResult:
    """Choose the partition of ``model``'s layers into stages, the placement ("auto": the best of sequential,
    interleaved and V-shape) and the schedule that make a training step with an optimizer barrier shortest, with
    every device's static bytes, peak activations and ``reserve`` within ``device_memory`` (default: the model's
    GPU's). ``model`` is a ``Model`` or the path of a model file. ``chunks`` is the stages per device of the
    interleaved and V-shape placements (default 2), or "auto": every count from 2 to ``placement_choices.MAX_CHUNKS``.
    ``recompute`` is which blocks run their forward again inside their B (none, full, uniform:N, per-stage:N,N,...),
    "per-stage": the blocks of each stage chosen for each candidate (``optimize.recompute_fit``), selective forms
    (``problem.recompute.RECOMPUTE_FORMS``: norms and MLP activation function), or "auto": each
    candidate timed with each of the target's ``auto_recompute``. ``target`` (zbsolve, torchtitan, megatron) keeps
    the search to the recomputation, placements, microbatches and pairs that runtime's row of the runtime table runs
    (``zbsolve.io.targets.TARGETS``, read by ``zbsolve.planning.targets``);
    ``baseline_layout``, a Megatron ``--pipeline-model-parallel-layout`` string, adds its rows to the baselines, and
    ``megatron_ends`` (Megatron's layers of the first and the last pipeline rank) Megatron's uneven split.

    What runs in parallel: the split bounds of the placements and the timing of candidate partitions, ``jobs`` at a
    time in local worker processes (default: all cores; ``zbsolve.base.parallel.start_method``: a script without
    ``if __name__ == "__main__":`` and a notebook work as they are) or on ``executor``
    ("dask://HOST:PORT" or a ``concurrent.futures.Executor``); the final CP-SAT solves run in this process. An
    interrupt (``KeyboardInterrupt``) returns the best plan found so far, with ``interrupted`` set and the log saying
    so; one before the search has timed a partition that fits propagates (nothing is planned yet). ``progress``
    hears each line of the log, the placements not searched (``NOT_SEARCHED``) first. ``began``
    (``time.monotonic()``, default now) is when the time limit started."""
    began = time.monotonic() if began is None else began
    p, m = check_count("num_devices", num_devices), check_count("num_microbatches", num_microbatches)
    model = _loaded(model)
    row = check_target(target)
    request = Request(num_microbatches=m, num_devices=p, placement=placement, time_limit=time_limit,
                      pairs=row.pairs,
                      device_memory=_gpu_memory(model) if device_memory is None else device_memory, reserve=reserve,
                      **({} if chunks in (None, "auto") else {"chunks": chunks}),
                      **({} if recompute == "auto" else {"recompute": recompute}))
    # "auto" tries selective where the model says how
    choices = tuple(c for c in recompute_choices(target, recompute, model)
                    if recompute != "auto" or selective_known(model) or not parse_recompute(c).selective)
    if baseline_layout is not None:
        layout_counts(model, baseline_layout, p)  # refused before the search when it does not suit the model
    if jobs is not None:
        check_count("jobs", jobs)
    notes: list[str] = []  # said once the search's log exists
    asked = chunks if chunks in (None, "auto") else request.chunks  # None: the default, which no one asked for
    placements = runnable(target, model, search_placements(placement, asked, p, len(model.layers), m, notes.append),
                          placement, p, m, notes.append)
    memory, spare = request.device_memory, request.reserve
    assert memory is not None  # given, or the model's GPU's
    log: list[str] = []
    parallel = jobs or (os.cpu_count() or 1 if executor is None else 1)
    pool, release = make_executor(executor, parallel)
    search = Search(model, request, began + time_limit, pool, parallel, log, progress,
                    lambda counts: partition_refusal(target, model, counts, p) is None, row.schedule_of,
                    memory_terms(model, recompute, target, memory - spare))
    options = [(name, c, rc) for name, c in placements for rc in choices]
    setting = BaselineSetting(model, p, m, memory, spare, baseline_layout, megatron_ends, row.pairs)
    run = _Run(search, row, target, recompute, placements, options, setting, began, time_limit)
    _search_partitions(run, notes, release)
    first = _search_schedule(search)
    rows = _time_baselines(run, first)
    best_baseline = _best_baseline(run, rows)
    if row.order == "own":
        kept = _own_order(search, run.setting, row)
    else:
        kept, run.interrupted = _final_solves(search, first, run.interrupted, best_baseline)
    kept = _faster_baseline(run, best_baseline, kept)
    counts = [b - a for a, b in kept.costs.ranges]
    search.log_line(f"kept: {kept.source} on {kept.chosen[0]} x{kept.chosen[1]} {counts}: "
                    f"{kept.timeline.makespan:.6g}s")
    lower = min(search.bound, kept.timeline.makespan) if math.isfinite(search.bound) else None  # none: unknown
    return PlanResult(kept.chosen[0], kept.chosen[1], kept.costs, kept.timeline, kept.source, lower, tuple(rows),
                      tuple(search.timed.values()), time.monotonic() - began, "\n".join(log), run.interrupted,
                      described(model, kept.costs.ranges, kept.costs.recomputed, kept.costs.selective,
                                kept.costs.modules), target, kept.times)


@dataclass
class _Run:
    """A plan under way: its search, what was asked of it, and whether an interrupt came."""

    search: Search
    row: Target
    """The target's row of the runtime table."""
    target: str
    recompute: str
    """The recomputation asked for."""
    placements: list[tuple[str, int]]
    """(placement, stages per device) searched."""
    options: list[tuple[str, int, str]]
    """(placement, stages per device, recomputation) searched."""
    setting: BaselineSetting
    began: float
    time_limit: float
    interrupted: bool = False


def _loaded(model: Model | str | os.PathLike) -> Model:
    """``model``, read from its file where it is a path; an ``InputError`` where it is neither a model nor a path,
    or where some pass time is 0 on every layer."""
    if isinstance(model, (str, os.PathLike)):
        model = Model.load(model, "zbsolve.plan")
    if not isinstance(model, Model):
        raise InputError(f"model = {model!r} must be a zbsolve.costmodel.model.Model or the path of a model file")
    missing = untimed(model.layers)
    if missing:
        raise InputError(f"{model.name}: {missing} = 0 on every layer: a model needs positive F, B and W times")
    return model


def _search_partitions(run: _Run, notes: list[str], release: Callable[[bool], None]) -> None:
    """Phases 1 and 2: the split bounds, then the search of partitions, until their share of the time is spent (a
    runtime of its own order gets no final solves: the search has their time, less the baselines' share). An
    interrupt ends them; before any partition that fits was timed, it propagates."""
    search, began, time_limit = run.search, run.began, run.time_limit
    searched = began + (time_limit * (BOUND_SHARE + SEARCH_SHARE) if run.row.order == "planned"
                        else time_limit * (1 - BASELINE_SHARE) - FINISH_SECONDS)
    finished = False
    try:
        for line in notes:
            search.log_line(line)
        bounds(search, run.options, time_limit * BOUND_SHARE, searched)
        local_search(search, run.options, searched)
        finished = True
    except KeyboardInterrupt:
        run.interrupted = True
        if best_of(search, lambda x: True) is None:  # nothing to plan with: an interrupt, not "does not fit"
            raise
        search.log_line("interrupted: planning with the best partition found so far")
    finally:
        release(finished)


def _time_baselines(run: _Run, first: tuple[PhaseSchedule, float] | None) -> list[Baseline]:
    """Phase 3: the baselines, until the time left is what finishing takes; an interrupt leaves none."""
    search = run.search
    stop_at = run.began + run.time_limit - _finish_seconds(first)
    if first is not None and stop_at - time.monotonic() < first[1]:
        stop_at = time.monotonic()  # less time than the schedule's simulation and document took: no row would fit
    try:
        rows = timed_baselines(run.setting, stop_at)
    except KeyboardInterrupt:
        if best_of(search, lambda x: True) is None:
            raise
        run.interrupted, rows = True, []
        search.log_line("interrupted while timing the baselines: planning with the best partition found, beside "
                        "none")
    untimed_rows = sum(b.note == NOT_TIMED for b in rows)
    if untimed_rows:
        search.log_line(f"baselines: {untimed_rows} of {len(rows)} rows not timed within the time limit")
    return rows


def _best_baseline(run: _Run, rows: list[Baseline]) -> Baseline | None:
    """The fastest baseline that may be the plan: it fits, and its placement, recomputation and partition are ones
    searched (and its order the runtime's, for a runtime that runs its own). Where neither it nor any candidate
    exists, an ``InfeasibleError`` saying what was not timed and what the closest candidate lacks."""
    search, model, p = run.search, run.search.model, run.setting.num_devices
    allowed = [b for b in rows if b.fits and b.step_time is not None and (b.placement, b.chunks) in run.placements
               and may_take(run.target, run.recompute, b.recompute, model) and b.counts is not None
               and search.accepts(b.counts)
               and run.row.schedule_of(model, p, b.chunks, parse_recompute(b.recompute)) in (None, b.schedule)]
    if best_of(search, lambda x: True) is None and not allowed:
        raise nothing_fits(search, run.options, rows, run.setting)
    return min(allowed, key=by_step_time, default=None)


def _faster_baseline(run: _Run, baseline: Baseline | None, kept: PhaseSchedule | None) -> PhaseSchedule:
    """``kept``, or ``baseline``'s schedule where it is faster (the log says so)."""
    if baseline is not None and (kept is None or by_step_time(baseline) < kept.timeline.makespan):
        timeline, costs, (name, c) = taken_baseline(run.setting, baseline)
        recomputed = "" if baseline.recompute == "none" else f" recompute {baseline.recompute}"
        if kept is None or timeline.makespan < kept.timeline.makespan:
            kept = PhaseSchedule(timeline, f"baseline {baseline.split} {baseline.schedule}{recomputed}", costs,
                                 (name, c, baseline.recompute))
            own = "" if run.row.order == "planned" else f" ({run.row.label}{OWN_ORDER})"
            run.search.log_line(f"the baseline {baseline.schedule}{own} on the {baseline.split} split{recomputed} is "
                                "the best schedule found: taking it")
    assert kept is not None  # a candidate that fits, or a baseline allowed
    return kept


def _gpu_memory(model: Model) -> int:
    """The memory of the model's GPU, in bytes; an ``InputError`` when it names no GPU preset."""
    memory = default_device_memory(model)
    if memory is None:
        raise InputError("device_memory = None: give the memory per device (e.g. 80GiB); the model names no GPU "
                         "preset to take it from")
    return memory


class PhaseSchedule(NamedTuple):
    """A schedule a phase of the plan produced, as the simulator times it, and what it was made on."""

    timeline: Timeline
    source: str
    """The phase that made it (``PlanResult.source``)."""
    costs: Costs
    chosen: tuple[str, int, str]
    """Its placement, stages per device and recomputation."""
    times: StepTimes | None = None
    """Its step times, where the plan made them."""


def _own_order(search: Search, setting: BaselineSetting, row: Target) -> PhaseSchedule | None:
    """The plan of a runtime that runs its own order (``Target.schedule_of``): that order on the best candidate, as
    the search timed it, under the activation budgets; no solver runs, as the runtime would not run its order."""
    best = best_of(search, lambda x: True)
    if best is None:
        return None
    recompute = parse_recompute(best.recompute)
    name = row.schedule_of(search.model, setting.num_devices, best.chunks, recompute)
    assert name is not None  # a row of its own order
    timeline, costs = builtin_run(setting, name, best.chunks, best.counts, recompute, limited=True)
    search.log_line(f"{name}, {row.label}{OWN_ORDER}, on {best.label()} {list(best.counts)}: {timeline.makespan:.6g}s")
    return PhaseSchedule(timeline, f"{row.label}{OWN_ORDER}", costs, (best.placement, best.chunks, best.recompute))


def _search_schedule(search: Search) -> tuple[PhaseSchedule, float] | None:
    """The fastest candidate's schedule as the search timed it, re-simulated under its activation budgets, with its
    step times, and the seconds these and its document's text took (``search.finished``: the search's own
    measurement where that candidate is the one it measured); None where the search timed no schedule."""
    if search.kept is None:
        return None
    candidate, schedule, costs = search.kept
    measured = search.finish
    if measured is None or measured[0] is not candidate:
        measured = finished(candidate, schedule, costs)
    _, timeline, times, seconds = measured
    chosen = (candidate.placement, candidate.chunks, candidate.recompute)
    return PhaseSchedule(timeline, "heuristic", costs, chosen, times), seconds


def _finish_seconds(first: tuple[PhaseSchedule, float] | None) -> float:
    """Seconds kept after the baselines and the final solves: ``FINISH_SECONDS``, and what a simulation, step times
    and a document of the size of the search's schedule took (``_search_schedule``): a schedule that replaces it is
    simulated again, and the plan's step times made and its document written."""
    return FINISH_SECONDS + (0.0 if first is None else first[1])


def _final_solves(search: Search, first: tuple[PhaseSchedule, float] | None, interrupted: bool,
                  baseline: Baseline | None) -> tuple[PhaseSchedule | None, bool]:
    """The fastest candidate's schedule as the search timed it, re-simulated under its activation budgets
    (``first``); then, unless an interrupt came, the ``FINALISTS`` best candidates (fewer where the time left gives
    each less than ``SOLVE_SECONDS``) solved by CP-SAT in turn, sharing the time left, the first of them the
    ``baseline``'s split, placement and recomputation where it beats every candidate (``_from_baseline``: its solve's
    warm starts hold the handcrafted families, the baseline's schedule among them, for the formulation to improve;
    where none of the solve's schedules fits, it is passed over); the best schedule of them all, and whether an
    interrupt came (an interrupt during the CP-SAT solves keeps what they found and solves no more)."""
    if first is None:
        return None, interrupted
    best = first[0]
    ranked = sorted((x for x in search.timed.values() if math.isfinite(x.step_time)), key=lambda x: x.step_time)
    ranked = _from_baseline(baseline, ranked)
    affordable = int((search.left() - _finish_seconds(first)) / SOLVE_SECONDS)
    finalists = [] if interrupted else ranked[:affordable][:FINALISTS]
    for k, candidate in enumerate(finalists):
        left = (search.left() - _finish_seconds(first)) / (len(finalists) - k)
        if left < SOLVE_SECONDS:
            break
        request = search.request.model_copy(update={
            "placement": candidate.placement, "chunks": candidate.chunks, "recompute": candidate.recompute,
            "partition": candidate.counts, "solver": "cpsat", "time_limit": left})
        try:
            result = solve_request(search.model, request, search.progress, document=False)
        except KeyboardInterrupt:  # before this solve had a schedule: the best one so far
            search.log_line(f"interrupted: cpsat on {candidate.label()} {list(candidate.counts)} stopped before it "
                            "had a schedule")
            return best, True
        except InfeasibleError as exc:  # the best baseline's split: the solve's own schedules may not fit it
            search.log_line(f"cpsat on {candidate.label()} {list(candidate.counts)} ({candidate.origin}): {exc}")
            continue
        search.log_line(f"cpsat on {candidate.label()} {list(candidate.counts)}: {result.step_time:.6g}s "
                        f"({result.status})")
        if result.step_time < best.timeline.makespan:
            assert result.costs is not None  # a solve of a model has its costs
            source = "cpsat" if candidate.origin != BASELINE else f"cpsat from the {candidate.origin}"
            best = PhaseSchedule(result.timeline, source, result.costs,
                        (candidate.placement, candidate.chunks, candidate.recompute))
        if result.interrupted:
            search.log_line("interrupted: the final solves stop here, with the best schedule found so far")
            return best, True
    return best, interrupted


BASELINE = "best baseline's split"
"""The origin of the candidate made of the best baseline (``_from_baseline``)."""


def _from_baseline(baseline: Baseline | None, ranked: list[Candidate]) -> list[Candidate]:
    """``ranked`` with ``baseline``'s split, placement and recomputation first where it is faster than every one of
    them (the same candidate timed by the search dropped): a candidate the formulation can improve."""
    if baseline is None or baseline.counts is None or baseline.step_time is None:
        return ranked
    mine = Candidate(baseline.placement, baseline.chunks, baseline.counts, BASELINE, baseline.step_time,
                     baseline.recompute)
    if ranked and ranked[0].step_time <= mine.step_time:
        return ranked
    return [mine] + [x for x in ranked if x.key() != mine.key()]
