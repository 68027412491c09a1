"""What the Zero Bubble heuristic (``schedulers.heuristic``) reads of a problem: per-stage costs, the lags before
each F and B, the memory one microbatch still needs per state, and each stage's warm-up count (the F that fit
before its first B arrives and in memory)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from zbsolve.core.dependencies import dependencies, lag
from zbsolve.core.memory import need
from zbsolve.core.placement import Placement
from zbsolve.core.profile import Profile
from zbsolve.core.schedule import B, F, Pass

EPS, INF = 1e-9, math.inf
"""Slack of comparisons of times; no limit."""


@dataclass
class HeuristicProblem:
    """What the heuristic reads of a problem: per-stage costs, the point-to-point lags before each F and B
    (``lag_f``, ``lag_b``), per-device layout."""

    placement: Placement
    m: int
    profile: Profile
    limit: list[float]
    """Per device, the memory it may reach (``room`` of its limit)."""

    def __post_init__(self) -> None:
        pl, pr = self.placement, self.profile
        self.S = pl.num_stages
        self.p, self.tails = pl.num_devices, pr.device_tails(pl)
        self.dev = list(pl.routes[0])
        self.stages = [[s for s in range(self.S) if self.dev[s] == d] for d in range(self.p)]
        self.stages_back = [st[::-1] for st in self.stages]
        self.t_f, self.t_b, self.t_w = ([pr.stage_value(n, s) for s in range(self.S)] for n in ("t_f", "t_b", "t_w"))
        self.mem_f, self.mem_b, self.mem_w = ([pr.stage_value(n, s) for s in range(self.S)]
                                              for n in ("mem_f", "mem_b", "mem_w"))
        self.need_b = [need(self.mem_b[s], pr.held_in(B, s)) for s in range(self.S)]
        """What a B needs above the memory before it: its delta, or what it holds while it recomputes."""
        c = pr.t_comm
        # deps[kind][s]: what pass (kind, mb, s) waits for, as (kind, stage, device, lag, duration) of mb's pass
        self.deps = {kind: [tuple((dep.kind, dep.stage, self.dev[dep.stage], lag(c, self.dev[dep.stage], self.dev[s]),
                                   pr.time(dep.kind, dep.stage)) for dep in dependencies(Pass(kind, 0, s), self.S))
                            for s in range(self.S)] for kind in (F, B)}
        self.lag_f = [lag(c, self.dev[s - 1], self.dev[s]) if s > 0 else 0.0 for s in range(self.S)]
        self.lag_b = [lag(c, self.dev[s + 1], self.dev[s]) if s + 1 < self.S else 0.0 for s in range(self.S)]
        self.first = [st[0] if st else -1 for st in self.stages]
        self.footprint = [0.0] * self.p
        self.after_first = [0.0] * self.p
        self.reserve: list[list[tuple[int, int, int, float]]] = [[] for _ in range(self.p)]
        self.f_need = list(self.mem_f)
        for d, st in enumerate(self.stages):
            if st:
                self._reserve_table(d, st)

    def _reserve_table(self, d: int, st: list[int]) -> None:
        """Memory one microbatch still needs on device ``d``, per state, if run alone (W right after B)."""
        deltas = [(self.mem_f[s], 0.0) for s in st]
        for s in reversed(st):
            deltas += [(self.mem_b[s], self.need_b[s]), (self.mem_w[s], 0.0)]

        def peak_after(i: int) -> float:
            run, top = 0.0, 0.0
            for x, inside in deltas[i:]:
                top = max(top, run + inside)
                run += x
                top = max(top, run)
            return top

        self.footprint[d] = peak_after(0)
        self.after_first[d] = peak_after(1)
        k = len(st)
        states = [(0, s, st[i + 1] if i + 1 < k else -1, peak_after(i + 1)) for i, s in enumerate(st)]
        states += [(1, st[i], st[i - 1] if i > 0 else -1, peak_after(k + 2 * (k - i))) for i in range(k)]
        self.reserve[d] = [state for state in states if state[3] > 0]
        self.f_need[st[0]] = max(self.footprint[d], self.mem_f[st[0]] + self.after_first[d])


def in_flight(limit: float, footprint: float, held: float, m: int) -> int:
    """Microbatches a device holds in flight: k - 1 holding their forwards' memory (``held``; = ``footprint`` where
    B and W only free memory) while one reaches its footprint."""
    if footprint <= 0 or limit == INF or held <= 0 <= limit - footprint:
        return m
    return max(1, int(limit / footprint + EPS) if not 0 < held < footprint else
               1 + int((limit - footprint) / held + EPS))


def warmup_counts(prob: HeuristicProblem, bubble_before_first_b: bool, monotone: bool) -> list[int]:
    """Per stage, how many F run before its first B: those that fit before the B arrives and in
    memory; with ``monotone`` each stage keeps at least one more than the next."""
    S, m, dev, t_f = prob.S, prob.m, prob.dev, prob.t_f
    end_f = [0.0] * S
    for s in range(S):
        end_f[s] = (end_f[s - 1] + prob.lag_f[s] if s else 0.0) + t_f[s]
    counts = [1] * S
    arrival = end_f[S - 1]
    for s in range(S - 1, -1, -1):
        fp, held = prob.footprint[dev[s]], sum(prob.mem_f[x] for x in prob.stages[dev[s]])
        limit = prob.limit[dev[s]]
        by_memory = in_flight(limit, fp, held, m)
        k, busy = 1, end_f[s]
        if s < S - 1:
            while k < min(m, by_memory):
                if (busy + t_f[s] > arrival + EPS) if bubble_before_first_b else (busy >= arrival - EPS):
                    break
                busy += t_f[s]
                k += 1
        counts[s] = k
        arrival = max(busy, arrival) + prob.t_b[s] + (prob.lag_b[s - 1] if s else 0.0)
    if monotone:
        for s in range(1, S):
            counts[s] = max(1, min(counts[s], counts[s - 1] - 1))
    return counts
