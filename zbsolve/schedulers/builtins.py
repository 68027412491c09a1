"""torch.distributed.pipelining's built-in schedules as baselines on zbsolve's costs.

Each built-in is timed by the simulator like any schedule, on the profile given: its order is the one torch's own
schedule class makes (``torch_compat.schedule_order``) where torch is installed, else zbsolve's family of the same
order. Where both run, torch 2.13's orders are the families', pass for pass (``tests/test_baselines.py``); they
differ in the (p, m) they accept:

- 1F1B: torch refuses m < p; zbsolve's 1f1b runs it (min(p - s, m) warm-up forwards).
- Interleaved1F1B: torch runs m a multiple of max(1, m // p) (its rounds); zbsolve's 1f1b-i only m a multiple
  of p, where the two orders are the same.
- DualPipeV: torch refuses m < 2p; zbsolve's dualpipev runs m = 2p - 1, the fewest its warm-up needs.
- InterleavedZeroBubble (torch's ZB1P on the looped placement) has no zbsolve family: it needs torch.

Beside them, Megatron's combined 1F1B (``COMBINED``) is the order of one of them run combined, and DeepSeek's
DualPipe (``DUALPIPE``) is zbsolve's dualpipe family on the bidirectional placement; ``ORDERS`` names them all and
``order_name`` reads a name in any case.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import NamedTuple

from zbsolve.base.checks import check_count, check_size
from zbsolve.base.errors import InputError
from zbsolve.core import torch_compat
from zbsolve.core.placement import make_placement
from zbsolve.core.profile import Profile
from zbsolve.core.schedule import Schedule, build
from zbsolve.core.transforms import combined
from zbsolve.schedulers.families import make_schedule
from zbsolve.schedulers.families.classic import interleaved_1f1b


class Builtin(NamedTuple):
    """Where one of torch's built-in schedules puts its stages, and zbsolve's family of the same order."""

    placement: str
    """Placement name: "sequential", "interleaved" (stage s on device s mod p) or "vshape"."""
    chunks: int
    """Stages per device."""
    family: str | None
    """zbsolve's family of the same order, used without torch; None for none."""


BUILTINS: dict[str, Builtin] = {
    "GPipe": Builtin("sequential", 1, "gpipe"),
    "1F1B": Builtin("sequential", 1, "1f1b"),
    "Interleaved1F1B": Builtin("interleaved", 2, "1f1b-i"),
    "InterleavedZeroBubble": Builtin("interleaved", 2, None),
    "ZBVZeroBubble": Builtin("vshape", 2, "zb-v"),
    "DualPipeV": Builtin("vshape", 2, "dualpipev"),
}
"""torch's built-in schedules (``schedules.get_schedule_class`` names), in order, with their placements."""
COMBINED = "Combined1F1B"
"""Megatron's combined 1F1B (``--overlap-moe-expert-parallel-comm``), not one of torch's: the order of 1F1B (one
stage per device, no pipeline parallelism) or Interleaved1F1B run combined (``core.transforms.combined``)."""
DUALPIPE = "DualPipe"
"""DeepSeek's DualPipe (DeepSeek-V3 technical report, section 3.2.1), not one of torch's: zbsolve's dualpipe family on
the bidirectional placement, rank r holding stages r and p - 1 - r (two copies of the parameters: every stage on
two ranks), its F&B pairs overlapped as DeepSeek's runtime overlaps them."""
ORDERS = (*BUILTINS, COMBINED, DUALPIPE)
"""Every order ``builtin_schedule`` builds, by name."""
OVERLAPPED = (COMBINED, DUALPIPE)
"""The orders whose F&B pairs their own runtime overlaps, whatever a target's runtime does."""


def order_name(name: str) -> str:
    """The order of ``ORDERS`` that ``name`` names, in any case; an ``InputError`` listing them for another."""
    found = {order.lower(): order for order in ORDERS}.get(name.lower()) if isinstance(name, str) else None
    if found is None:
        raise InputError(f"schedule = {name!r}: should be one of {', '.join(ORDERS)} (any case)")
    return found


