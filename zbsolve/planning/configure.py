"""configure(): from a cluster and a global batch to the whole parallel configuration (``zbsolve configure``,
docs/configure.md).

1. **Enumerate** every configuration of the degrees' menus (``planning.configurations``), in groups that share one
   estimated model and recomputation; what is refused is counted invalid.
2. **Prune** a group, then each configuration, that cannot fit (static bytes and one microbatch's activations) and
   order the rest by a lower bound on ``predict``'s step: best first, a group before its configurations.
3. **Time** them with ``predict`` in that order, in parallel processes or on Dask, and stop once the next bound is
   no shorter than the ``top``-th best step timed that fits (branch and bound: nothing pruned beats the top).
4. **Refine** the best ``refine`` with ``plan`` (split, placement, order and per-stage recomputation chosen for the
   target), sharing the time left; the chosen configuration is the fastest, planned or predicted.
"""

from __future__ import annotations

import bisect
import concurrent.futures as cf
import heapq
import itertools
import os
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from zbsolve.base.checks import check_count, check_positive
from zbsolve.base.errors import InfeasibleError, InputError, ZbsolveError
from zbsolve.base.parallel import make_executor
from zbsolve.base.units import gib
from zbsolve.io.exports import check_target
from zbsolve.planning.configurations import Assessed, Dropped, Group, Space, assess, groups
from zbsolve.planning.configure_result import ConfigureResult, Counts, Ranked, Timed, why_loses
from zbsolve.planning.planner import plan
from zbsolve.planning.predict import Configuration, Prediction, configured_model, predict
from zbsolve.planning.result import PlanResult
from zbsolve.problem.costs import DEFAULT_RESERVE
from zbsolve.problem.estimate.gpus import get_gpu

REFINE_SHARE = 0.5
"""Share of the time left once every configuration is enumerated kept for refining: the timing stops once the rest
is spent (sooner where it ends), and goes on into it while no configuration timed fits (there is nothing to
refine)."""
PLAN_SECONDS = 2.0
"""The least time a plan is given: with less left, the candidates left keep their predicted figures."""
IN_FLIGHT = 2
"""Jobs kept submitted per worker, so that none waits while the next bound is read."""
PROGRESS_SECONDS = 1.0
"""How often the search says how far it is."""


