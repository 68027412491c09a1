"""One microbatch at a time on every device: the order of least memory, valid whenever any schedule is, and so
the smallest memory limit under which a schedule exists."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from zbsolve.base.checks import room
from zbsolve.base.errors import InfeasibleError, InputError
from zbsolve.core.memory import fuses, peak
from zbsolve.core.placement import Placement
from zbsolve.core.profile import Profile
from zbsolve.core.schedule import BW, B, F, Pass, W, build


def one_at_a_time(placement: Placement, num_microbatches: int, profile: Profile | None = None) -> list[list[Pass]]:
    """Per device, one microbatch at a time: the F of its stages, then their B and W in reverse, each W right
    after its B, or one BW where that needs less memory on ``profile`` (``core.memory.fuses``): the least memory,
    valid whenever any schedule is."""
    fused = {s for s in range(placement.num_stages) if profile is not None and fuses(profile, s)}
    devices: list[list[Pass]] = [[] for _ in range(placement.num_devices)]
    for mb in range(num_microbatches):
        for d in range(placement.num_devices):
            stages = [s for _, s in placement.stages_of(d)]
            devices[d] += [Pass(F, mb, s) for s in stages]
            for s in reversed(stages):
                devices[d] += [Pass(BW, mb, s)] if s in fused else [Pass(B, mb, s), Pass(W, mb, s)]
    return devices


def min_feasible_limits(profile: Profile, placement: Placement) -> list[float]:
    """Per device, the smallest memory limit under which a schedule exists: the peak of running one microbatch
    alone (``one_at_a_time``, each backward fused where that needs less; exact when F allocates and B and W
    free)."""
    check_one_route(placement)
    profile = profile.expand(placement.num_stages)
    alone = build("one microbatch", placement, 1, profile, one_at_a_time(placement, 1, profile))
    return [peak(alone, d) for d in range(placement.num_devices)]


def check_feasible(profile: Profile, placement: Placement, limits: Sequence[float],
                   shortfall: Callable[[int, float], str] | None = None) -> None:
    """Raise InfeasibleError, its ``min_feasible`` the smallest uniform limit that works, where a device's limit is
    below what one microbatch needs there: in ``shortfall(device, need)``'s words when given."""
    need = min_feasible_limits(profile, placement)
    for d, (limit, n) in enumerate(zip(limits, need)):
        if n > room(limit):
            raise InfeasibleError(shortfall(d, n) if shortfall else
                                  f"mem_limit {limit:g} on device {d} is below {n:g}, the memory one microbatch "
                                  f"needs there; the smallest feasible limit is {max(need):g}", min_feasible=max(need))


def check_one_route(placement: Placement) -> None:
    """The heuristic and the orders here take one route (sequential, interleaved or V-shape placements)."""
    if len(placement.routes) != 1:
        raise InputError(f"placement with {len(placement.routes)} routes (bidirectional) is not supported "
                         "by the heuristic; use sequential, interleaved or vshape")
