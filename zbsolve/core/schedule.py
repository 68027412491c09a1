"""Schedule: per device, an ordered list of passes.

A pass is F, B, W or BW (fused full backward) of (microbatch, stage); ``Pass`` prints as
``{stage}{kind}{mb}`` (``0F3``, ``2BW1``) and ``Pass.from_str`` is its exact inverse. An
overlapped F&B pair (DualPipe) prints as ``{f}&{b}``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple, Sequence, Union

from zbsolve.base.checks import check_count, check_limit
from zbsolve.base.errors import InputError
from zbsolve.core.placement import Placement
from zbsolve.core.profile import Profile


class Kind(StrEnum):
    """What a pass computes; each member equals its one- or two-letter name."""

    F = "F"
    """Forward."""
    B = "B"
    """Gradient of the input (the backward's first half)."""
    W = "W"
    """Gradient of the weights (the backward's second half)."""
    BW = "BW"
    """The whole backward, B and W fused."""


F, B, W, BW = Kind.F, Kind.B, Kind.W, Kind.BW
KINDS = tuple(Kind)
BACKWARD = (B, BW)

_PASS_RE = re.compile(r"^(\d+)(BW|F|B|W)(\d+)$")


class Pass(NamedTuple):
    """One pass: ``kind`` of microbatch ``mb`` on model stage ``stage``."""

    kind: Kind
    """F, B, W or BW."""
    mb: int
    """Microbatch index."""
    stage: int
    """Model stage index."""

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.mb}"

    @staticmethod
    def from_str(text: str) -> "Pass":
        """Parse ``{stage}{kind}{mb}``, the inverse of ``str``."""
        match = _PASS_RE.match(text.strip())
        if match is None:
            raise InputError(f"pass {text!r} is not of the form <stage><F|B|W|BW><microbatch>")
        return Pass(Kind(match[2]), int(match[3]), int(match[1]))


class Pair(NamedTuple):
    """An overlapped F&B pair: forward ``f`` and backward ``b`` (B or BW) run together."""

    f: Pass
    """The forward pass."""
    b: Pass
    """The backward pass (kind B or BW)."""

    def __str__(self) -> str:
        return f"{self.f}&{self.b}"

    @staticmethod
    def from_str(text: str) -> "Pair":
        """Parse ``{f}&{b}``, the inverse of ``str``."""
        f, _, b = text.partition("&")
        return Pair(Pass.from_str(f), Pass.from_str(b))


Op = Union[Pass, Pair]


def passes_of(op: Op) -> tuple[Pass, ...]:
    """The passes an op runs: one, or two for an F&B pair."""
    return (op.f, op.b) if isinstance(op, Pair) else (op,)


@dataclass(frozen=True)
class Schedule:
    """A pipeline schedule: the problem it solves and each device's ordered ops."""

    name: str
    """Family or solver that produced it (e.g. "zb-h1")."""
    placement: Placement
    """Which device runs each stage, per route."""
    num_microbatches: int
    """Number of microbatches m."""
    profile: Profile
    """Costs, expanded to one value per stage."""
    devices: tuple[tuple[Op, ...], ...]
    """devices[d]: the ops device d runs, in order."""
    mem_limit: float | tuple[float, ...] | None = None
    """Activation memory limit: one number, one per device, or None for none."""
    microbatch_route: tuple[int, ...] = field(default=())
    """Route of each microbatch; empty means all on route 0."""

    def __post_init__(self) -> None:
        p, m = self.placement.num_devices, check_count("num_microbatches", self.num_microbatches)
        if len(self.devices) != p:
            raise InputError(f"devices has {len(self.devices)} lists, but num_devices = {p}")
        if self.profile.num_stages != self.placement.num_stages:
            object.__setattr__(self, "profile", self.profile.expand(self.placement.num_stages))
        if not self.microbatch_route:
            object.__setattr__(self, "microbatch_route", (0,) * m)
        if len(self.microbatch_route) != m:
            raise InputError(f"microbatch_route has {len(self.microbatch_route)} entries, but num_microbatches = {m}")
        for i, r in enumerate(self.microbatch_route):
            if not 0 <= r < len(self.placement.routes):
                raise InputError(f"microbatch_route[{i}] = {r} is not a route index "
                                 f"(0..{len(self.placement.routes) - 1})")
        object.__setattr__(self, "mem_limit", check_limit(self.mem_limit, p))

    @property
    def num_devices(self) -> int:
        """Number of devices p."""
        return self.placement.num_devices

    @property
    def num_stages(self) -> int:
        """Number of model stages S."""
        return self.placement.num_stages

    def device_of(self, p: Pass) -> int:
        """Device that must run pass ``p`` per the placement."""
        return self.placement.device(self.microbatch_route[p.mb], p.stage)

    def limit_of(self, device: int) -> float | None:
        """Memory limit of ``device`` (None: unlimited)."""
        if self.mem_limit is None or isinstance(self.mem_limit, (int, float)):
            return self.mem_limit
        return self.mem_limit[device]

    def duration(self, op: Op) -> float:
        """Duration of an op; an F&B pair's by the overlap rule (``core.overlap``)."""
        if isinstance(op, Pair):
            return self.profile.pair_time(op.f.stage, op.b.kind, op.b.stage)
        return self.profile.time(op.kind, op.stage)

    def memory_delta(self, p: Pass) -> float:
        """Memory change of a pass (F allocates, B and W free)."""
        return self.profile.delta(p.kind, p.stage)

    def __str__(self) -> str:
        return "\n".join(f"device {d}: " + " ".join(map(str, ops)) for d, ops in enumerate(self.devices))


def build(name: str, placement: Placement, num_microbatches: int, profile: Profile,
          devices: Sequence[Sequence[Op]], mem_limit: float | Sequence[float] | None = None,
          microbatch_route: Sequence[int] = ()) -> Schedule:
    """Make a Schedule from plain sequences."""
    return Schedule(name, placement, num_microbatches, profile, tuple(tuple(ops) for ops in devices),
                    check_limit(mem_limit), tuple(microbatch_route))


def pair_count(schedule: Schedule) -> int:
    """How many ops of ``schedule`` are overlapped F&B pairs."""
    return sum(op.__class__ is Pair for ops in schedule.devices for op in ops)
