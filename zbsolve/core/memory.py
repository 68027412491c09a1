"""The memory rule, stated once: a device's activation memory is the running sum of its passes' memory deltas in
its order (an F's counted from its start, a B's or W's from its end), and stays within the device's limit; while a
B runs, a stage that recomputes its forward also holds that forward's activations (``Profile.mem_r``) on top; a BW
(B and W fused) holds ``Profile.held_in``'s figure for it, which may be less than B alone holds (``fuses``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from zbsolve.base.checks import exceeds
from zbsolve.core.profile import Profile
from zbsolve.core.schedule import BW, KINDS, B, Op, Pass, Schedule, passes_of


def levels(schedule: Schedule, device: int) -> Iterator[tuple[int, Op, Pass, float, bool]]:
    """Per pass of ``device``'s order: its op's position, the op, the pass, the activation memory, and whether that
    memory is held inside the pass (from its start: a recomputing B's peak) rather than after it."""
    profile = schedule.profile
    delta = {kind: [schedule.memory_delta(Pass(kind, 0, s)) for s in range(schedule.num_stages)] for kind in KINDS}
    inside = {kind: [profile.held_in(kind, s) for s in range(schedule.num_stages)] for kind in KINDS}
    level = 0.0
    for i, op in enumerate(schedule.devices[device]):
        for p in (op,) if op.__class__ is Pass else passes_of(op):
            held = inside[p[0]][p[2]]
            if held:
                yield i, op, p, level + held, True
            level += delta[p[0]][p[2]]
            yield i, op, p, level, False


def fits(schedule: Schedule, limits: Sequence[float]) -> bool:
    """Whether every device's running memory stays within its limit (known from the orders, without timing)."""
    return not any(exceeds(level, limit) for d, limit in enumerate(limits) for *_, level, _ in levels(schedule, d))


def need(delta: float, held: float) -> float:
    """What a pass needs above the memory before it: its ``delta``, or what it ``held`` while it runs where that is
    more (a recomputing B)."""
    return max(delta, held)


def peak(schedule: Schedule, device: int) -> float:
    """``device``'s peak activation memory by ``levels`` (0 at least: it starts with none)."""
    return max(0.0, max((level for *_, level, _ in levels(schedule, device)), default=0.0))


def backward_need(profile: Profile, kind: str, stage: int) -> float:
    """What ``stage``'s backward run as ``kind`` (B, or BW: B and W fused) needs above the level before it
    (``need``)."""
    return need(profile.delta(kind, stage), profile.held_in(kind, stage))


def fuses(profile: Profile, stage: int) -> bool:
    """Whether ``stage``'s backward needs less memory as one BW than as B then W: a fused backward frees each
    block's recomputed forward and what its W reads block by block (``Profile.mem_rw``), where B alone keeps what
    every W reads."""
    return backward_need(profile, BW, stage) < backward_need(profile, B, stage)


def least_held(profile: Profile, stage: int) -> float:
    """The least ``stage``'s backward holds while it runs above the level before it, as B or as one BW
    (``Profile.held_in``)."""
    return min(profile.held_in(B, stage), profile.held_in(BW, stage))