def megatron_builtin(chunks: int) -> str:
    """The built-in of Megatron-core's order with ``chunks`` stages per device
    (``io.targets.megatron.megatron_schedule`` says why): 1F1B with one, Interleaved1F1B with more; the order
    ``COMBINED`` runs combined."""
    return "1F1B" if chunks == 1 else "Interleaved1F1B"


def builtin_placement(name: str, chunks: int) -> str:
    """The placement the built-in ``name`` (or ``COMBINED``, ``DUALPIPE``) with ``chunks`` stages per device runs on
    (DualPipe's bidirectional one has two per device whatever ``chunks``)."""
    if name == DUALPIPE:
        return "bidirectional"
    return BUILTINS[megatron_builtin(chunks) if name == COMBINED else name].placement


@functools.lru_cache(maxsize=64)
def _torch_order(name: str, num_devices: int, stages_per_rank: int, num_microbatches: int) -> tuple[tuple, ...]:
    """torch's order of ``name``, built once per (name, p, stages per rank, m): it does not depend on the costs."""
    order = torch_compat.schedule_order(name, num_devices=num_devices, stages_per_rank=stages_per_rank,
                                        num_microbatches=num_microbatches)
    return tuple(tuple(ops) for ops in order)


def builtin_schedule(name: str, profile: Profile, num_devices: int, num_microbatches: int,
                     chunks: int | None = None) -> Schedule:
    """torch's built-in schedule ``name`` (one of ``BUILTINS``) on ``num_devices`` devices with
    ``num_microbatches`` microbatches and no memory limit, named ``name``. Its order is torch's own
    (``torch_compat.schedule_order``) where torch is installed, else that of zbsolve's family (``BUILTINS``).
    ``chunks`` stages per device (default: the built-in's own) are for the multi-stage built-ins torch builds with
    any count; without torch only Interleaved1F1B takes another count (``interleaved_1f1b``, Megatron's order).
    The profile has one entry per stage (stages per device x ``num_devices``) or scalars; for several stages per
    device, a ``num_devices``-stage or scalar profile is split into chunks as the families split it
    (``Profile.per_chunk``). ``COMBINED`` is Megatron's order (``megatron_builtin``) run combined; ``DUALPIPE``
    is the dualpipe family on ``num_devices`` stages (``chunks`` ignored). ``InputError`` of one line for an unknown
    name, a combination torch (or, without torch, the family) refuses, and InterleavedZeroBubble without torch."""
    if name == DUALPIPE:
        p = check_count("num_devices", num_devices)
        return replace(make_schedule("dualpipe", profile.expand(p), p, num_microbatches), name=DUALPIPE)
    if name == COMBINED:
        c = BUILTINS[megatron_builtin(2)].chunks if chunks is None else check_count("chunks", chunks)
        return replace(combined(builtin_schedule(megatron_builtin(c), profile, num_devices, num_microbatches, c)),
                       name=COMBINED)
    if name not in BUILTINS:
        raise InputError(f"schedule = {name!r} is not one of torch's built-in schedules; choose one of "
                         f"{', '.join(BUILTINS)}")
    placement, own, family = BUILTINS[name]
    c = own if chunks is None else check_count("chunks", chunks)
    p = check_count("num_devices", num_devices)
    m = check_count("num_microbatches", num_microbatches)
    check_size(c * p, m)
    costs = profile.per_chunk(p, c, name) if c > 1 else profile.expand(p)
    if torch_compat.has_pipelining():
        return build(name, make_placement(placement, p, c), m, costs, _torch_order(name, p, c, m))
    if family is None or (c != own and name != "Interleaved1F1B"):
        count = "" if c == own else f" with {c} stages per device"
        raise InputError(f"schedule = {name!r}{count} needs torch (torch.distributed.pipelining), which is not "
                         "installed; zbsolve has no family of its order")
    if c != own:
        return replace(interleaved_1f1b(costs, p, m, c), name=name)
    return replace(make_schedule(family, costs, p, m), name=name)
