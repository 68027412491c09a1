"""The classic schedules with a fused backward BW: GPipe, 1F1B and Megatron's interleaved 1F1B.

With the unit profile (T_F = T_B = T_W = 1, no communication) and m microbatches:

- gpipe: bubble (p-1)(T_F+T_B+T_W), peak m M_B.
- 1f1b: bubble (p-1)(T_F+T_B+T_W), peak min(p, m) M_B.
- 1f1b-i (two chunks per device): bubble (p-1)(T_F+T_B+T_W)/2, peak (3p-1)/2 M_B (m >= 2p; for m = p,
  every chunk's F runs before the first BW and the peak is m M_B); ``interleaved_1f1b`` takes any chunk count.
"""

from __future__ import annotations

from zbsolve.base.errors import InputError
from zbsolve.core.placement import CHUNKS, interleaved, sequential
from zbsolve.core.profile import Profile
from zbsolve.core.schedule import BW, F, Pass, Schedule, build
from zbsolve.schedulers.families.registry import register


@register("gpipe")
def gpipe(profile: Profile, num_devices: int, num_microbatches: int) -> Schedule:
    """GPipe: every stage runs all m F, then all m BW."""
    p, m = num_devices, num_microbatches
    devices = [[Pass(F, j, s) for j in range(m)] + [Pass(BW, j, s) for j in range(m)] for s in range(p)]
    return build("gpipe", sequential(p), m, profile, devices)


@register("1f1b")
def one_f_one_b(profile: Profile, num_devices: int, num_microbatches: int) -> Schedule:
    """1F1B: stage s warms up with min(p-s, m) F, then alternates BW and F, then drains BW."""
    p, m = num_devices, num_microbatches
    devices = []
    for s in range(p):
        warm = min(p - s, m)
        ops = [Pass(F, j, s) for j in range(warm)]
        for j in range(m):
            ops.append(Pass(BW, j, s))
            if warm + j < m:
                ops.append(Pass(F, warm + j, s))
        devices.append(ops)
    return build("1f1b", sequential(p), m, profile, devices)


def _virtual(k: int, p: int, chunks: int, forward: bool) -> tuple[int, int]:
    """(microbatch, chunk) of a device's k-th forward or backward in Megatron's order."""
    group, within = divmod(k, p * chunks)
    chunk = within // p
    return group * p + within % p, chunk if forward else chunks - 1 - chunk


@register("1f1b-i", CHUNKS)
def interleaved_1f1b(profile: Profile, num_devices: int, num_microbatches: int, chunks: int = CHUNKS) -> Schedule:
    """Megatron's interleaved 1F1B over ``chunks`` chunks per device (two as the family); needs m to be a multiple
    of p.

    Device d warms up with 2(p-1-d) + (chunks-1)p chunk F's, then alternates F and BW, then drains BW;
    chunks are visited in groups of p microbatches (forward chunk 0 to chunks-1, backward the reverse).
    """
    p, m, v = num_devices, num_microbatches, chunks
    if m % p:
        raise InputError(f"microbatches = {m} must be a multiple of stages p = {p} for 1f1b-i (Megatron)")
    placement = interleaved(p, v)
    prof = profile.per_chunk(p, v, "1f1b-i")
    total = m * v

    def f(k: int, d: int) -> Pass:
        mb, chunk = _virtual(k, p, v, True)
        return Pass(F, mb, chunk * p + d)

    def b(k: int, d: int) -> Pass:
        mb, chunk = _virtual(k, p, v, False)
        return Pass(BW, mb, chunk * p + d)

    devices = []
    for d in range(p):
        warm = min(2 * (p - 1 - d) + (v - 1) * p, total)
        ops = [f(k, d) for k in range(warm)]
        for k in range(total - warm):
            ops += [f(warm + k, d), b(k, d)]
        ops += [b(k, d) for k in range(total - warm, total)]
        devices.append(ops)
    return build("1f1b-i", placement, m, prof, devices)
