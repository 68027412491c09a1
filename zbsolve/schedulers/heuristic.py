"""The Zero Bubble paper's automatic heuristic scheduler (Section 3.1).

Each device runs a greedy list schedule driven by a small event simulation of its own. A stage
runs an F while it has fewer microbatches in flight than its warm-up count and memory allows
(warm-up, then 1F1B: the F of the next round before the B that has arrived); otherwise a B as
soon as one arrives; a W fills an idle gap when it fits before the next arrival, runs early
when memory requires it, and the leftover W run at the end. The warm-up count of a stage is
the number of F that fit before its first B arrives and in memory, each stage keeping at least
one more than the next. The paper's variants (allow a bubble before the first B, prioritise B,
fill gaps greedily) are tried and the best schedule kept, until an optional deadline.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import product
from typing import NamedTuple

from zbsolve.base.checks import check_count, check_limit, check_size, device_limits, room
from zbsolve.base.errors import BudgetError
from zbsolve.core.objective import device_share, step
from zbsolve.core.placement import Placement
from zbsolve.core.profile import Profile
from zbsolve.core.schedule import B, F, Kind, Pass, Schedule, W, build
from zbsolve.core.simulator import simulate
from zbsolve.schedulers.heuristic_problem import EPS, INF, HeuristicProblem, warmup_counts
from zbsolve.schedulers.one_at_a_time import check_feasible, check_one_route, one_at_a_time

_CLOCK_EVERY = 4096
"""Events between two looks at the clock when a run has a deadline."""


class Variant(NamedTuple):
    """One setting of the heuristic's choices."""

    bubble_before_first_b: bool
    """Warm-up F must end by the time the first B arrives, leaving a bubble before it (else an F may start)."""
    prioritize_b: bool
    """Hold an F that would delay a B (arrived, or arriving before the F would end) when the stage
    is at least two F ahead of the next stage."""
    greedy_fill: bool
    """A W that overruns an idle gap always runs (else only when leaving the gap would make the
    device's total bubble the largest)."""


VARIANTS = tuple(Variant(a, b, c) for a in (True, False) for b in (True, False) for c in (True, False))
"""Every variant ``heuristic`` tries."""


@dataclass
class _Look:
    """What a device's decision reads of its next passes' arrivals."""

    known: float = INF
    """The earliest future arrival of a committed dependency."""
    unknown: float = INF
    """The earliest lower bound of a dependency not yet committed on another device (which tells this device when
    it commits it)."""
    ready_b: tuple[int, int, float] | None = None
    """(stage, microbatch, arrival) of the B to run: arrived, the lowest microbatch."""
    b_arrivals: list[float] = field(default_factory=list)
    """When each stage's next B arrives, where known."""
    need_w: bool = False
    """Whether memory needs a W to run first."""
    blocked_at: float = INF
    """The earliest arrival of an F that memory holds back."""


