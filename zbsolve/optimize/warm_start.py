"""The floor and the warm starts of a solve: the placement's handcrafted families, the one-at-a-time order, the
paper's heuristic and ZB-V's greedy generator, each kept when it beats the best so far."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from zbsolve.base.checks import slack
from zbsolve.base.errors import BudgetError, ZbsolveError
from zbsolve.core.memory import fits
from zbsolve.core.placement import CHUNKS, vshape
from zbsolve.core.schedule import Schedule, build, pair_count
from zbsolve.core.simulator import Timeline, simulate
from zbsolve.core.spec import Spec
from zbsolve.core.transforms import with_limit
from zbsolve.optimize.backends.protocol import Log
from zbsolve.optimize.budget import Budget
from zbsolve.schedulers.families import PLACEMENT_FAMILIES, make_schedule
from zbsolve.schedulers.heuristic import heuristic
from zbsolve.schedulers.one_at_a_time import one_at_a_time
from zbsolve.optimize.pairing import least_work
from zbsolve.schedulers.vgreedy import v_greedy

OVERLAP_FAMILIES = {"vshape": ("dualpipev",)}
"""The families whose F&B pairs a solve tries too where passes communicate (with two chunks)."""
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

    @property
    def value(self) -> float:
        """The objective of the best schedule."""
        return self.timeline.objective(self.objective) if self.timeline is not None else math.inf

    def offer(self, name: str, timeline: Timeline, log: Log) -> None:
        """Keep ``timeline`` if it beats the best so far."""
        log.append(f"{name}: objective {timeline.objective(self.objective):.6g}")
        if timeline.objective(self.objective) < self.value:
            self.timeline = timeline
        if self.overlap and not pair_count(timeline.schedule) and (
                self.unpaired is None
                or timeline.objective(self.objective) < self.unpaired.objective(self.objective)):
            self.unpaired = timeline

    def proven(self, bound: float, exact: bool) -> None:
        """Add a proven lower bound on schedules without pairs (ignored where pairs may overlap)."""
        if not self.overlap and bound > self.bound:
            self.bound, self.exact = bound, exact

    def optimal(self) -> bool:
        """Whether the bound proves the best schedule optimal."""
        return self.timeline is not None and self.exact and self.value - self.bound <= slack(self.value)



def floor(spec: Spec, budget: Budget, log: Log, best: Best) -> list[str]:
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
    if best.overlap:
        best.bound, best.exact = least_work(best.timeline.schedule), True
    log.append(f"floor: built in {time.monotonic() - budget.started:.2f}s; {budget.kept():.2f}s kept for the step "
               "times and the document")
    return names


def _family(spec: Spec, name: str) -> Schedule | str:
    """Family ``name``'s schedule under the memory limit if it fits, else why not."""
    try:
        schedule = make_schedule(name, spec.profile, spec.num_devices, spec.num_microbatches)
    except ZbsolveError as exc:
        return str(exc)
    return with_limit(schedule, spec.mem_limit) if fits(schedule, spec.limits) else "over the memory limit"


def _one_at_a_time(spec: Spec) -> Schedule:
    """The heuristic's fallback order as a schedule of its own."""
    devices = one_at_a_time(spec.placement, spec.num_microbatches)
    return build(ONE_AT_A_TIME, spec.placement, spec.num_microbatches, spec.profile, devices, spec.mem_limit)


def warm_start(spec: Spec, families: list[str], budget: Budget, keep: float, log: Log, best: Best) -> None:
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
    paired = OVERLAP_FAMILIES.get(spec.placement_name, ()) if best.overlap and spec.chunks == CHUNKS else ()
    for name in families + list(paired):
        if best.optimal():
            return
        if not budget.allows("family", log, keep, name):
            continue
        schedule = _family(spec, name)
        if isinstance(schedule, Schedule):
            best.offer(name, simulate(schedule), log)
        else:
            log.append(f"{name}: {schedule}")
