"""V-shape schedules: two chunks per device, device r holding stages r and 2p-1-r.

A p-stage (or scalar) profile is split into 2p chunk stages, each with half the time and memory
(``Profile.per_chunk``). With the unit profile (T_F = T_B = T_W = 1, M_B = 1, M_W = 0.5, no communication),
each chunk has F = B = W = 0.5 and M_B / 2, 1F1B's peak is p M_B, and:

- zb-v (Zero Bubble PP, ZB-V): paper bubble 0 exactly when m >= 2p - 1; peak min(m, p) M_B, 1F1B's.
- v-half (Controllable Memory, V-Half): peak min(m, (p+2)//2) M_B, the paper's (p+2)//2 microbatches;
  paper bubble <= p/(2m), the paper's ~p/(2m); for m >= 2p, max span - max work is (3p-4)/2 for odd p,
  (3p-7)/2 for even p >= 4 and 1/2 for p = 2, whatever m.
- v-min (Controllable Memory, V-Min): peak min(m, (p+4)//3) M_B for p >= 3, the paper's (p+4)//3
  microbatches (3/2 M_B for p = 2, m >= 2); paper bubble <= 2p/(3m), the paper's ~2p/(3m); for m >= 2p,
  max span - max work is 2p - 5/2, or 2p - 7/2 when 3 divides p, whatever m.

V-Half and V-Min repeat the paper's building block every 6 unit slots (four chunk passes and two W),
then squeeze warm-up and cool-down under the block's own peak, as the authors' greedy generator
(sail-sg/zero-bubble-pipeline-parallelism, zbv_greedy.py) does.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import defaultdict

from zbsolve.core.dependencies import dependencies
from zbsolve.core.placement import vshape
from zbsolve.core.profile import Profile
from zbsolve.core.schedule import B, F, Kind, Pass, Schedule, W, build
from zbsolve.core.timing import asap
from zbsolve.schedulers.families.registry import register

Slots = list[list[int]]
"""One device's slot times: slots[kind][mb] for the kinds below."""

F0, F1, B1, B0, WS = range(5)
"""Building-block kinds: F of chunk 0 (down) and 1 (up), B of chunk 1 and 0, then W."""

PERIOD = 6
"""Unit slots between a building block and the next: F0, F1, B1, B0 and two W."""


# -- ZB-V ------------------------------------------------------------------------------------------

def _zb_v_order(p: int, r: int, n: int) -> list[Pass]:
    """Device r's ZB-V order over n microbatches (torch's ScheduleZBVZeroBubble)."""
    down, up = r, 2 * p - 1 - r
    taken: dict[tuple[Kind, int], int] = defaultdict(int)
    order: list[Pass] = []

    def run(*ops: tuple[Kind, int]) -> None:
        for kind, stage in ops:
            order.append(Pass(kind, taken[kind, stage], stage))
            taken[kind, stage] += 1

    run(*[(F, down)] * (2 * (p - r) - 1))
    run(*[(F, up), (F, down)] * r)
    run(*[(F, up), (B, up), (W, up)] * (p - r))
    while taken[F, up] < taken[F, down] or taken[F, down] < n:
        if taken[F, down] < n:
            run((F, down))
        run((B, down), (W, down), (F, up), (B, up), (W, up))
    run(*[(B, down), (B, up)] * r)
    run(*[(B, down), (W, down)] * (p - r))
    run(*[(W, up)] * (taken[B, up] - taken[W, up]))
    run(*[(W, down)] * (taken[B, down] - taken[W, down]))
    return order


