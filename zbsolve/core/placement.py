"""Placement: which device runs each model stage, expressed as routes.

``routes[r][s]`` is the device that runs stage ``s`` for microbatches of route ``r``.
One route covers sequential, interleaved and V-shape placements; DualPipe's bidirectional
placement has two routes (one per direction, each device holding two weight copies).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, NamedTuple, get_args

from zbsolve.base.checks import check_count
from zbsolve.base.errors import InputError

PlacementName = Literal["sequential", "interleaved", "vshape"]
"""Placements the optimizer solves (the bidirectional one is DualPipe's family alone)."""
SUPPORTED_PLACEMENTS: tuple[str, ...] = get_args(PlacementName)
PLACEMENTS: tuple[str, ...] = (*SUPPORTED_PLACEMENTS, "bidirectional")
"""Every placement by name."""
PlanPlacement = Literal["auto", PlacementName]
"""A placement to plan for, or "auto" for the best of them."""
CHUNKS = 2
"""Stages per device of the interleaved and V-shape placements unless given."""


class Placement(NamedTuple):
    """Stage-to-device map of a schedule."""

    num_devices: int
    """Number of devices p."""
    routes: tuple[tuple[int, ...], ...]
    """routes[r][s]: device of stage s on route r."""

    @property
    def num_stages(self) -> int:
        """Number of model stages S (every route has S entries)."""
        return len(self.routes[0])

    def device(self, route: int, stage: int) -> int:
        """Device running ``stage`` for a microbatch on ``route``."""
        return self.routes[route][stage]

    def stages_of(self, device: int) -> list[tuple[int, int]]:
        """(route, stage) pairs that ``device`` runs, in route then stage order."""
        return [(r, s) for r, route in enumerate(self.routes) for s, d in enumerate(route) if d == device]


def check_placement(name: object, choices: Sequence[str] = PLACEMENTS) -> str:
    """``name`` when it is one of ``choices`` (by default every placement; ``SUPPORTED_PLACEMENTS``: those the
    optimizer solves); anything else is an ``InputError`` naming them."""
    if not isinstance(name, str) or name not in choices:
        why = "is not supported by the optimizer" if name in PLACEMENTS else "is unknown"
        raise InputError(f"placement = {name!r} {why}; choose one of {', '.join(choices)}")
    return name


def check_chunks(placement: str, chunks: object) -> int:
    """``chunks``, the stages per device of ``placement``: an integer >= 1, even for the V-shape (whose stages go
    down the devices and back up); anything else is an ``InputError``."""
    chunks = check_count("chunks", chunks)
    if placement == "vshape" and chunks % 2:
        raise InputError(f"chunks = {chunks} must be even for the vshape placement (smallest valid: 2)")
    return chunks


def sequential(num_devices: int) -> Placement:
    """One stage per device: stage s on device s."""
    check_count("num_devices", num_devices)
    return Placement(num_devices, (tuple(range(num_devices)),))


def interleaved(num_devices: int, chunks: int = CHUNKS) -> Placement:
    """``chunks`` stages per device, looped as in Megatron: stage s on device s mod p."""
    check_count("num_devices", num_devices)
    check_count("chunks", chunks)
    return Placement(num_devices, (tuple(s % num_devices for s in range(chunks * num_devices)),))


def vshape(num_devices: int, chunks: int = CHUNKS) -> Placement:
    """V-shape: device r holds stages r and 2p-1-r (zig-zag for more chunks)."""
    check_count("num_devices", num_devices)
    check_count("chunks", chunks)
    p = num_devices
    return Placement(p, (tuple(s % p if (s // p) % 2 == 0 else p - 1 - s % p for s in range(chunks * p)),))


def bidirectional(num_devices: int) -> Placement:
    """DualPipe: route 0 runs stages down the devices, route 1 up; p must be even."""
    check_count("num_devices", num_devices)
    if num_devices % 2:
        raise InputError(f"num_devices = {num_devices} must be even for the bidirectional placement")
    p = num_devices
    return Placement(p, (tuple(range(p)), tuple(range(p - 1, -1, -1))))


def make_placement(name: str, num_devices: int, chunks: int = CHUNKS) -> Placement:
    """Placement by name: one of ``PLACEMENTS``."""
    check_placement(name)
    if name == "sequential":
        return sequential(num_devices)
    if name == "interleaved":
        return interleaved(num_devices, chunks)
    if name == "vshape":
        return vshape(num_devices, chunks)
    return bidirectional(num_devices)


def placement_name(placement: Placement) -> tuple[str, int] | None:
    """(name, stages per device) of ``placement`` when it is one that ``make_placement`` builds (a looped one route
    with stage s on device s mod p is sequential or interleaved), else None."""
    p, chunks = placement.num_devices, placement.num_stages // placement.num_devices
    if len(placement.routes) == 2:
        return ("bidirectional", 2) if p % 2 == 0 and placement == bidirectional(p) else None
    if placement.num_stages % p == 0 and placement == interleaved(p, chunks):
        return ("sequential", 1) if chunks == 1 else ("interleaved", chunks)
    if placement.num_stages % p == 0 and chunks % 2 == 0 and placement == vshape(p, chunks):
        return "vshape", chunks
    return None
