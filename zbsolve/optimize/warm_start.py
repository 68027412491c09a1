"""The first schedule, the floor and the warm starts of a solve: the placement's handcrafted families, the
one-at-a-time order, the paper's heuristic and ZB-V's greedy generator, each kept when it beats the best so far."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from zbsolve.base.checks import slack
from zbsolve.base.errors import BudgetError, InputError, ZbsolveError
from zbsolve.core.memory import fits
from zbsolve.core.placement import CHUNKS, vshape
from zbsolve.core.profile import UNIT
from zbsolve.core.schedule import Schedule, build, pair_count
from zbsolve.core.simulator import Timeline, simulate
from zbsolve.core.spec import Spec, make_spec
from zbsolve.core.step_time import StepTimes, step_times
from zbsolve.core.transforms import with_limit
from zbsolve.io.document import document_text, to_document
from zbsolve.optimize.backends.protocol import Log
from zbsolve.optimize.budget import Budget
from zbsolve.optimize.pairing import least_work
from zbsolve.optimize.periodic import periodic
from zbsolve.schedulers.families import PLACEMENT_FAMILIES, make_schedule
from zbsolve.schedulers.heuristic import heuristic
from zbsolve.schedulers.one_at_a_time import one_at_a_time
from zbsolve.schedulers.vgreedy import v_greedy

FIRST = {"sequential": ("zb-h1", "1f1b"), "interleaved": ("1f1b-i",), "vshape": ("zb-v",)}
"""The placement's families (of two chunks) that build in about one simulation's time, most memory first: the
first of them that fits, else one microbatch at a time, is a solve's first schedule."""
OVERLAP_FAMILIES = {"vshape": ("dualpipev",)}
"""The families whose F&B pairs a solve tries too where passes communicate (with two chunks)."""
PERIODIC_SHARE, PERIODIC_SECONDS = 0.2, 1.0
"""The periodic pattern's search takes this share of the time left after the heuristic and the V-shape greedy, and
no longer than they took, or this many seconds where that is more (a small pattern solves in milliseconds)."""
ONE_AT_A_TIME = "one-at-a-time"
"""The schedule that runs one microbatch at a time on every device: the least memory, valid whenever any is."""


@dataclass
class Best:
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
    overlap: bool = False
    """Whether F and B may run as overlapped pairs: bounds on passes run one at a time then bound nothing
    (``proven`` ignores them) and the best schedule without pairs is kept too, for the formulation."""
    unpaired: Timeline | None = None
    """The best schedule without pairs, where ``overlap``."""
    measured: tuple[Timeline, StepTimes] | None = None
    """The first schedule and its step times, made to measure what the result's take (the result's own while the
    first is the best)."""

    @property
    def value(self) -> float:
        """The objective of the best schedule."""
        return self.timeline.objective(self.objective) if self.timeline is not None else math.inf

    @property
    def warm(self) -> Timeline | None:
        """The best schedule the formulation can take as its warm start: without pairs where ``overlap``."""
        return self.unpaired if self.overlap else self.timeline

    def offer(self, name: str, timeline: Timeline, log: Log) -> None:
        """Keep ``timeline`` if it beats the best so far (before saying so: an interrupt then keeps it)."""
        value = timeline.objective(self.objective)
        if value < self.value:
            self.timeline = timeline
        if self.overlap and not pair_count(timeline.schedule) and (
                self.unpaired is None or value < self.unpaired.objective(self.objective)):
            self.unpaired = timeline
        log.append(f"{name}: objective {value:.6g}")

    def proven(self, bound: float, exact: bool) -> None:
        """Add a proven lower bound on schedules without pairs (ignored where pairs may overlap)."""
        if not self.overlap and bound > self.bound:
            self.bound, self.exact = bound, exact

    def optimal(self) -> bool:
        """Whether the bound proves the best schedule optimal."""
        return self.timeline is not None and self.exact and self.value - self.bound <= slack(self.value)