class _Run:
    """One event-driven greedy run; ``ops`` per device once ``run`` succeeds."""

    def __init__(self, prob: HeuristicProblem, caps: list[int], variant: Variant) -> None:
        self.prob, self.caps, self.v = prob, caps, variant
        S, m, p = prob.S, prob.m, prob.p
        self.f, self.b = [0] * S, [0] * S
        self.end_f: list[list[float]] = [[-1.0] * m for _ in range(S)]
        self.end_b: list[list[float]] = [[-1.0] * m for _ in range(S)]
        self.ends = {F: self.end_f, B: self.end_b}
        """End of each placed F and B by kind, stage and microbatch (-1: not placed)."""
        self.first_start = [-1.0] * p
        self.free = [0.0] * p
        self.mem = [0.0] * p
        self.peak = 0.0
        self.bubble = [0.0] * p
        self.max_bubble = 0.0
        self.mattered: set[str] = set()
        """Variant flags that changed a decision; flipping any other flag gives the same run."""
        self.waits: list[deque[tuple[int, int]]] = [deque() for _ in range(p)]
        self.ops: list[list[Pass]] = [[] for _ in range(p)]
        self.events: list[tuple[float, int]] = [(0.0, d) for d in range(p) if prob.stages[d]]
        heapq.heapify(self.events)

    def run(self, deadline: float | None = None) -> bool:
        """Schedule every pass; False if the greedy got stuck (memory); ``BudgetError`` once past ``deadline``
        (a ``time.monotonic()`` instant)."""
        events, free, decide = self.events, self.free, self._decide
        countdown = _CLOCK_EVERY
        while events:
            now, d = heapq.heappop(events)
            if free[d] <= now + EPS:
                decide(d, now)
            countdown -= 1
            if not countdown:
                countdown = _CLOCK_EVERY
                if deadline is not None and time.monotonic() > deadline:
                    raise BudgetError("the heuristic's deadline passed")
        return sum(map(len, self.ops)) == 3 * self.prob.S * self.prob.m

    def objective(self) -> tuple[float, float, float]:
        """(max per-device span, makespan, peak memory) of this run."""
        busy, tails = [d for d in range(self.prob.p) if self.ops[d]], self.prob.tails
        return (step(device_share(self.first_start[d], self.free[d], "span", tails[d]) for d in busy),
                step(device_share(self.first_start[d], self.free[d], "makespan", tails[d]) for d in busy), self.peak)

    def _reserved(self, d: int) -> float:
        """Memory the microbatches in flight on device ``d`` may still need on top of what they hold."""
        f, b = self.f, self.b
        total = 0.0
        for phase, s, other, need in self.prob.reserve[d]:
            if phase == 0:
                total += (f[s] - (f[other] if other >= 0 else b[s])) * need
            else:
                total += (b[s] - (b[other] if other >= 0 else 0)) * need
        return total

    def _f_fits(self, d: int, s: int) -> bool:
        """Whether the next F of stage ``s`` fits in memory, keeping room for the microbatches in
        flight to finish (the first stage of a device starts a new microbatch there)."""
        prob = self.prob
        need = prob.f_need[s]
        if s == prob.first[d] and prob.reserve[d]:
            need = max(need, prob.mem_f[s] + prob.after_first[d] + self._reserved(d))
        return self.mem[d] + need <= prob.limit[d]

    def _decide(self, d: int, now: float) -> None:
        """Commit device ``d``'s next pass at time ``now``, or wait for the next arrival: an F where one may start
        (``_start_f``), else the first B arrived where it fits, else a W (``_fill_w``)."""
        look = self._look_b(d, now)
        if self._start_f(d, now, look):
            return
        if look.ready_b is not None:
            s, mb, arr = look.ready_b
            if self.mem[d] + self.prob.need_b[s] <= self.prob.limit[d]:
                self._commit_b(d, s, mb, max(self.free[d], arr), now)
                return
            look.need_w = True
        if self.waits[d] and self._fill_w(d, now, look):
            return
        wake = min(look.blocked_at, look.known)
        if wake < INF:
            heapq.heappush(self.events, (wake, d))

    def _look_b(self, d: int, now: float) -> _Look:
        """The arrivals of device ``d``'s next B per stage: the first arrived (lowest microbatch) and the others."""
        prob, f, b = self.prob, self.f, self.b
        look = _Look()
        ready = now + EPS
        for s in prob.stages[d]:
            mb = b[s]
            if mb < f[s]:
                arr, lb = self._arrival(B, s, mb, d, now)
                if arr is None:
                    look.unknown = min(look.unknown, lb)
                    continue
                look.b_arrivals.append(arr)
                if arr <= ready:
                    if look.ready_b is None or mb < look.ready_b[1]:
                        look.ready_b = (s, mb, arr)
                elif arr < look.known:
                    look.known = arr
        return look

    def _start_f(self, d: int, now: float, look: _Look) -> bool:
        """Commit the next F of device ``d``'s highest stage whose input has arrived, that its warm-up count and
        memory allow and that no B is held for (``_hold_f``); whether one was. Notes in ``look`` the F arriving
        later and those memory blocks."""
        prob, f, b = self.prob, self.f, self.b
        ready, t0 = now + EPS, self.free[d]
        m, caps = prob.m, self.caps
        for s in prob.stages_back[d]:
            mb = f[s]
            if mb >= m or mb - b[s] >= caps[s]:
                continue
            arr, lb = self._arrival(F, s, mb, d, now)
            if arr is None:
                look.unknown = min(look.unknown, lb)
                continue
            if not self._f_fits(d, s):
                if arr <= ready:
                    look.need_w = True
                elif arr < look.blocked_at:
                    look.blocked_at = arr
            elif arr > ready:
                look.known = min(look.known, arr)
            else:
                begin = max(t0, arr)
                if not (look.b_arrivals and self._hold_f(s, begin + prob.t_f[s], look.b_arrivals)):
                    self._commit_f(d, s, mb, begin, now)
                    return True
        return False

    def _fill_w(self, d: int, now: float, look: _Look) -> bool:
        """Commit device ``d``'s oldest pending W where memory needs it, it fits before the next arrival, or an idle
        gap it overruns is to be filled (``greedy_fill``, or leaving it would make the device's bubble the largest);
        whether it was."""
        t0 = self.free[d]
        if look.need_w or t0 + self.prob.t_w[self.waits[d][0][0]] <= min(look.known, look.unknown) + EPS:
            self._commit_w(d, now)
            return True
        if look.unknown >= look.known and look.known < INF:
            if look.known - t0 > self.max_bubble - self.bubble[d] + EPS:
                self._commit_w(d, now)
                return True
            self.mattered.add("greedy_fill")
            if self.v.greedy_fill:
                self._commit_w(d, now)
                return True
        return False

    def _arrival(self, kind: Kind, s: int, mb: int, d: int, now: float) -> tuple[float | None, float]:
        """When the inputs of pass (``kind``, ``mb``, ``s``) on device ``d`` arrive, and that time again; while
        a producer is not placed, None and the earliest it could arrive (infinity when the producer is on ``d``
        itself)."""
        arrival = 0.0
        for dep_kind, dep_stage, producer, gap, duration in self.prob.deps[kind][s]:
            end = self.ends[dep_kind][dep_stage][mb]
            if end < 0:
                if producer == d:
                    return None, INF
                return None, max(self.free[producer], now) + duration + gap
            arrival = max(arrival, end + gap)
        return arrival, arrival

    def _hold_f(self, s: int, f_end: float, b_arrivals: list[float]) -> bool:
        """Whether an F ending at ``f_end`` waits for a B that arrives before then (prioritize_b)."""
        if (not self.v.prioritize_b and "prioritize_b" in self.mattered) or s + 1 >= self.prob.S \
                or self.f[s] < self.f[s + 1] + 2 or min(b_arrivals) >= f_end - EPS:
            return False
        self.mattered.add("prioritize_b")
        return self.v.prioritize_b

    def _commit_f(self, d: int, s: int, mb: int, begin: float, now: float) -> None:
        prob = self.prob
        end = self._place(d, Pass(F, mb, s), begin, prob.t_f[s], prob.mem_f[s], now)
        self.f[s] += 1
        self.end_f[s][mb] = end
        if s + 1 < prob.S:
            self._notify(prob.dev[s + 1], d, now)

    def _commit_b(self, d: int, s: int, mb: int, begin: float, now: float) -> None:
        prob = self.prob
        self.peak = max(self.peak, self.mem[d] + prob.need_b[s])
        end = self._place(d, Pass(B, mb, s), begin, prob.t_b[s], prob.mem_b[s], now)
        self.b[s] += 1
        self.end_b[s][mb] = end
        self.waits[d].append((s, mb))
        if s > 0:
            self._notify(prob.dev[s - 1], d, now)

    def _commit_w(self, d: int, now: float) -> None:
        s, mb = self.waits[d].popleft()
        self._place(d, Pass(W, mb, s), self.free[d], self.prob.t_w[s], self.prob.mem_w[s], now)

    def _notify(self, consumer: int, d: int, now: float) -> None:
        """Wake an idle ``consumer``: the arrival it waits for is now known."""
        if consumer != d and self.free[consumer] <= now + EPS:
            heapq.heappush(self.events, (now, consumer))

    def _place(self, d: int, op: Pass, begin: float, duration: float, delta: float, now: float) -> float:
        """Append ``op`` to device ``d`` at ``begin``; return its end."""
        ops = self.ops[d]
        if not ops:
            self.first_start[d] = begin
        elif begin > self.free[d]:
            self.bubble[d] += begin - self.free[d]
            self.max_bubble = max(self.max_bubble, self.bubble[d])
        ops.append(op)
        end = begin + duration
        self.free[d] = end
        mem = self.mem[d] = self.mem[d] + delta
        self.peak = max(self.peak, mem)
        heapq.heappush(self.events, (max(now, end), d))
        return end


