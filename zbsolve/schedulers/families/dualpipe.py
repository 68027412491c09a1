"""DeepSeek's DualPipe (bidirectional) and DualPipeV (its V-shape "cut-in-half" variant).

Both interleave overlapped F&B pairs (``Pair(F, BW)``, timed by the overlap rule, ``core.overlap``) with
zero-bubble B/W splits in warm-up and cool-down, in the order of deepseek-ai/DualPipe's ``step``.
The seeds' closed form (DeepSeek-V3 report) is a bubble of (PP/2 - 1)(F&B + B - 3W) per device,
B there being the full backward (our B + W), and PP + 1 activations against 1F1B's PP, both counted
in microbatches of one DualPipe chunk.

With the unit profile (T_F = T_B = T_W = 1, M_B = 1, M_W = 0.5, no communication, no overlap saving):

- dualpipe (even p; even m >= 2p - 2; stage r on device r for microbatches 0..m/2-1, on device
  p-1-r for m/2..m-1): every device idles exactly (p/2 - 1)(F&B + T_B - 2 T_W) = p - 2; peak
  min(p + 1, m) M_B, i.e. PP + 1 stage activations (on every device once m >= 2p).
- dualpipev (p devices, vshape placement, m >= 2p - 1): the same order on 2p chunk stages of half a
  stage each, so PP = 2p: every device idles (p - 1)(F&B + T_B - 2 T_W) with chunk times, = p - 1;
  peak min((2p + 1)/2, m) M_B, i.e. PP + 1 chunk activations (on every device once m >= 2p).

With unit times and an overlap saving up to 1/3 (F&B >= T_F + T_B), the closed form is the idle time of
the most idle device.

DeepSeek's code asserts m >= 2p; the order is complete, with the same bubble, from the smaller bounds
above, the fewest microbatches the warm-up of device 0 needs.
"""

from __future__ import annotations

from collections import deque
from typing import Sequence

from zbsolve.base.errors import InputError
from zbsolve.core.placement import bidirectional, vshape
from zbsolve.core.profile import Profile
from zbsolve.core.schedule import BW, B, F, Op, Pair, Pass, Schedule, W, build
from zbsolve.schedulers.families.registry import register


class _Device:
    """One device's order under construction: phase 0 is the chunk whose stage comes first on its route."""

    def __init__(self, stages: tuple[int, int], microbatches: tuple[Sequence[int], Sequence[int]]) -> None:
        self.stages, self.microbatches = stages, microbatches
        self.forwards, self.backwards = [0, 0], [0, 0]
        self.pending: deque[Pass] = deque()
        self.ops: list[Op] = []

    def _forward(self, phase: int) -> Pass:
        mb = self.microbatches[phase][self.forwards[phase]]
        self.forwards[phase] += 1
        return Pass(F, mb, self.stages[phase])

    def _backward(self, phase: int, split: bool) -> Pass:
        mb, stage = self.microbatches[phase][self.backwards[phase]], self.stages[phase]
        self.backwards[phase] += 1
        if split:
            self.pending.append(Pass(W, mb, stage))
        return Pass(B if split else BW, mb, stage)

    def f(self, phase: int) -> None:
        """Append a forward of ``phase``."""
        self.ops.append(self._forward(phase))

    def b(self, phase: int, split: bool = False) -> None:
        """Append a backward of ``phase``: B with its W queued when ``split``, else the fused BW."""
        self.ops.append(self._backward(phase, split))

    def w(self) -> None:
        """Append the oldest queued W."""
        self.ops.append(self.pending.popleft())

    def fb(self, forward: int, backward: int) -> None:
        """Append an overlapped pair: F of ``forward`` with the fused BW of ``backward``."""
        self.ops.append(Pair(self._forward(forward), self._backward(backward, False)))


def _dual_order(half: int, h: int, count: int, stages: tuple[int, int],
                microbatches: tuple[Sequence[int], Sequence[int]]) -> list[Op]:
    """DualPipe's eight steps on one device: ``half`` devices per half pipeline, ``h`` this device's place
    in its half, ``count`` microbatches per phase."""
    dev = _Device(stages, microbatches)
    rest = half - h - 1
    for _ in range(2 * rest):
        dev.f(0)
    for _ in range(h + 1):
        dev.f(0)
        dev.f(1)
    for _ in range(rest):
        dev.b(1, split=True)
        dev.w()
        dev.f(1)
    for i in range(count - 2 * half + h + 1):
        if i == 0 and h == half - 1:
            dev.f(0)
            dev.b(1)
        else:
            dev.fb(0, 1)
        dev.fb(1, 0)
    for _ in range(rest):
        dev.b(1)
        dev.fb(1, 0)
    split = False
    for i in range(h + 1):
        split = split or (i == (h + 1) // 2 and h % 2 == 1)
        dev.b(1, split)
        split = split or (i == (h + 1) // 2 and h % 2 == 0)
        dev.b(0, split)
    for _ in range(rest):
        dev.w()
        dev.b(0, split=True)
    for _ in range(h + 1):
        dev.w()
    return dev.ops


def _check_microbatches(family: str, num_devices: int, num_microbatches: int, least: int, even: bool) -> None:
    p, m = num_devices, num_microbatches
    if m < least:
        raise InputError(f"microbatches = {m} is too few for {family} on {p} devices; the smallest valid is {least}")
    if even and m % 2:
        raise InputError(f"microbatches = {m} must be even for {family}; the smallest valid is {m + 1}")


@register("dualpipe")
def dualpipe(profile: Profile, num_devices: int, num_microbatches: int) -> Schedule:
    """DualPipe: microbatches 0..m/2-1 run stages 0..p-1 down the devices, m/2..m-1 run them up.

    Needs even p (two halves) and even m >= 2p - 2. Unit profile, no overlap saving: each device idles
    (p/2 - 1)(F&B + T_B - 2 T_W) = p - 2; peak min(p + 1, m) M_B."""
    p, m = num_devices, num_microbatches
    if p % 2:
        raise InputError(f"stages (num_devices) = {p} must be even for dualpipe; the smallest valid is {p + 1}")
    _check_microbatches("dualpipe", p, m, 2 * p - 2, even=True)
    if profile.num_stages not in (None, p):
        raise InputError(f"profile has {profile.num_stages} stages; dualpipe on {p} devices needs {p}")
    half = p // 2
    routes = (range(m // 2), range(m // 2, m))
    devices = []
    for r in range(p):
        h = min(r, p - 1 - r)
        first = 0 if r < half else 1
        devices.append(_dual_order(half, h, m // 2, (h, p - 1 - h), (routes[first], routes[1 - first])))
    route = [0] * (m // 2) + [1] * (m - m // 2)
    return build("dualpipe", bidirectional(p), m, profile.expand(p), devices, microbatch_route=route)


@register("dualpipev", 2)
def dualpipev(profile: Profile, num_devices: int, num_microbatches: int) -> Schedule:
    """DualPipeV: DualPipe cut in half on a V placement; device r runs stages r and 2p-1-r.

    Needs m >= 2p - 1. Unit profile, no overlap saving: each device idles (p - 1)(F&B + T_B - 2 T_W) with chunk
    times, = p - 1; peak min((2p + 1)/2, m) M_B."""
    p, m = num_devices, num_microbatches
    _check_microbatches("dualpipev", p, m, 2 * p - 1, even=False)
    prof = profile.per_chunk(p, 2, "dualpipev")
    devices = [_dual_order(p, r, m, (r, 2 * p - 1 - r), (range(m), range(m))) for r in range(p)]
    return build("dualpipev", vshape(p), m, prof, devices)
