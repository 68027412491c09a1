"""Overlapped F&B pairs chosen by search: which F and B of a schedule run together (``core.overlap`` says what a
pair saves).

Where a device holds two stages (V-shape, interleaved), an F of one stage and a B or BW of another may run as a
pair. ``overlap_pairs`` starts from any schedule and fuses an F and a backward a few positions apart on a device
into a pair wherever the simulator finds the step no longer and the devices' ends no later in all, and splits a pair
wherever that makes them earlier, under the same memory limit (the memory rule is unchanged: the pair's F counts from
its start, its backward from its end). It sweeps the devices until no move helps or the deadline passes, so the
result lies anywhere between never overlapping and overlapping every pair it can.
"""

from __future__ import annotations

import time
from dataclasses import replace

from zbsolve.base.checks import slack
from zbsolve.base.errors import ScheduleError
from zbsolve.core.placement import Placement
from zbsolve.core.profile import Profile
from zbsolve.core.schedule import BACKWARD, F, Op, Pair, Pass, Schedule
from zbsolve.core.simulator import Timeline, simulate


def pairs_possible(profile: Profile, placement: Placement) -> bool:
    """Whether a pair could save time: some pass communicates and some device holds two stages."""
    return profile.communicates() and any(len({s for _, s in placement.stages_of(d)}) > 1
                                          for d in range(placement.num_devices))


def _pair(a: Op, b: Op) -> Pair | None:
    """The pair of ``a`` and ``b`` when they are an F and a backward of different stages, in either order; else None."""
    if a.__class__ is not Pass or b.__class__ is not Pass:
        return None
    f, back = (a, b) if a.kind == F else (b, a)
    if f.kind != F or back.kind not in BACKWARD or f.stage == back.stage:
        return None
    return Pair(f, back)


def _score(timeline: Timeline, objective: str) -> tuple[float, float]:
    """What a fusion must not worsen, then must lower: the objective, and the sum of the devices' shares of it."""
    return timeline.objective(objective), sum(timeline.device_shares(objective))


def _accept(new: tuple[float, float], old: tuple[float, float], strict: bool) -> bool:
    """Whether ``new`` is no worse than ``old`` on both counts, or (``strict``) lower on the second too."""
    room = slack(old[0])
    return new[0] <= old[0] + room and (new[1] < old[1] - room if strict else new[1] <= old[1] + room)


WINDOW = 3
"""How far apart (in positions of a device's order) an F and a backward may sit to be fused."""


def _moves(ops: tuple[Op, ...], i: int) -> list[tuple[tuple[Op, ...], bool]]:
    """The orders with op ``i`` fused with a later op at most ``WINDOW`` away (the pair at either's position), or, for
    a pair, split into its F and backward in either order; each with whether it must improve the score (a split
    must, a fusion need only not worsen it, so no move undoes another)."""
    op = ops[i]
    if op.__class__ is Pair:
        return [(ops[:i] + (op.f, op.b) + ops[i + 1:], True), (ops[:i] + (op.b, op.f) + ops[i + 1:], True)]
    out = []
    for j in range(i + 1, min(len(ops), i + WINDOW + 1)):
        pair = _pair(op, ops[j])
        if pair is not None:
            out.append((ops[:i] + (pair,) + ops[i + 1:j] + ops[j + 1:], False))
            out.append((ops[:i] + ops[i + 1:j] + (pair,) + ops[j + 1:], False))
    return out


def overlap_pairs(timeline: Timeline, objective: str = "makespan", deadline: float | None = None) -> Timeline:
    """``timeline``'s schedule with F and backward sitting close on a device fused into pairs wherever that does not
    hurt (see the module), simulated; ``timeline`` itself where none is possible. Stops at ``deadline``
    (``time.monotonic()``), keeping every fusion made by then."""
    if not pairs_possible(timeline.schedule.profile, timeline.schedule.placement):
        return timeline
    best, score = timeline, _score(timeline, objective)
    improved = True
    while improved and (deadline is None or time.monotonic() < deadline):
        improved = False
        for d in range(best.schedule.num_devices):
            i = 0
            while i < len(best.schedule.devices[d]) and (deadline is None or time.monotonic() < deadline):
                for order, strict in _moves(best.schedule.devices[d], i):
                    devices = list(best.schedule.devices)
                    devices[d] = order
                    try:
                        candidate = simulate(replace(best.schedule, devices=tuple(devices)))
                    except ScheduleError:
                        continue
                    if _accept(new := _score(candidate, objective), score, strict):
                        best, score, improved = candidate, new, True
                        break
                i += 1
    return best if best is timeline else replace(best, schedule=replace(best.schedule,
                                                                        name=f"{timeline.schedule.name}+pairs"))


def least_work(schedule: Schedule) -> float:
    """A lower bound on the objective of any schedule of ``schedule``'s problem whose F and backward may run as
    pairs: the largest device work, less, on a device of two or more stages, each of its F's saving the most any
    pair there saves (an F&BW pair: the overlap rule's saving grows with the computation beside it)."""
    profile, m = schedule.profile, schedule.num_microbatches
    most = 0.0
    for d in range(schedule.num_devices):
        stages = sorted({s for _, s in schedule.placement.stages_of(d)})
        work = m * sum(profile.time("F", s) + profile.time("BW", s) for s in stages)
        saving = max((profile.time("F", a) + profile.time("BW", b) - profile.pair_time(a, "BW", b)
                      for a in stages for b in stages if a != b), default=0.0)
        most = max(most, work - m * len(stages) * max(0.0, saving))
    return most