@register("zb-v", 2)
def zb_v(profile: Profile, num_devices: int, num_microbatches: int) -> Schedule:
    """ZB-V: device r warms up with 2(p-r)-1 chunk-0 F, then r (F1, F0), then p-r (F1, B1, W1); steady
    state F0 B0 W0 F1 B1 W1; cool-down B's first, W's last. For m < 2p-1 the order is that of 2p-1
    microbatches with the missing ones left out. Unit profile: paper bubble 0 for m >= 2p-1, peak min(m, p) M_B."""
    p, m = num_devices, num_microbatches
    prof = profile.per_chunk(p, 2, "zb-v")
    n = max(2 * p - 1, m)
    devices = [[op for op in _zb_v_order(p, r, n) if op.mb < m] for r in range(p)]
    return build("zb-v", vshape(p), m, prof, devices)


# -- V-Half and V-Min: building blocks, squeezed ---------------------------------------------------

def _v_half_block(p: int) -> list[list[int]]:
    """V-Half's building block: slots of F0, F1, B1, B0 on each device."""
    gap = 3 if p % 2 == 0 else 0
    return [[2 * i, 3 * p - i - 2, 3 * p + gap + 2 * i - 1, 6 * p + gap - i - 2] for i in range(p)]


def _v_min_block(p: int) -> list[list[int]]:
    """V-Min's building block: slots of F0, F1, B1, B0 on each device."""
    gap = 2 if p % 3 == 0 else 0
    return [[i, 2 * p - i - 1, 2 * p + gap + i, 4 * p + gap - i - 1] for i in range(p)]


def _fill_w(slots: Slots, split: bool) -> Slots:
    """W slots of one device: each free slot takes a pending W (chunk 1's first when ``split``), the rest
    follow the last pass. Returns [W of chunk 1, W of chunk 0] when split, else [all W]."""
    ws: Slots = [[], []]
    pending = [0, 0]
    slot = 0

    def place() -> None:
        for c in (0, 1):
            if pending[c]:
                ws[c].append(slot)
                pending[c] -= 1
                return

    for t, kind in sorted((u, k) for k in (F0, F1, B1, B0) for u in slots[k]):
        while slot < t:
            place()
            slot += 1
        slot = t + 1
        if kind in (B1, B0):
            pending[kind - B1 if split else 0] += 1
    while any(pending):
        place()
        slot += 1
    return ws if split else ws[:1]


class _Held:
    """One device's chunk activations slot by slot while ``_squeeze`` moves its passes: F adds one, W frees one,
    the W's given or, with ``fill``, filling free slots as ``_fill_w`` places them. Moving a pass from slot t to
    an earlier s changes what is held in slots s..t-1 only when the W's are given, and from s to the end when
    they fill (which ``_squeeze`` does in the cool-down only), so testing a move costs those slots, not the
    whole schedule."""

    def __init__(self, slots: Slots, fill: bool) -> None:
        self.fill = fill
        self.at: list[int | None] = [None] * (1 + max(t for lst in slots for t in lst))  # kind in each slot
        for kind, lst in enumerate(slots):
            for t in lst:
                self.at[t] = kind
        self.pending, self.held = [0], [0]  # W's pending and activations held before each slot
        self.peak = self._replay(0, record=True)

    def _replay(self, x: int, record: bool, moved: int | None = None) -> int:
        """The most held from slot ``x`` on, from the state stored before it, until every pass and W is done, or
        until past slot ``moved`` (where a pass left) the state is the stored one again; ``record`` stores the
        states reached."""
        at, fill, pend, hold = self.at, self.fill, self.pending, self.held
        pending, held = pend[x], hold[x]
        top = held
        while x < len(at) or pending:
            kind = at[x] if x < len(at) else None
            if kind is None:
                if pending:
                    pending, held = pending - 1, held - 1
            elif kind == WS:
                held -= 1
            elif kind in (F0, F1):
                held += 1
                top = max(top, held)
            elif fill:
                pending += 1
            x += 1
            if moved is not None and moved < x < len(hold) and pending == pend[x] and held == hold[x]:
                return max(top, max(hold[x:]))
            if record:
                if x < len(hold):
                    pend[x], hold[x] = pending, held
                else:
                    pend.append(pending)
                    hold.append(held)
        if record:
            del pend[x + 1:], hold[x + 1:]
        return top

    def fits(self, kind: int, t: int, s: int, cap: int) -> bool:
        """Whether moving the pass of ``kind`` from slot ``t`` to the free slot ``s`` < t keeps the device within
        ``cap`` (it is within it before)."""
        if not self.fill:
            return kind not in (F0, F1) or max(self.held[s + 1:t + 1]) + 1 <= cap
        at = self.at
        at[t], at[s] = None, kind
        top = self._replay(s, False, t)
        at[t], at[s] = kind, None
        return top <= cap

    def move(self, kind: int, t: int, s: int) -> None:
        """Move the pass of ``kind`` from slot ``t`` to the free slot ``s`` < t."""
        self.at[t], self.at[s] = None, kind
        if self.fill:
            self._replay(s, True, t)
        elif kind != B0 and kind != B1:
            step = 1 if kind in (F0, F1) else -1
            self.held[s + 1:t + 1] = [h + step for h in self.held[s + 1:t + 1]]


