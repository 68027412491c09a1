"""The search of ``zbsolve configure`` (``configure.choose``): every shape of the space enumerated in a job of its
own, then a branch and bound over the groups and configurations, each timed by ``predict`` in a job, best bound
first, until no configuration left can enter the ``top``."""

from __future__ import annotations

import bisect
import concurrent.futures as cf
import heapq
import itertools
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from zbsolve.base.errors import InfeasibleError, InputError, ZbsolveError
from zbsolve.base.units import GIB, size_text
from zbsolve.configure.predict import Configuration, Prediction, degrees, predict
from zbsolve.configure.result import Counts, Ranked, Timed
from zbsolve.configure.runtime_rules import runtime_warnings
from zbsolve.configure.space import (
    Assessed,
    Dropped,
    Group,
    Space,
    assess,
    shape_groups,
    shape_refusal,
    shape_size,
    shapes,
)

ENUMERATE_SHARE = 0.5
"""Share of the timing's time the enumeration may take (half the jobs at a time, the timing of what it found beside
it): the shapes not enumerated by then are counted as such, and the timing goes on with those that were."""
PROGRESS_SECONDS = 1.0
"""How often the search says how far it is."""

Item = dict[str, int] | Group | Assessed
"""What one job takes: a shape to enumerate (``shape_groups``), a group to assess, a configuration to time."""


def time_configuration(c: Configuration) -> Prediction | Dropped:
    """``predict(c)``, or why it refuses ``c``: one job of the search, run in a worker."""
    try:
        return predict(c)
    except ZbsolveError as exc:
        return Dropped(1, str(exc))


def _job(work: Callable[..., object], *args: object) -> tuple[object, float]:
    """``work(*args)`` and the seconds it took where it ran: one job of the search, in a worker."""
    began = time.monotonic()
    return work(*args), time.monotonic() - began


def key(c: Configuration) -> tuple:
    """What orders configurations of the same step: their degrees, then their recomputation and split."""
    return c.tp, c.pp, c.vp, c.cp, c.ep, c.microbatch_size, c.zero, c.recompute, c.partition


def label(c: Configuration, dp: int) -> str:
    """tp/pp/vp/cp/ep/dp (``dp`` its data-parallel degree), micro-batch size, ZeRO, recomputation and a split other
    than uniform of ``c``."""
    split = "" if c.partition == "uniform" else f" {c.partition}"
    return f"{c.tp}/{c.pp}/{c.vp}/{c.cp}/{c.ep}/{dp} mbs {c.microbatch_size} zero {c.zero} {c.recompute}{split}"