def first_schedule(spec: Spec, log: Log) -> tuple[str, Schedule, list[str]]:
    """The first schedule of a solve: the first of the placement's ``FIRST`` families that fits the memory limit,
    else ``ONE_AT_A_TIME``; its name, and the families tried that did not fit (each logged)."""
    families = PLACEMENT_FAMILIES.get(spec.placement_name, ()) if spec.chunks in (1, CHUNKS) else ()
    failed: list[str] = []
    for name in (name for name in FIRST.get(spec.placement_name, ()) if name in families):
        schedule = _family(spec, name)
        if isinstance(schedule, Schedule):
            return name, schedule, failed
        log.append(f"{name}: {schedule}")
        failed.append(name)
    return ONE_AT_A_TIME, _one_at_a_time(spec), failed


def first(spec: Spec, budget: Budget, log: Log, best: Best) -> list[str]:
    """Offer the first schedule (``first_schedule``), whatever the time left: its simulation's time is the budget's
    unit; the devices' work bounds the objective. Returns the families tried for it, the one built last."""
    name, schedule, failed = first_schedule(spec, log)
    began = time.monotonic()
    timeline = simulate(schedule)
    budget.unit = time.monotonic() - began
    best.offer(name, timeline, log)
    best.proven(max(timeline.work), True)
    if best.overlap:
        best.bound, best.exact = least_work(timeline.schedule), True
    return failed + [name]


def measure(budget: Budget, log: Log, best: Best, document: bool = True) -> None:
    """Where the solve's result becomes a ``document``, make the first schedule's step times (kept for the result)
    and its document's text, and keep the time they took before the deadline: a later schedule has as many passes,
    and as many ops or fewer. A result that is not one needs neither."""
    built, timeline = time.monotonic() - budget.started, best.timeline
    assert timeline is not None, "the first schedule was offered before"
    if not document:
        log.append(f"first schedule: {timeline.schedule.name}, built in {built:.2f}s")
        return
    times, *seconds = after_search(timeline)
    best.measured = timeline, times
    budget.keep(sum(seconds))
    log.append(f"first schedule: {timeline.schedule.name}, built in {built:.2f}s; {budget.kept:.2f}s kept for the "
               "step times and the document (as long as its own took)")


def placement_families(spec: Spec, overlap: bool = False) -> list[str]:
    """The families a solve of ``spec`` builds: the placement's (``PLACEMENT_FAMILIES``, with two chunks for the
    multi-chunk ones), and those whose F&B pairs it tries too where pairs may run (``overlap``)."""
    if spec.chunks not in (1, CHUNKS):
        return []
    paired = OVERLAP_FAMILIES.get(spec.placement_name, ()) if overlap and spec.chunks == CHUNKS else ()
    return list(PLACEMENT_FAMILIES.get(spec.placement_name, ())) + list(paired)


def floor(spec: Spec, log: Log, best: Best, tried: list[str]) -> None:
    """Offer every family the solve builds (``placement_families``) that fits the memory limit, but those ``tried``
    for the first schedule, whatever the time left (each builds in a few simulations' time): no solve returns a
    schedule worse than a family it can build. Logs the seconds they took (the least a solve takes is the first
    schedule's and theirs)."""
    began = time.monotonic()
    for family in placement_families(spec, best.overlap):
        if best.optimal():
            break
        if family in tried:
            continue
        schedule = _family(spec, family)
        if isinstance(schedule, Schedule):
            best.offer(family, simulate(schedule), log)
        else:
            log.append(f"{family}: {schedule}")
    log.append(f"families: built in {time.monotonic() - began:.2f}s")


def after_search(timeline: Timeline, clock: Callable[[], float] = time.monotonic) -> tuple[StepTimes, float, float]:
    """``timeline``'s step times, and the seconds (by ``clock``) that they and its document's text took to make."""
    began = clock()
    times = step_times(timeline)
    middle = clock()
    document_text(to_document(timeline))
    return times, middle - began, clock() - middle


SAMPLE = 4
"""``check_time`` times a problem of 1 / ``SAMPLE`` of the devices and of the microbatches."""