def configure(config: str | Path, *, gpus: int, global_batch: int, seq_len: int, gpu: str = "h100",
              dtype: str = "bf16", target: str = "megatron", top: int = 10, refine: int = 3,
              time_limit: float = 600.0, jobs: int | None = None, executor: str | cf.Executor | None = None,
              progress: Callable[[str], None] | None = None, tp_comm_overlap: bool = False,
              dispatcher: str = "alltoall", device_memory: int | None = None,
              reserve: int = DEFAULT_RESERVE) -> ConfigureResult:
    """The fastest configurations of the model of Hugging Face ``config`` on ``gpus`` GPUs of preset ``gpu`` for
    ``global_batch`` sequences of ``seq_len`` tokens a step, for runtime ``target`` (megatron, torchtitan, zbsolve):
    every configuration enumerated, pruned by memory and by a bound on its step, the rest timed by ``predict`` until
    no other can enter the ``top``, and the best ``refine`` planned (``plan``). Everything, refining included, ends
    within ``time_limit`` seconds; an interrupt (``KeyboardInterrupt``) returns the best found so far, with
    ``interrupted`` set (one before any configuration that fits was timed propagates). Configurations are timed
    ``jobs`` at a time in local processes (default: all cores) or on ``executor`` ("dask://HOST:PORT" or a
    ``concurrent.futures.Executor``), which the plans share; ``progress`` hears how far the search is.
    ``device_memory`` and ``reserve`` are bytes per device (default: the preset's memory, 4 GiB kept free)."""
    began = time.monotonic()
    for what, value in (("gpus", gpus), ("global_batch", global_batch), ("seq_len", seq_len), ("top", top)):
        check_count(what, value)
    if isinstance(refine, bool) or not isinstance(refine, int) or refine < 0:
        raise InputError(f"refine = {refine!r} must be a whole number >= 0")
    check_positive("time_limit", time_limit)
    check_target(target)
    get_gpu(gpu)
    space = Space(config, gpus, global_batch, seq_len, gpu, dtype, target, tp_comm_overlap, dispatcher,
                  device_memory, reserve)
    say = progress or (lambda line: None)
    end = began + time_limit
    search = _Search(space, top, end, say)
    search.enumerate()
    search.deadline = end - (end - time.monotonic()) * (REFINE_SHARE if refine else 0)
    parallel = jobs or (os.cpu_count() or 1)
    pool, release = make_executor(executor, parallel)
    interrupted = False
    try:
        try:
            search.run(pool, parallel * IN_FLIGHT)
            if not search.fitting and search.deadline < end:  # nothing to refine: its share goes on timing
                search.deadline = end
                search.run(pool, parallel * IN_FLIGHT, until_fits=True)
        except KeyboardInterrupt:
            interrupted = True
            if not search.fitting:
                raise
            say("interrupted: ranking the configurations timed so far")
        ranked = search.ranked()
        plans: dict[int, PlanResult] = {}
        notes: list[str] = []
        if not interrupted:
            interrupted = _refine(ranked, refine, space, end, pool, parallel, say, plans, notes)
    finally:
        release(False)  # every result needed is in: what still runs (a job the search or a plan left) is stopped
    order = sorted(range(len(ranked)), key=lambda k: (ranked[k].step_s, _key(ranked[k].configuration)))
    best = ranked[order[0]]
    ranked = [replace(ranked[k], why="" if k == order[0] else why_loses(ranked[k], best)) for k in order]
    return ConfigureResult(tuple(ranked), search.counts(len(plans)), ranked[0], plans.get(order[0]), interrupted,
                           time.monotonic() - began, target, tuple(notes), tuple(search.timed))


def _key(c: Configuration) -> tuple:
    """What orders configurations of the same step: their degrees, then their recomputation."""
    return c.tp, c.pp, c.vp, c.cp, c.ep, c.microbatch_size, c.zero, c.recompute


def time_configuration(c: Configuration) -> Prediction | Dropped:
    """``predict(c)``, or why it refuses ``c``: one job of the search, run in a worker."""
    try:
        return predict(c)
    except ZbsolveError as exc:
        return Dropped(1, str(exc))