class BranchAndBound:
    """The search over a space: its shapes enumerated, one job each (a shape whose degrees never divide is counted
    invalid at once), and beside them the groups and configurations they yield, in heaps by their bounds, timed best
    first (those likely to fit before the others until the ``top`` that fit are known), until every shape is
    enumerated and every bound left is no shorter than the ``top``-th best step timed that fits. Nothing runs past
    ``deadline``: the jobs running then are left (``abandoned``) and what they held counted as not enumerated or
    untimed."""

    def __init__(self, space: Space, top: int, deadline: float, say: Callable[[str], None]) -> None:
        self.space, self.top, self.deadline, self.say = space, top, deadline, say
        self.enumerate_by = deadline
        """When the enumeration stops: the shapes left then are counted as not enumerated."""
        self.shapes: deque[dict[str, int]] = deque()
        """The shapes still to enumerate."""
        self.enumerating = 0
        """The shapes being enumerated."""
        self.heaps: tuple[list[tuple[float, int, Group | Assessed]], ...] = ([], [], [], [], [])
        """The recipe-shaped groups and configurations likely to fit (``space.recipe_shaped``: timed first), the
        other configurations likely to fit (``Assessed.likely``), the other groups likely to fit (``Group.likely``),
        the other groups, and the other configurations: each by its bound."""
        self.fitting: list[tuple[float, tuple, Configuration, Prediction]] = []
        """The configurations timed that fit: (step, key, configuration, prediction), fastest first."""
        self.timed: list[Timed] = []
        """Every configuration timed, in the order timed."""
        self.tally = {"enumerated": 0, "invalid": 0, "pruned_memory": 0, "timed": 0, "unfit": 0}
        self.abandoned = False
        """Whether jobs were left running at the deadline."""
        self.job_seconds = 0.0
        """The longest a job has taken, where it ran (its queue not counted): no job starts that would still run
        at the deadline were it as long."""
        self.first_refusal = ""
        self.least_need = float("inf")
        """The fewest bytes a device needs of what was pruned for memory, by the bound that pruned it."""
        self.pushed = itertools.count()
        for shape in shapes(space):
            refusal = shape_refusal(space, shape)
            if refusal is None:
                self.shapes.append(shape)
            else:
                self.tally["enumerated"] += shape_size(space, shape)
                self._drop(Dropped(shape_size(space, shape), refusal))
        if not self.shapes:
            self._refuse()

    def _refuse(self) -> None:
        """An ``InputError``: no configuration of the space is valid; where the GPUs outnumber what the global batch
        can spread over (one sequence per data-parallel rank of the most model-parallel shape), it blames the batch."""
        s = self.space.setup
        widest = max(shape["tp"] * shape["pp"] * shape["cp"] for shape in shapes(self.space))
        why = (f"the global batch of {s.global_batch} sequences spreads over at most {s.global_batch * widest} GPUs "
               f"(one sequence per data-parallel rank, tp x pp x cp at most {widest}): use fewer GPUs or a larger "
               "global batch" if s.gpus > s.global_batch * widest else f"the first refused: {self.first_refusal}")
        raise InputError(f"gpus = {s.gpus}, global_batch = {s.global_batch}: no valid configuration of "
                         f"{Path(s.config).name} ({why})")

    def _drop(self, dropped: Dropped) -> None:
        self.tally["pruned_memory" if dropped.memory else "invalid"] += dropped.size
        if dropped.memory:
            self.least_need = min(self.least_need, dropped.need)
        self.first_refusal = self.first_refusal or dropped.why

    def _push(self, bound: float, item: Group | Assessed) -> None:
        first = item.first and item.likely
        heap = self.heaps[0 if first else (2 if item.likely else 3) if isinstance(item, Group) else 1 if item.likely
                          else 4]
        heapq.heappush(heap, (bound, next(self.pushed), item))

    def _next(self, shapes: int) -> tuple[float, Item] | None:
        """The next job's bound and item; None once nothing is left below ``kth`` (all of it pruned) and no shape is
        left to enumerate. A shape while fewer than ``shapes`` are being enumerated (until ``enumerate_by``), so that
        timing goes on beside the enumeration; else the recipe-shaped groups and configurations below ``kth``, best
        bound first (their order only: nothing is pruned while any heap holds a bound below ``kth``); else until ``top``
        configurations that fit are timed (none can be pruned yet), those likely to fit first, and until one fits, the
        other configurations assessed, then the groups likely to fit, then the others (a first configuration that fits
        comes soon however many groups there are); else the best bound, groups and configurations alike (a configuration
        unlikely to fit that may still enter the top waits for no group whose bound is longer); else another shape."""
        enumerating = bool(self.shapes) and time.monotonic() < self.enumerate_by
        if enumerating and self.enumerating < shapes:
            self.enumerating += 1
            return 0.0, self.shapes.popleft()
        kth, (first, likely, likely_groups, grouped, unlikely) = self.kth(), self.heaps
        if first and first[0][0] < kth:  # what a practitioner would try first, before the long tail
            bound, _, item = heapq.heappop(first)
            return bound, item
        heaps = [h for h in self.heaps if h]
        if likely and len(self.fitting) < self.top:
            heaps = [likely]
        elif heaps and not self.fitting:  # nothing fits yet: the likeliest to fit first
            heaps = [next(h for h in (unlikely, likely_groups, grouped, first) if h)]
        heap = min(heaps, key=lambda h: h[0][0], default=None)
        if heap is not None and heap[0][0] < kth:
            bound, _, item = heapq.heappop(heap)
            return bound, item
        if enumerating:
            self.enumerating += 1
            return 0.0, self.shapes.popleft()
        return None

    def kth(self) -> float:
        """The ``top``-th best step timed that fits (infinity until that many are)."""
        return self.fitting[self.top - 1][0] if len(self.fitting) >= self.top else float("inf")

    def _submit(self, pool: cf.Executor, item: Item) -> cf.Future:
        if isinstance(item, dict):
            return pool.submit(_job, shape_groups, self.space, item)
        if isinstance(item, Group):
            return pool.submit(_job, assess, self.space, item)
        return pool.submit(_job, time_configuration, item.configuration)

    def _put_back(self, bound: float, item: Item) -> None:
        """An item whose job did not run: a shape to enumerate, else back in its heap."""
        if isinstance(item, dict):
            self.enumerating -= 1
            self.shapes.appendleft(item)
        else:
            self._push(bound, item)

    def run(self, pool: cf.Executor, most: int, until_fits: bool = False) -> None:
        """Enumerate and time best first (``_next``), ``most`` jobs at a time (each only where the longest job so far
        would end by the deadline), until every shape is enumerated and nothing is left below ``kth``, or the
        deadline passes (with ``until_fits``, or a configuration timed fits): the jobs running then are left; an
        ``InputError`` where every configuration is refused."""
        flying: dict[cf.Future, tuple[float, Item]] = {}
        said = time.monotonic()
        try:
            while True:
                while (len(flying) < most and time.monotonic() + self.job_seconds < self.deadline
                       and not (until_fits and self.fitting)):
                    popped = self._next(max(1, most // 2))
                    if popped is None:
                        break
                    flying[self._submit(pool, popped[1])] = popped
                stop = until_fits and bool(self.fitting)
                if not flying or stop:
                    break
                done, _ = cf.wait(flying, timeout=max(0.0, self.deadline - time.monotonic()),
                                  return_when=cf.FIRST_COMPLETED)
                if not done:  # the deadline
                    break
                for job in done:
                    outcome, seconds = job.result()
                    self.job_seconds = max(self.job_seconds, seconds)
                    self._take(flying.pop(job), outcome)
                if time.monotonic() - said > PROGRESS_SECONDS:
                    said = time.monotonic()
                    self.say(self._progress())
        finally:  # the deadline or an interrupt: what was not done is put back, what runs is left
            for job, (bound, item) in flying.items():
                self.abandoned |= not job.cancel()
                self._put_back(bound, item)
        if not self.shapes and self.tally["invalid"] == self.tally["enumerated"]:  # every shape refused
            self._refuse()

    def _take(self, popped: tuple[float, Item], outcome: object) -> None:
        """What a job returned: a shape's groups, a group's configurations, or a configuration's figures."""
        item = popped[1]
        if isinstance(item, dict):
            assert isinstance(outcome, list)  # shape_groups'
            for group in outcome:
                self.tally["enumerated"] += group.size if isinstance(group, Dropped) else len(group.vps)
                if isinstance(group, Dropped):
                    self._drop(group)
                else:
                    self._push(group.bound, group)
            self.enumerating -= 1
            if not self.shapes and not self.enumerating:
                groups = len(self.heaps[1]) + len(self.heaps[2])
                self.say(f"{self.tally['enumerated']} configurations enumerated, {groups} groups to search")
        elif isinstance(outcome, list):
            assert isinstance(item, Group)
            self.tally["enumerated"] += len(outcome) - len(item.vps)  # the splits after the first, once assessed
            for one in outcome:
                if isinstance(one, Dropped):
                    self._drop(one)
                elif not one.fits:
                    self.tally["pruned_memory"] += 1
                    self.least_need = min(self.least_need, one.need)
                else:
                    self._push(one.bound, one)
        elif isinstance(outcome, Dropped):
            self._drop(outcome)
        else:
            assert isinstance(outcome, Prediction) and isinstance(item, Assessed)
            self.tally["timed"] += 1
            c = item.configuration
            self.timed.append(Timed.of(c, outcome))
            if not outcome.fits:
                self.tally["unfit"] += 1
                return
            bisect.insort(self.fitting, (outcome.step_time_s, key(c), c, outcome), key=lambda x: x[:2])

    def _progress(self) -> str:
        best = self.fitting[0] if self.fitting else None
        shown = "" if best is None else f", best {best[0]:.4g} s ({label(best[2], best[3].dp)})"
        left = f", {len(self.shapes)} shapes to enumerate" if self.shapes else ""
        return f"timed {self.tally['timed']}, {sum(map(len, self.heaps))} waiting{left}{shown}"

    def ranked(self) -> list[Ranked]:
        """The ``top`` best configurations timed that fit; an ``InfeasibleError`` where none does."""
        if not self.fitting:
            raise InfeasibleError(self._none_fits())
        return [Ranked(c, p, c.command(), warnings=runtime_warnings(self.space.target, c))
                for _, _, c, p in self.fitting[:self.top]]

    def _none_fits(self) -> str:
        """Why no configuration is ranked: none timed fits the device memory used (given, or the preset's) where the
        search finished; else what was left untimed (a configuration that fits may be among them), and that a longer
        time limit times more. Each says what the configuration timed closest to fitting lacks and the least that
        those pruned for memory need (``_shortfalls``)."""
        counts, s, why = self.counts(0), self.space.setup, "; ".join(self._shortfalls())
        given = "as given" if s.device_memory is not None else f"{s.gpu}'s"
        memory = f"device_memory {size_text(s.memory)} a device ({given})"
        if not (any(self.heaps) or self.shapes):
            return (f"no configuration fits {memory}{': ' * bool(why)}{why} (the search's counts: {counts.line()}); "
                    "try more GPUs, a larger device memory, or another target")
        left = ", ".join(part for n, part in ((counts.untimed, f"{counts.untimed} configurations left untimed"),
                                              (counts.unenumerated, f"{counts.unenumerated} not enumerated")) if n)
        timed = ("nothing was timed" if not counts.timed else
                 f"none of the {counts.timed} configurations timed fits {memory}")
        said = "" if not why else f"; {why}" if counts.timed else f"; {memory}: {why}"
        return (f"{timed} before the time limit ({left}; the search's counts: {counts.line()}){said}; a longer time "
                "limit (--time-limit) times them")

    def _shortfalls(self) -> list[str]:
        """What the configuration timed closest to fitting needs on its busiest device and lacks, and the least that
        those pruned for memory need by the bound that pruned them."""
        why = []
        closest = min((t for t in self.timed if not t.fits), key=lambda t: t.memory_gib, default=None)
        if closest is not None:
            c, need = closest.configuration, closest.memory_gib * GIB
            why.append(f"the closest timed, {label(c, degrees(c)[0])}, needs {size_text(need)} on its busiest "
                       f"device, {size_text(need - c.memory)} short")
        if self.least_need < float("inf"):
            why.append(f"the {self.tally['pruned_memory']} pruned for memory need at least "
                       f"{size_text(self.least_need)} a device by the bound that pruned them (static bytes, the "
                       f"activations held and the reserve), {size_text(self.least_need - self.space.setup.memory)} "
                       "short")
        return why

    def counts(self, refined: int) -> Counts:
        """The counts, what is left in the heaps pruned by the bound where it is no shorter than ``kth``, the
        shapes left not enumerated."""
        kth = self.kth()
        sizes = [(bound, len(item.vps) if isinstance(item, Group) else 1) for heap in self.heaps
                 for bound, _, item in heap]
        bound = sum(n for b, n in sizes if b >= kth)
        untimed = sum(n for b, n in sizes if b < kth)
        unenumerated = sum(shape_size(self.space, shape) for shape in self.shapes)
        best = min((b for b, _ in sizes if b < kth), default=None)
        return Counts(refined=refined, pruned_bound=bound, untimed=untimed, unenumerated=unenumerated,
                      untimed_bound_s=best, **self.tally)