def _ready(times: list[Slots], d: int, kind: int, mb: int, backs: list[int]) -> int:
    """Slot of the last pass that (d, kind, mb) depends on, or -1: by the dependency rule (``_sources``), a W on
    its device's mb-th B (``backs``: device d's B slots in order), and on the same kind's previous microbatch."""
    deps = [-1, backs[mb]] if kind == WS else [-1] + [times[src][k][mb] for src, k in _sources(len(times), d, kind)]
    if mb > 0:
        deps.append(times[d][kind][mb - 1])
    return max(deps)


def _events(times: list[Slots]) -> list[tuple[int, int, int, int]]:
    """Every pass as (slot, device, kind, mb), in slot order."""
    return sorted((t, d, kind, mb) for d, ts in enumerate(times) for kind, lst in enumerate(ts)
                  for mb, t in enumerate(lst))


_KIND = {(F, True): F0, (F, False): F1, (B, True): B0, (B, False): B1}
"""Building-block kind of a pass by its kind and whether its stage is the device's chunk 0."""


def _pass(p: int, d: int, kind: int, mb: int) -> Pass | None:
    """The pass of building-block ``kind`` on device ``d`` (None for a W, which names no stage)."""
    if kind == WS:
        return None
    return Pass(F if kind in (F0, F1) else B, mb, d if kind in (F0, B0) else 2 * p - 1 - d)


def _sources(p: int, d: int, kind: int) -> list[tuple[int, int]]:
    """(device, kind) of the passes that device d's pass of ``kind`` waits for (of its microbatch), by the dependency
    rule (``dependencies``; none for a W, which names no stage)."""
    q = _pass(p, d, kind, 0)
    sources = [(min(dep.stage, 2 * p - 1 - dep.stage), dep) for dep in dependencies(q, 2 * p)] if q else []
    return [(src, _KIND[dep.kind, dep.stage == src]) for src, dep in sources]


def _links(p: int, d: int, kind: int) -> list[tuple[int, int]]:
    """The ``_sources`` of device d's pass of ``kind`` on other devices."""
    return [(src, k) for src, k in _sources(p, d, kind) if src != d]


def _compact(times: list[Slots]) -> list[Slots]:
    """Unit-time as-soon-as-possible slots of the order the slots give, with no communication: each pass
    waits for its device's previous one and its dependencies on other devices."""
    p = len(times)
    events = _events(times)
    node = [[[0] * len(lst) for lst in ts] for ts in times]
    for i, (_, d, kind, mb) in enumerate(events):
        node[d][kind][mb] = i
    links = [[_links(p, d, kind) for kind in range(len(ts))] for d, ts in enumerate(times)]
    orders: list[list[int]] = [[] for _ in range(p)]
    preds: list[list[tuple[int, int]]] = []
    for i, (_, d, kind, mb) in enumerate(events):
        orders[d].append(i)
        preds.append([(node[src][k][mb], 0) for src, k in links[d][kind]])
    end = asap(orders, [1] * len(events), preds).end
    return [[[end[i] - 1 for i in lst] for lst in ts] for ts in node]