class _Search:
    """The branch and bound over a space: groups and configurations in heaps by their bounds, timed best first (those
    likely to fit before the others, so that the ``top`` that fit are known early), until every bound left is no
    shorter than the ``top``-th best step timed that fits."""

    def __init__(self, space: Space, top: int, deadline: float, say: Callable[[str], None]) -> None:
        self.space, self.top, self.deadline, self.say = space, top, deadline, say
        self.heaps: tuple[list[tuple[float, int, Group | Assessed]], ...] = ([], [], [])
        """The configurations likely to fit (``Assessed.likely``), the groups, and the other configurations: each by
        its bound."""
        self.fitting: list[tuple[float, tuple, Configuration, Prediction]] = []
        """The configurations timed that fit: (step, key, configuration, prediction), fastest first."""
        self.timed: list[Timed] = []
        """Every configuration timed, in the order timed."""
        self.tally = {"enumerated": 0, "invalid": 0, "pruned_memory": 0, "timed": 0, "unfit": 0}
        self.first_refusal = ""
        self.pushed = itertools.count()

    def enumerate(self) -> None:
        """Every group of the space, in the heap or counted as dropped; an ``InputError`` where none is valid."""
        for group in groups(self.space):
            if isinstance(group, Dropped):
                self._drop(group)
            else:
                self._push(group.bound, group)
            self.tally["enumerated"] += group.size if isinstance(group, Dropped) else len(group.vps)
        self.say(f"{self.tally['enumerated']} configurations enumerated, {len(self.heaps[1])} groups to search")
        if not self.heaps[1] and self.tally["invalid"] == self.tally["enumerated"]:
            s = self.space
            raise InputError(f"gpus = {s.gpus}, global_batch = {s.global_batch}: no valid configuration of "
                             f"{Path(s.config).name} (the first refused: {self.first_refusal})")

    def _drop(self, dropped: Dropped) -> None:
        self.tally["pruned_memory" if dropped.memory else "invalid"] += dropped.size
        self.first_refusal = self.first_refusal or dropped.why

    def _push(self, bound: float, item: Group | Assessed) -> None:
        heap = self.heaps[1 if isinstance(item, Group) else 0 if item.likely else 2]
        heapq.heappush(heap, (bound, next(self.pushed), item))

    def _next(self) -> tuple[float, Group | Assessed] | None:
        """The next to time or assess; None once every bound left is no shorter than ``kth`` (all of them pruned).
        Until ``top`` configurations that fit are timed (none can be pruned yet), those likely to fit are timed
        before another group is assessed; then the best bound of those and the groups comes first; the configurations
        unlikely to fit come last."""
        kth, likely, grouped, unlikely = self.kth(), *self.heaps
        first = [likely] if len(self.fitting) < self.top else []
        first += sorted((h for h in (likely, grouped) if h), key=lambda h: h[0][0])
        heap = next((h for h in (*first, unlikely) if h and h[0][0] < kth), None)
        if heap is None:
            return None
        bound, _, item = heapq.heappop(heap)
        return bound, item

    def kth(self) -> float:
        """The ``top``-th best step timed that fits (infinity until that many are)."""
        return self.fitting[self.top - 1][0] if len(self.fitting) >= self.top else float("inf")

    def run(self, pool: cf.Executor, most: int, until_fits: bool = False) -> None:
        """Time best first until the next bound is no shorter than ``kth`` or the deadline passes (with
        ``until_fits``, or a configuration timed fits)."""
        flying: dict[cf.Future, tuple[float, Group | Assessed]] = {}
        said = time.monotonic()
        try:
            while True:
                while (len(flying) < most and time.monotonic() < self.deadline
                       and not (until_fits and self.fitting)):
                    popped = self._next()
                    if popped is None:
                        break
                    bound, item = popped
                    job = pool.submit(assess, self.space, item) if isinstance(item, Group) else pool.submit(
                        time_configuration, item.configuration)
                    flying[job] = bound, item
                if not flying:
                    break
                done, _ = cf.wait(flying, timeout=max(0.0, self.deadline - time.monotonic()),
                                  return_when=cf.FIRST_COMPLETED)
                if not done:  # the deadline: the jobs not started are dropped, those running are waited for
                    for job in [job for job in flying if job.cancel()]:
                        self._push(*flying.pop(job))
                    done = set(cf.wait(flying).done)
                for job in done:
                    self._take(flying.pop(job)[1], job.result())
                if time.monotonic() - said > PROGRESS_SECONDS:
                    said = time.monotonic()
                    self.say(self._progress())
        finally:
            for job, (bound, item) in flying.items():  # an interrupt: what was running is left untimed
                job.cancel()
                self._push(bound, item)

    def _take(self, item: Group | Assessed, outcome: list[Assessed | Dropped] | Prediction | Dropped) -> None:
        if isinstance(outcome, list):
            for one in outcome:
                if isinstance(one, Dropped):
                    self._drop(one)
                elif not one.fits:
                    self.tally["pruned_memory"] += 1
                else:
                    self._push(one.bound, one)
        elif isinstance(outcome, Dropped):
            self._drop(outcome)
        else:
            self.tally["timed"] += 1
            c = item.configuration
            self.timed.append(Timed.of(c, outcome))
            if not outcome.fits:
                self.tally["unfit"] += 1
                return
            bisect.insort(self.fitting, (outcome.step_time_s, _key(c), c, outcome), key=lambda x: x[:2])

    def _progress(self) -> str:
        best = self.fitting[0] if self.fitting else None
        shown = "" if best is None else f", best {best[0]:.4g} s ({_label(best[2], best[3])})"
        return f"timed {self.tally['timed']}, {sum(map(len, self.heaps))} waiting{shown}"

    def ranked(self) -> list[Ranked]:
        """The ``top`` best configurations timed that fit; an ``InfeasibleError`` where none does."""
        if not self.fitting:
            left = " before the time limit" if any(self.heaps) else ""
            raise InfeasibleError(f"no configuration timed{left} fits {self.space.gpu}'s memory (the search's counts: "
                                  f"{self.counts(0).line()}); try more GPUs, or another target")
        return [Ranked(c, p, c.command()) for _, _, c, p in self.fitting[:self.top]]

    def counts(self, refined: int) -> Counts:
        """The counts, what is left in the heap pruned by the bound where it is no shorter than ``kth``."""
        kth = self.kth()
        sizes = [(bound, len(item.vps) if isinstance(item, Group) else 1) for heap in self.heaps
                 for bound, _, item in heap]
        bound = sum(n for b, n in sizes if b >= kth)
        untimed = sum(n for b, n in sizes if b < kth)
        return Counts(refined=refined, pruned_bound=bound, untimed=untimed, **self.tally)