def _same_run(ran: Variant, mattered: set[str], variant: Variant) -> bool:
    """Whether ``variant`` repeats, decision for decision, a run of ``ran`` (same warm-up counts)
    in which only the flags in ``mattered`` changed a decision."""
    return all(getattr(ran, flag) == getattr(variant, flag) or flag not in mattered
               for flag in ("prioritize_b", "greedy_fill"))


def heuristic(profile: Profile, placement: Placement, num_microbatches: int,
              mem_limit: float | Sequence[float] | None = None, *, deadline: float | None = None) -> Schedule:
    """The best schedule the paper's heuristic finds over ``VARIANTS``: smallest max per-device
    span, ties by makespan, then by peak memory; validated by the simulator. ``mem_limit`` is one
    number, one per device, or None for unlimited. Raises InfeasibleError, with ``min_feasible``
    the smallest uniform limit that works, when a device's limit is below what one microbatch
    needs there (``one_at_a_time.min_feasible_limits``). Past ``deadline`` (a ``time.monotonic()`` instant) no
    further variant is tried and the best so far is kept; ``BudgetError`` if no variant finished by then."""
    check_one_route(placement)
    m = check_count("num_microbatches", num_microbatches)
    check_size(placement.num_stages, m)
    profile = profile.expand(placement.num_stages)
    limits = device_limits(mem_limit, placement.num_devices)
    check_feasible(profile, placement, limits)
    prob = HeuristicProblem(placement, m, profile, [room(lim) for lim in limits])
    best: _Run | None = None
    done: list[tuple[list[int], Variant, set[str]]] = []
    for monotone, variant in product((True,) if prob.S == prob.p else (True, False), VARIANTS):
        caps = warmup_counts(prob, variant.bubble_before_first_b, monotone)
        if any(c == caps and _same_run(v, mattered, variant) for c, v, mattered in done):
            continue
        try:
            if deadline is not None and time.monotonic() > deadline:
                raise BudgetError("the heuristic's deadline passed")
            run = _Run(prob, caps, variant)
            finished = run.run(deadline)
        except BudgetError:
            if done:
                break
            raise BudgetError("the heuristic's deadline passed before its first variant finished") from None
        if finished and (best is None or run.objective() < best.objective()):
            best = run
        done.append((caps, variant, run.mattered))
    devices = best.ops if best is not None else one_at_a_time(placement, m, profile)
    schedule = build("heuristic", placement, m, profile, devices, check_limit(mem_limit))
    simulate(schedule)
    return schedule
