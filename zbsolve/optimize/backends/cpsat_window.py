"""A window of the CP-SAT backend's large-neighbourhood search: which passes of the incumbent it may reorder,
their least starts and latest ends, and the max-plus timing of the passes after it."""

from __future__ import annotations

import time
from dataclasses import dataclass
from graphlib import TopologicalSorter

import numpy as np

from zbsolve.optimize.formulation import Formulation

_CHECK_EVERY = 4096
"""Passes between two looks at the clock while a window's data is built."""
NEG = -(1 << 60)
"""Minus infinity of the max-plus lags."""
BEFORE, INSIDE, AFTER = -1, 0, 1
"""Where a pass's incumbent start lies with respect to a window."""


class OutOfTime(Exception):
    """A window's data could not be built before its deadline."""


@dataclass(frozen=True)
class After:
    """Max-plus timing of the passes after a window: pass ``i`` starts at the largest of ``const[i]`` and,
    over every source ``k`` with ``lag[i][k] > NEG``, source ``k``'s end plus ``lag[i][k]``. A source is
    ("pass", a): the end of window pass ``a``, which has a dependant after the window, or ("device", d):
    the end of device ``d``'s window passes."""

    sources: list[tuple[str, int]]
    lag: dict[int, np.ndarray]
    const: dict[int, int]


@dataclass(frozen=True)
class WindowData:
    """A window of the incumbent: passes whose start lies in it may be reordered; passes before it keep
    their times, passes after it their order."""

    order: list[list[int]]
    """The incumbent's pass order per device."""
    start: list[int]
    """The incumbent's start of every pass."""
    upper: int
    """The incumbent's objective, which no solution of the window exceeds."""
    where: list[int]
    """Per pass: BEFORE, INSIDE or AFTER the window."""
    inside: list[int]
    """The window's passes, by index."""
    inside_order: list[list[int]]
    """Per device, its window passes in incumbent order."""
    links: dict[int, list[tuple[int, int]]]
    """Per window pass, its (predecessor, lag) pairs inside the window."""
    least_start: dict[int, int]
    """Least start of each window pass."""
    latest_end: dict[int, int]
    """Largest end of each window pass."""
    after: After
    """How the passes after the window are timed."""


@dataclass(frozen=True)
class Incumbent:
    """The schedule a window is cut from, as the search holds it."""

    order: list[list[int]]
    """Its pass order per device."""
    start: list[int]
    """Its start of every pass."""
    upper: int
    """Its objective."""
    latest: list[int]
    """Each pass's latest start under ``upper``."""


def window_data(form: Formulation, incumbent: Incumbent, preds: list[list[tuple[int, int]]], t0: float, t1: float,
                deadline: float) -> WindowData:
    """The window [t0, t1) of ``incumbent`` (``preds``: each pass's (predecessor, lag) pairs); raise OutOfTime
    when it cannot be built by ``deadline``."""
    order, start, upper = incumbent.order, incumbent.start, incumbent.upper
    n = len(form.passes)
    where = [BEFORE if start[i] < t0 else INSIDE if start[i] < t1 else AFTER for i in range(n)]
    inside = sorted(i for i in range(n) if where[i] == INSIDE)
    links = {i: [(a, lag) for a, lag in preds[i] if where[a] == INSIDE] for i in inside}
    after = _after_window(form, order, start, where, preds, deadline)
    return WindowData(order, start, upper, where, inside, [[i for i in seq if where[i] == INSIDE] for seq in order],
                       links, _least_starts(form, order, start, where, preds, links),
                       _latest_ends(form, order, where, links, after, upper, incumbent.latest), after)


def _least_starts(form: Formulation, order: list[list[int]], start: list[int], where: list[int],
                  preds: list[list[tuple[int, int]]], links: dict[int, list[tuple[int, int]]]) -> dict[int, int]:
    """Least start of each window pass: after its device's passes before the window and its predecessors."""
    dur = form.duration
    least: dict[int, int] = {}
    for seq in order:
        before_end = max((start[i] + dur[i] for i in seq if where[i] == BEFORE), default=0)
        for i in seq:
            if where[i] == INSIDE:
                least[i] = max([form.earliest[i], before_end] + [start[a] + dur[a] + lag for a, lag in preds[i]
                                                                 if where[a] == BEFORE])
    for b in sorted(links):
        for a, lag in links[b]:
            least[b] = max(least[b], least[a] + dur[a] + lag)
    return least