def check_time(spec: Spec, time_limit: float, began: float) -> None:
    """Refuse, before the solve builds anything, a time limit shorter than what its first schedule and its families
    (``floor``) need here, with a margin of max(2 s, 5%): built and simulated, the first's step times and its
    document made to measure them, and its document written. Each takes time in proportion to the passes, so all
    are timed on the placement's families over 1 / ``SAMPLE`` of the devices and of the microbatches, unit costs
    and no memory limit, in this process's CPU time (what other processes take from it now is not counted), and
    scaled (problems of fewer than ``SAMPLE`` devices or microbatches are not timed)."""
    p, m = spec.num_devices, spec.num_microbatches
    if min(p, m) < SAMPLE:
        return
    sample = make_spec(UNIT, None, num_microbatches=m // SAMPLE, num_devices=p // SAMPLE,
                       placement=spec.placement_name, chunks=spec.chunks)
    now = time.process_time()
    *_, document = after_search(simulate(first_schedule(sample, Log(None))[1]), time.process_time)
    for family in placement_families(sample)[1:]:
        simulate(make_schedule(family, sample.profile, sample.num_devices, sample.num_microbatches))
    took = time.process_time() - now + document
    least = time.monotonic() - began + took * p * m / (sample.num_devices * sample.num_microbatches)
    if least > time_limit + max(2.0, 0.05 * time_limit):
        raise InputError(f"time_limit = {time_limit:g} is too short for {p} devices and {m} microbatches here: the "
                         f"first schedule, the families, its step times and its document take about {least:.0f}s on "
                         "this machine "
                         f"(timed on {sample.num_devices} devices and {sample.num_microbatches} microbatches); give a "
                         f"time limit of at least {math.ceil(min(least - 2.0, least / 1.05))}s, or fewer "
                         "microbatches")


def _family(spec: Spec, name: str) -> Schedule | str:
    """Family ``name``'s schedule under the memory limit if it fits, else why not."""
    try:
        schedule = make_schedule(name, spec.profile, spec.num_devices, spec.num_microbatches)
    except ZbsolveError as exc:
        return str(exc)
    return with_limit(schedule, spec.mem_limit) if fits(schedule, spec.limits) else "over the memory limit"


def _one_at_a_time(spec: Spec) -> Schedule:
    """The heuristic's fallback order as a schedule of its own."""
    devices = one_at_a_time(spec.placement, spec.num_microbatches, spec.profile)
    return build(ONE_AT_A_TIME, spec.placement, spec.num_microbatches, spec.profile, devices, spec.mem_limit)


def warm_start(spec: Spec, budget: Budget, keep: float, log: Log, best: Best, workers: int = 1,
               pattern: bool = True) -> None:
    """Offer the heuristic's, the V-shape greedy's (two-chunk V-shape) and the periodic pattern's (where ``pattern``,
    in ``PERIODIC_SHARE`` of the time left, no longer than the two before it took or ``PERIODIC_SECONDS``, on
    ``workers`` threads) schedules that fit the memory limit, each started only if it can end ``keep`` seconds
    before the deadline, until one meets the bound (the families come before, ``floor``)."""
    p, m = spec.num_devices, spec.num_microbatches
    after = keep + 2 * budget.cost("simulate")  # the generator validates its schedule by simulating it, then solve
    began = time.monotonic()
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
    build = budget.cost("family") + budget.cost("simulate")  # the pattern's schedule, built and simulated
    if pattern and not best.optimal() and budget.allows("family", log, after + budget.cost("simulate"), "periodic"):
        warm = best.warm
        seconds = min(PERIODIC_SHARE * (budget.left() - after - build), max(PERIODIC_SECONDS, time.monotonic() - began))
        found = periodic(spec, time.monotonic() + seconds, workers, warm)
        if found is None:
            log.append("periodic: no pattern found in its time")
        else:
            log.append(f"periodic: period {found.to_time(found.period):.6g}, one microbatch's span "
                       f"{found.to_time(found.span):.6g}")
            best.offer("periodic", simulate(found.schedule(spec)), log)