def _label(c: Configuration, p: Prediction) -> str:
    """tp/pp/vp/cp/ep/dp, micro-batch size, ZeRO and recomputation of ``c``."""
    return f"{c.tp}/{c.pp}/{c.vp}/{c.cp}/{c.ep}/{p.dp} mbs {c.microbatch_size} zero {c.zero} {c.recompute}"


def _refine(ranked: list[Ranked], refine: int, space: Space, deadline: float, pool: cf.Executor, jobs: int,
            say: Callable[[str], None], plans: dict[int, PlanResult], notes: list[str]) -> bool:
    """Plan the first ``refine`` of ``ranked`` that have a pipeline (pp > 1) for the space's target, each given an
    equal share of the time left before ``deadline``, its placement that of its virtual stages (interleaved with
    vp chunks, or sequential); each plan's step and memory written into ``ranked`` and the plan into ``plans`` (by
    rank), a plan slower than its prediction noted in ``notes``. Whether an interrupt came."""
    todo = [k for k in range(min(refine, len(ranked))) if ranked[k].configuration.pp > 1]
    for n, k in enumerate(todo):
        share = (deadline - time.monotonic()) / (len(todo) - n)
        r = ranked[k]
        c, p = r.configuration, r.prediction
        if share < PLAN_SECONDS:
            notes.append(f"{len(todo) - n} configuration(s) not refined: {share:.1f} s left for each")
            break
        say(f"refining {_label(c, p)}: plan, {share:.0f} s")
        try:
            result = plan(configured_model(c, p.dp), num_devices=c.pp, num_microbatches=p.num_microbatches,
                          device_memory=space.memory(), reserve=c.reserve,
                          placement="interleaved" if c.vp > 1 else "sequential",
                          chunks=c.vp if c.vp > 1 else None, time_limit=share, jobs=jobs, executor=pool,
                          progress=say, recompute="auto", target=space.target)
        except KeyboardInterrupt:
            notes.append(f"interrupted while refining {_label(c, p)}: it keeps its predicted figures")
            return True
        except InfeasibleError as exc:
            notes.append(f"{_label(c, p)}: no plan ({exc}); it keeps its predicted figures")
            continue
        plans[k] = result
        ranked[k] = replace(r, planned_step_s=result.step_time,
                            planned_memory_gib=gib(max(result.costs.used(result.timeline.peak_memory))))
        if result.step_time > p.step_time_s:
            notes.append(f"{_label(c, p)}: its plan ({result.step_time:.4g} s) is slower than predicted "
                         f"({p.step_time_s:.4g} s): the predicted figure stands")
        if result.interrupted:
            return True
    return False