def _latest_ends(form: Formulation, order: list[list[int]], where: list[int], links: dict[int, list[tuple[int, int]]],
                 after: After, upper: int, latest: list[int]) -> dict[int, int]:
    """Largest end of each window pass that keeps every device's span within ``upper`` (``latest``: every pass's
    latest start under ``upper``)."""
    dur = form.duration
    inside = sorted(links)
    end = {i: latest[i] + dur[i] for i in inside}
    for d, lasts in enumerate(form.last):
        for last in lasts:
            room = upper + form.offset[d] - dur[last]
            if where[last] == INSIDE:
                end[last] = min(end[last], room + dur[last])
            elif where[last] == AFTER:
                for k in np.nonzero(after.lag[last] > NEG // 2)[0]:
                    kind, x = after.sources[k]
                    for i in ([x] if kind == "pass" else [i for i in order[x] if where[i] == INSIDE]):
                        end[i] = min(end[i], room - int(after.lag[last][k]))
    successors: dict[int, list[tuple[int, int]]] = {}
    for b in inside:
        for a, lag in links[b]:
            successors.setdefault(a, []).append((b, lag))
    for a in reversed(inside):
        for b, lag in successors.get(a, ()):
            end[a] = min(end[a], end[b] - dur[b] - lag)
    return end


def _after_window(form: Formulation, order: list[list[int]], start: list[int], where: list[int],
                  preds: list[list[tuple[int, int]]], deadline: float) -> After:
    """The max-plus timing of the passes after the window, from their dependencies and device order; only the
    last passes' rows are kept (each other row is dropped once the passes that read it are timed). Raise
    OutOfTime when the clock passes ``deadline``."""
    dur = form.duration
    previous: dict[int, int | None] = {}
    for seq in order:
        for a, b in zip([None, *seq[:-1]], seq):
            previous[b] = a

    def inputs(i: int) -> list[tuple[int, int]]:
        before = previous[i]
        return list(preds[i]) + ([(before, 0)] if before is not None else [])

    by_start = sorted((i for i in range(len(form.passes)) if where[i] == AFTER), key=lambda i: start[i])
    # each pass after those it reads, also where they start together (a pass of no duration and its reader)
    reads = {i: [a for a, _ in inputs(i) if where[a] == AFTER] for i in by_start}
    later = list(TopologicalSorter(reads).static_order())

    def source(i: int, a: int) -> tuple[str, int]:
        return ("device", form.device[i]) if a == previous[i] else ("pass", a)

    sources: list[tuple[str, int]] = []
    index: dict[tuple[str, int], int] = {}
    readers = dict.fromkeys(later, 0)
    for count, i in enumerate(later):
        if count % _CHECK_EVERY == 0 and time.monotonic() > deadline:
            raise OutOfTime
        for a, _ in inputs(i):
            if where[a] == INSIDE and source(i, a) not in index:
                index[source(i, a)] = len(sources)
                sources.append(source(i, a))
            elif where[a] == AFTER:
                readers[a] += 1
    kept = {i for lasts in form.last for i in lasts}
    lag: dict[int, np.ndarray] = {}
    const: dict[int, int] = {}
    for count, i in enumerate(later):
        if count % _CHECK_EVERY == 0 and time.monotonic() > deadline:
            raise OutOfTime
        row = np.full(len(sources), NEG, dtype=np.int64)
        floor = 0
        for a, gap in inputs(i):
            if where[a] == AFTER:
                np.maximum(row, lag[a] + (dur[a] + gap), out=row)
                floor = max(floor, const[a] + dur[a] + gap)
                readers[a] -= 1
                if not readers[a] and a not in kept:
                    del lag[a], const[a]
            elif where[a] == BEFORE:
                floor = max(floor, start[a] + dur[a] + gap)
            else:
                k = index[source(i, a)]
                row[k] = max(row[k], gap)
        lag[i], const[i] = row, floor
    return After(sources, lag, const)


# -- model -------------------------------------------------------------------------------------