def _squeeze(times: list[Slots], with_w: bool) -> list[Slots]:
    """Move warm-up (only ``with_w``) and cool-down passes to their earliest free slot that keeps every
    device within the block's peak; the steady state stays. Returns compacted slots, W's included."""
    times = [[list(lst) for lst in ts[:WS]] + (_fill_w(ts, split=False) if with_w else []) for ts in times]
    held = [_Held(ts, fill=not with_w) for ts in times]
    cap = max(h.peak for h in held)
    backs = [sorted(ts[B1] + ts[B0]) for ts in times]
    last = len(times[0][F0]) - 1
    occupied: list[set[int]] = [set() for _ in times]
    phase = 0
    for t, d, kind, mb in _events(times):
        if phase == 0 and kind == B0 and d == 0:
            phase = 1
        if phase == 1:
            phase += kind == F0 and mb == last
        elif phase == 2 or with_w:
            for slot in range(_ready(times, d, kind, mb, backs[d]) + 1, t):
                if slot not in occupied[d] and held[d].fits(kind, t, slot, cap):
                    times[d][kind][mb] = slot
                    held[d].move(kind, t, slot)
                    if kind in (B1, B0):
                        del backs[d][bisect_left(backs[d], t)]
                        insort(backs[d], slot)
                    break
        occupied[d].add(times[d][kind][mb])
    if not with_w:
        times = [ts + _fill_w(ts, split=False) for ts in times]
    return _compact(times)


def _block_order(block: list[list[int]], m: int) -> list[list[Pass]]:
    """Per device, the passes of m repeated building blocks, squeezed, in slot order."""
    p = len(block)
    times = [[list(range(t, t + PERIOD * m, PERIOD)) for t in offsets] for offsets in block]
    times = [ts[:WS] for ts in _squeeze(times, with_w=True)]
    times = [ts[:WS] for ts in _squeeze(times, with_w=False)]
    devices = []
    for d, ts in enumerate(times):
        down, up = d, 2 * p - 1 - d
        w_up, w_down = _fill_w(ts, split=True)
        passes = {F0: (F, down), F1: (F, up), B1: (B, up), B0: (B, down)}
        events = [(t, Pass(kind, mb, stage)) for k, (kind, stage) in passes.items() for mb, t in enumerate(ts[k])]
        events += [(t, Pass(W, mb, stage)) for lst, stage in ((w_up, up), (w_down, down)) for mb, t in enumerate(lst)]
        devices.append([op for _, op in sorted(events)])
    return devices


def _block_schedule(name: str, block: list[list[int]], profile: Profile, num_devices: int,
                    num_microbatches: int) -> Schedule:
    prof = profile.per_chunk(num_devices, 2, name)
    return build(name, vshape(num_devices), num_microbatches, prof, _block_order(block, num_microbatches))


@register("v-half", 2)
def v_half(profile: Profile, num_devices: int, num_microbatches: int) -> Schedule:
    """V-Half: the half-memory V building block repeated m times, squeezed. Unit profile: peak
    min(m, (p+2)//2) M_B, paper bubble <= p/(2m)."""
    return _block_schedule("v-half", _v_half_block(num_devices), profile, num_devices, num_microbatches)


@register("v-min", 2)
def v_min(profile: Profile, num_devices: int, num_microbatches: int) -> Schedule:
    """V-Min: the third-memory V building block repeated m times, squeezed. Unit profile: peak
    min(m, (p+4)//3) M_B (p >= 3), paper bubble <= 2p/(3m)."""
    return _block_schedule("v-min", _v_min_block(num_devices), profile, num_devices, num_microbatches)
