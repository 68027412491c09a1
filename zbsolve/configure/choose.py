"""configure(): from a cluster and a global batch to the whole parallel configuration (``zbsolve configure``,
docs/configure.md).

1. **Enumerate** every configuration of the degrees' menus (``configure.space``), a shape (tp, cp, pp,
   ep) a job, in groups that share one estimated model and recomputation; what is refused is counted invalid.
2. **Prune** a group that cannot fit (static bytes and one microbatch's activations), then each configuration
   whose own order's activations cannot (``bounds.order_fits``) or whose runtime refuses it
   (``configure.runtime_rules``), and order the rest by a lower bound on ``predict``'s step (``configure.bounds``):
   the recipe-shaped first (``space.recipe_shaped``), then best first.
3. **Time** them with ``predict`` in that order beside the enumeration, in parallel processes or on Dask, and stop
   once every shape is enumerated and the next bound is no shorter than the ``top``-th best step timed that fits
   (branch and bound, ``configure.search``: nothing pruned beats the top). Stopped earlier (the time limit, an
   interrupt), the result says so: the choice is the best found, with its gap to the best bound among the
   untimed (``ConfigureResult.status``).
4. **Refine** the best ``refine`` with ``plan`` (split, placement, order and per-stage recomputation chosen for the
   target), sharing the time left; the chosen configuration is the fastest, planned or predicted. The best
   configuration's order as ``predict`` simulated it is its plan where no plan of its own is faster (it was not
   refined, its plan found nothing that fits in its share, or is slower), so that a configuration chosen has a
   schedule document; making it measures what writing that document takes, which the refining leaves.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from zbsolve.base.checks import check_count, check_positive
from zbsolve.base.errors import InfeasibleError, InputError
from zbsolve.base.parallel import make_executor
from zbsolve.base.units import gib
from zbsolve.configure.predict import Configuration, configured_model, run
from zbsolve.configure.result import ConfigureResult, Ranked, why_loses
from zbsolve.configure.search import ENUMERATE_SHARE, BranchAndBound, key, label
from zbsolve.configure.space import Space
from zbsolve.core.torch_compat import has_pipelining
from zbsolve.costmodel.calibration import AUTO, Calibration
from zbsolve.costmodel.config_values import read_config
from zbsolve.io.targets import TARGETS, check_target
from zbsolve.io.targets.launch import FLAGS, Launch
from zbsolve.optimize.warm_start import after_search
from zbsolve.planning.planner import FINISH_SECONDS, plan
from zbsolve.planning.result import OWN_ORDER, PlanResult
from zbsolve.problem.costs import DEFAULT_RESERVE
from zbsolve.problem.recompute import described
from zbsolve.schedulers.builtins import builtin_placement

REFINE_SHARE = 0.5
"""Share of the time left once the search starts (``_share``) kept for refining (where it is ``PLAN_SECONDS``): the
enumeration and the timing stop once the rest is spent (sooner where they end), and the timing goes on into it while
no configuration timed fits (there is nothing to refine)."""
PLAN_SECONDS = 2.0
"""The least time a plan is given: where the refining's share is shorter, nothing is refined and the timing takes
it; with less left for another, the candidates left keep their predicted figures."""
IN_FLIGHT = 2
"""Jobs kept submitted per worker, so that none waits while the next bound is read."""


def configure(config: str | Path, *, gpus: int, global_batch: int, seq_len: int, gpu: str = "h100",
              dtype: str = "bf16", target: str = "megatron", top: int = 10, refine: int = 3,
              time_limit: float = 600.0, jobs: int | None = None, executor: str | cf.Executor | None = None,
              progress: Callable[[str], None] | None = None, tp_comm_overlap: bool = False,
              dispatcher: str = "alltoall", device_memory: int | str | None = None,
              reserve: int | str = DEFAULT_RESERVE, began: float | None = None,
              calibration: str | Path | Calibration | None = AUTO) -> ConfigureResult:
    """The fastest configurations of the model of Hugging Face ``config`` on ``gpus`` GPUs of preset ``gpu`` for
    ``global_batch`` sequences of ``seq_len`` tokens a step, for runtime ``target`` (megatron, torchtitan, zbsolve):
    every configuration enumerated, pruned by memory and by a bound on its step, the rest timed by ``predict`` until
    no other can enter the ``top``, and the best ``refine`` planned (``plan``). Everything, enumeration and refining
    included, ends within ``time_limit`` seconds (a plan may run past its share: ``planning.planner``); an interrupt
    (``KeyboardInterrupt``) returns the best found so far, with ``interrupted`` set (one before any configuration
    that fits was timed propagates). Shapes are enumerated and configurations timed ``jobs`` at a time in local
    processes (default: all cores) or on ``executor`` ("dask://HOST:PORT" or a ``concurrent.futures.Executor``),
    which the plans share; ``progress`` hears how far the search is. ``device_memory`` and ``reserve`` are bytes
    per device, or text such as "80GiB" (default: the preset's memory, 4 GiB kept free); ``calibration`` scales the
    cost model's terms (``Setup.calibration``; default: the shipped fit of the GPU and runtime, None: none).
    ``began`` (``time.monotonic()``, default now) is when the limit started: a command line's start, so that its
    loading counts."""
    began = time.monotonic() if began is None else began
    space = Space.of(config, target=target, gpus=gpus, global_batch=global_batch, seq_len=seq_len, gpu=gpu,
                     dtype=dtype, tp_comm_overlap=tp_comm_overlap, dispatcher=dispatcher,
                     device_memory=device_memory, reserve=reserve, calibration=calibration)
    check_count("top", top)
    if isinstance(refine, bool) or not isinstance(refine, int) or refine < 0:
        raise InputError(f"refine = {refine!r} must be a whole number >= 0")
    check_positive("time_limit", time_limit)
    check_target(target)
    say = progress or (lambda line: None)
    end = began + time_limit
    search = BranchAndBound(space, top, end, say)
    has_pipelining()  # imported once, before the workers start: those forked share it, the memory test of each
    # configuration's order (``bounds.order_fits``) and the plans need it
    parallel = jobs or (os.cpu_count() or 1)
    pool, release = make_executor(executor, parallel)
    _share(search, end, refine)
    interrupted = False
    try:
        try:
            search.run(pool, parallel * IN_FLIGHT)
            if not search.fitting and search.deadline < end:  # nothing to refine: its share goes on timing, all
                # but the time to make the plan of the one that fits (about one job) and return
                search.deadline = search.enumerate_by = end - FINISH_SECONDS - search.job_seconds
                search.run(pool, parallel * IN_FLIGHT, until_fits=True)
        except KeyboardInterrupt:
            interrupted = True
            if not search.fitting:
                raise
            say("interrupted: ranking the configurations timed so far")
        ranked = search.ranked()
        plans: dict[int, PlanResult] = {}
        notes: list[str] = []
        first = next((k for k, r in enumerate(ranked) if r.configuration.pp > 1), None)
        predicted, writing = None, 0.0
        if not interrupted and first is not None:
            predicted, writing = predicted_plan(ranked[first].configuration, target)
        if not interrupted and refine:
            if search.abandoned:  # the jobs left running are stopped where the executor is this search's own
                release(False)
                pool, release = make_executor(executor, parallel)
            interrupted = _refine(ranked, refine, space, end - FINISH_SECONDS - writing, pool, parallel, say, plans,
                                  notes)
    finally:
        release(False)  # every result needed is in: what still runs (a job the search or a plan left) is stopped
    refined = len(plans)
    if predicted is not None and first is not None and (first not in plans
                                                        or plans[first].step_time > predicted.step_time):
        plans[first] = predicted
    order = sorted(range(len(ranked)), key=lambda k: (ranked[k].step_s, key(ranked[k].configuration)))
    best = ranked[order[0]]
    ranked = [replace(ranked[k], why="" if k == order[0] else why_loses(ranked[k], best)) for k in order]
    chosen = plans.get(order[0])
    if chosen is not None:
        chosen = replace(chosen, launch=launch_of(best.configuration))
    counts = search.counts(refined)
    complete, gap = ConfigureResult.gap_of(counts, ranked[0].prediction.step_time_s, interrupted)
    return ConfigureResult(tuple(ranked), counts, ranked[0], chosen, interrupted, time.monotonic() - began, target,
                           tuple(notes), tuple(search.timed), complete, gap)


def _share(search: BranchAndBound, end: float, refine: int) -> None:
    """Set when ``search`` stops enumerating and timing, out of the time left now (the loading, torch's import and
    the workers' start spent): ``REFINE_SHARE`` of it kept for refining where there is any and that share gives a
    plan ``PLAN_SECONDS`` (else the timing takes all but ``FINISH_SECONDS``: timing more configurations counts for
    more than planning one), ``ENUMERATE_SHARE`` of the rest for the enumeration."""
    now = time.monotonic()
    left = max(0.0, end - now)
    kept = 0.0 if not refine else REFINE_SHARE * left if REFINE_SHARE * left >= PLAN_SECONDS else min(
        left, FINISH_SECONDS)
    search.deadline = end - kept
    search.enumerate_by = now + ENUMERATE_SHARE * (left - kept)


def _refine(ranked: list[Ranked], refine: int, space: Space, deadline: float, pool: cf.Executor, jobs: int,
            say: Callable[[str], None], plans: dict[int, PlanResult], notes: list[str]) -> bool:
    """Plan the first ``refine`` of ``ranked`` that have a pipeline (pp > 1) and differ in more than their
    recomputation (which a plan chooses: ``recompute="auto"``) for the space's target, one after the other, each
    given an equal share of the time left before ``deadline`` (shared by as many as get ``PLAN_SECONDS``, the best
    first) less the most a plan has run past its share so far (measured: the first plan's cannot be known before
    it runs), its placement that of its virtual stages (interleaved with vp chunks, or sequential); each plan's step
    and memory written into ``ranked`` and the plan into ``plans`` (by rank), a plan slower than its prediction
    noted in ``notes``. Whether an interrupt came."""
    todo: dict[Configuration, int] = {}  # the first of each problem a plan solves: it chooses the recomputation
    for k, r in enumerate(ranked):
        if r.configuration.pp > 1 and len(todo) < refine:
            todo.setdefault(r.configuration.model_copy(update={"recompute": "none", "schedule": None}), k)
    late = 0.0
    for n, k in enumerate(todo.values()):
        began = time.monotonic()
        count = min(len(todo) - n, int((deadline - began) // (PLAN_SECONDS + late)))  # those that get their least
        if count < 1:
            notes.append(f"{len(todo) - n} configuration(s) not refined: {deadline - began:.1f} s left")
            break
        share = (deadline - began) / count - late
        r = ranked[k]
        c, p = r.configuration, r.prediction
        say(f"refining {label(c, p.dp)}: plan, {share:.0f} s")
        try:
            result = plan(configured_model(c, p.dp), num_devices=c.pp, num_microbatches=p.num_microbatches,
                          device_memory=c.memory, reserve=c.kept,
                          placement="interleaved" if c.vp > 1 else "sequential",
                          chunks=c.vp if c.vp > 1 else None, time_limit=share, jobs=jobs, executor=pool,
                          progress=say, recompute="auto", target=space.target)
        except KeyboardInterrupt:
            notes.append(f"interrupted while refining {label(c, p.dp)}: it keeps its predicted figures")
            return True
        except InfeasibleError as exc:
            notes.append(f"{label(c, p.dp)}: no plan ({exc}); it keeps its predicted figures")
            continue
        finally:
            late = max(late, time.monotonic() - began - share)
        plans[k] = result
        ranked[k] = replace(r, planned_step_s=result.step_time,
                            planned_memory_gib=gib(max(result.costs.used(result.timeline.peak_memory))))
        if result.step_time > p.step_time_s:
            notes.append(f"{label(c, p.dp)}: its plan ({result.step_time:.4g} s) is slower than predicted "
                         f"({p.step_time_s:.4g} s): the predicted figure stands")
        if result.interrupted:
            return True
    return False


def launch_of(c: Configuration) -> Launch:
    """What ``c`` is launched with: its model's config, its GPUs and the switches its costs assumed."""
    return Launch(read_config(c.config)[0], c.gpus, c.device.gpus_per_node, c.gpu_name,
                  tuple(flag for flag in FLAGS if getattr(c, flag)))


def predicted_plan(c: Configuration, target: str) -> tuple[PlanResult, float]:
    """``c``'s order on its split and recomputation as ``predict`` simulates it, as a plan for runtime ``target``
    (its own order, or a baseline's), with its step times; and the seconds its document's text took to make."""
    began = time.monotonic()
    model, name, counts, timeline, costs, _, _ = run(c)
    times, _, writing = after_search(timeline)
    row = TARGETS[target]
    recomputed = "" if c.recompute == "none" else f" recompute {c.recompute}"
    source = f"{row.label}{OWN_ORDER}" if row.order == "own" else f"baseline {c.partition} {name}{recomputed}"
    log = f"{name} on the {c.partition} split{recomputed} {list(counts)}, as predicted: {timeline.makespan:.6g}s"
    recompute = described(model, costs.ranges, costs.recomputed, costs.selective, costs.modules)
    return PlanResult(builtin_placement(name, c.vp), c.vp, costs, timeline, source, None, (), (),
                      time.monotonic() - began, log, recompute=recompute, target=target, measured=times), writing
