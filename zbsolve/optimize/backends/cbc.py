"""CBC backend (through PuLP): the reference MILP. Start times are continuous; one binary orders
each pair of passes on a device whose order neither the dependencies, the microbatch order of
same-kind passes, nor the time windows fix; memory at each F start sums the deltas of the passes
ordered before it. Building the model draws on the time limit too: a model not built in time is not solved."""

from __future__ import annotations

import itertools
import math
import time
import warnings
from collections.abc import Callable

import pulp

from zbsolve.core.schedule import F
from zbsolve.optimize.backends.protocol import BackendResult
from zbsolve.optimize.formulation import Formulation


def _ancestors(form: Formulation, deadline: float) -> list[int] | None:
    """Per pass, a bitset of the passes that must precede it (edges and chains, transitively); None when the clock
    passes ``deadline`` first."""
    anc = [0] * len(form.passes)
    for i, ps in enumerate(form.predecessors()):
        if i % 1024 == 0 and time.monotonic() > deadline:
            return None
        for a, _ in ps:
            anc[i] |= anc[a] | (1 << a)
    return anc


def solve_cbc(form: Formulation, incumbent: list[list[int]], *, time_limit: float, workers: int, seed: int = 0,
              lower: int, report: Callable[[str], None] | None = None) -> BackendResult:
    """Solve the MILP warm-started from ``incumbent`` (per-device pass orders); ``lower`` bounds the objective.
    The log line goes to ``report`` when CBC returns; ``seed`` is unused (CBC runs with its own)."""
    result = _solve_milp(form, incumbent, time.monotonic() + time_limit, workers, lower)
    if report is not None:
        report(result.log)
    return result


def _solve_milp(form: Formulation, incumbent: list[list[int]], deadline: float, workers: int,
                lower: int) -> BackendResult:
    """Build the MILP and solve it with CBC by ``deadline`` (a ``time.monotonic()`` instant)."""
    start0 = form.asap(incumbent)
    upper = form.value(start0)
    es, ls, dur = form.earliest, form.latest(upper), form.duration
    position = {i: k for seq in incumbent for k, i in enumerate(seq)}
    prob = pulp.LpProblem("zbsolve", pulp.LpMinimize)
    s = [prob.add_variable(f"s{i}", es[i], max(es[i], ls[i])) for i in range(len(form.passes))]
    z = prob.add_variable("z", lower, upper)
    prob += z
    for a, b, lag in form.edges:
        prob += s[b] >= s[a] + dur[a] + lag
    for chain in form.chains:
        for a, b in itertools.pairwise(chain):
            prob += s[b] >= s[a] + dur[a]
    for d, lasts in enumerate(form.last):
        for last in lasts:
            prob += z >= s[last] + dur[last] - form.offset[d]
    late = BackendResult(None, False, None, "cbc: the model could not be built within the time limit")
    anc = _ancestors(form, deadline)
    if anc is None:
        return late
    before: dict[tuple[int, int], pulp.LpVariable | int] = {}
    for d, passes in enumerate(form.device_passes()):
        for x, a in enumerate(passes):
            if time.monotonic() > deadline:
                return late
            for b in passes[x + 1:]:
                if anc[b] >> a & 1 or ls[a] + dur[a] <= es[b]:
                    before[a, b], before[b, a] = 1, 0
                elif anc[a] >> b & 1 or ls[b] + dur[b] <= es[a]:
                    before[a, b], before[b, a] = 0, 1
                else:
                    o = prob.add_variable(f"o{a}_{b}", 0, 1, cat="Binary")
                    o.setInitialValue(int(position[a] < position[b]))
                    prob += s[b] >= s[a] + dur[a] - (ls[a] + dur[a] - es[b]) * (1 - o)
                    prob += s[a] >= s[b] + dur[b] - (ls[b] + dur[b] - es[a]) * o
                    before[a, b], before[b, a] = o, 1 - o
        if form.limit[d] is not None:
            for f in passes:
                if form.passes[f].kind == F:
                    prob += form.mem_delta[f] + pulp.lpSum(form.mem_delta[x] * before[x, f]
                                                           for x in passes if x != f) <= form.limit[d]
    for i, v in enumerate(s):
        v.setInitialValue(start0[i])
    z.setInitialValue(upper)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            solver = pulp.PULP_CBC_CMD(msg=False, timeLimit=max(1, math.floor(deadline - time.monotonic())),
                                       warmStart=True, threads=workers)
            prob.solve(solver)
    except pulp.PulpSolverError as exc:
        return BackendResult(None, False, None, f"cbc failed: {exc}")
    log = f"cbc: {pulp.LpStatus[prob.status]}, solution {pulp.constants.LpSolution[prob.sol_status]}"
    if prob.sol_status not in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        return BackendResult(None, False, None, log)
    starts = [round(v.value()) for v in s]
    optimal = prob.sol_status == pulp.LpSolutionOptimal
    return BackendResult(form.order_from_starts(starts), optimal, round(z.value()) if optimal else None, log)
