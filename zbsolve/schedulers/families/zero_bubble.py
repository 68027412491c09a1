"""The paper's handcrafted zero-bubble schedules ZB-H1 and ZB-H2 (backward split into B and W).

With the unit profile (T_F = T_B = T_W = 1, no communication) and m microbatches:

- zb-h1: bubble (p-1)(T_F+T_B-T_W) and peak p M_B for m >= p (for m < p: bubble 2p-1-m, peak m M_B).
- zb-h2: bubble (p-1)(T_F+T_B-2T_W) = 0 and peak (2p-1) M_B for m >= 2p-1
  (for m < 2p-1: bubble 2p-1-m, peak m M_B).
"""

from __future__ import annotations

from zbsolve.core.dependencies import dependencies
from zbsolve.core.placement import sequential
from zbsolve.core.profile import Profile
from zbsolve.core.schedule import B, F, Kind, Pass, Schedule, W, build
from zbsolve.schedulers.families.registry import register


@register("zb-h1")
def zb_h1(profile: Profile, num_devices: int, num_microbatches: int) -> Schedule:
    """ZB-H1: stage s warms up with min(p-s, m) F, then repeats B, W, F, keeping s W's pending
    (its W's run s microbatches late), and flushes the remaining W's at the end."""
    p, m = num_devices, num_microbatches
    devices = []
    for s in range(p):
        warm = min(p - s, m)
        ops = [Pass(F, j, s) for j in range(warm)]
        done_w = 0
        for j in range(m):
            ops.append(Pass(B, j, s))
            if j + 1 - done_w > s:
                ops.append(Pass(W, done_w, s))
                done_w += 1
            if warm + j < m:
                ops.append(Pass(F, warm + j, s))
        ops += [Pass(W, j, s) for j in range(done_w, m)]
        devices.append(ops)
    return build("zb-h1", sequential(p), m, profile, devices)


@register("zb-h2")
def zb_h2(profile: Profile, num_devices: int, num_microbatches: int) -> Schedule:
    """ZB-H2: at most 2p-1 microbatches in flight per stage (F done, W not yet), W's moved to the tail.

    As in the paper the order is handcrafted for unit times and does not depend on the profile: it is
    the greedy schedule of unit-time passes in which each free stage runs the next B whose input has
    arrived, else the next F if fewer than 2p-1 microbatches are in flight, else its oldest pending W.
    """
    p, m = num_devices, num_microbatches
    return build("zb-h2", sequential(p), m, profile, _unit_greedy(p, m, 2 * p - 1))


def _unit_greedy(p: int, m: int, in_flight: int) -> list[list[Pass]]:
    """Per-stage orders of the unit-time greedy schedule with priority B > F (at most ``in_flight``
    microbatches between F and W) > W; stages decide in index order at each time step."""
    kinds = (B, F, W)
    # deps[kind][s]: the (kind, stage) of the same microbatch's passes that a pass waits for
    deps = {kind: [tuple((dep.kind, dep.stage) for dep in dependencies(Pass(kind, 0, s), p)) for s in range(p)]
            for kind in kinds}
    # end[kind][s][j]: end of stage s's j-th pass of ``kind``, which is microbatch j's
    end: dict[Kind, list[list[int]]] = {kind: [[] for _ in range(p)] for kind in kinds}
    orders: list[list[Pass]] = [[] for _ in range(p)]

    def ready(kind: Kind, s: int, now: int) -> bool:
        """Whether stage s's next ``kind`` pass may start at time ``now``."""
        j = len(end[kind][s])
        if kind == F and (j == m or j - len(end[W][s]) >= in_flight):
            return False
        return all(j < len(ends := end[k][t]) and ends[j] <= now for k, t in deps[kind][s])

    now, left = 0, 3 * p * m
    while left:
        for s in range(p):
            kind = next((k for k in kinds if ready(k, s, now)), None)
            if kind is not None:
                ends = end[kind][s]
                orders[s].append(Pass(kind, len(ends), s))
                ends.append(now + 1)
                left -= 1
        now += 1
    return orders
