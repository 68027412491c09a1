"""The memory rule, stated once: a device's activation memory is the running sum of its passes' memory deltas in
its order (an F's counted from its start, a B's or W's from its end), and stays within the device's limit."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from zbsolve.base.checks import exceeds
from zbsolve.core.schedule import KINDS, Op, Pass, Schedule, passes_of


def levels(schedule: Schedule, device: int) -> Iterator[tuple[int, Op, Pass, float]]:
    """Per pass of ``device``'s order: its op's position, the op, the pass, and the activation memory after it."""
    delta = {kind: [schedule.memory_delta(Pass(kind, 0, s)) for s in range(schedule.num_stages)] for kind in KINDS}
    level = 0.0
    for i, op in enumerate(schedule.devices[device]):
        for p in (op,) if op.__class__ is Pass else passes_of(op):
            level += delta[p[0]][p[2]]
            yield i, op, p, level


def fits(schedule: Schedule, limits: Sequence[float]) -> bool:
    """Whether every device's running memory stays within its limit (known from the orders, without timing)."""
    return not any(exceeds(level, limit) for d, limit in enumerate(limits) for *_, level in levels(schedule, d))
