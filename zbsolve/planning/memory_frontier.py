"""The step time against device memory (``plan --frontier``): the plan at each device memory, beside the best
baselines that fit there (without and with recomputation) and the Controllable-Memory building blocks (V-Half,
V-Min, and ZB-V) on the uniform V-shape split, without and with every block recomputed, each at the largest memory
a device needs for it.

A plan found for a smaller memory fits every larger one, so each point keeps the better of its own plan and the
one below it (``carried`` names where it came from): the curve never rises as memory grows."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from zbsolve.base.errors import InfeasibleError, ZbsolveError
from zbsolve.base.units import parse_bytes
from zbsolve.core.placement import vshape
from zbsolve.core.simulator import simulate
from zbsolve.costmodel.model import Model
from zbsolve.planning.planner import plan
from zbsolve.planning.result import PlanResult
from zbsolve.problem.costs import DEFAULT_RESERVE, model_costs
from zbsolve.problem.recompute import FULL, NONE
from zbsolve.schedulers.families import make_schedule

BLOCKS = ("v-min", "v-half", "zb-v")
"""The V-shape families drawn as points, least memory first."""


@dataclass(frozen=True)
class MemoryPoint:
    """The best step found at one device memory."""

    device_memory: int
    """Bytes per device."""
    step_time: float | None
    """Seconds of the plan's step (None: nothing fits)."""
    plan: str
    """The plan's placement, stages per device and recomputation, or why there is none."""
    carried: int | None
    """The smaller device memory whose plan this is (None: planned at this memory)."""
    baseline: float | None
    """The fastest baseline that fits without recomputation (None: none fits)."""
    baseline_recomputed: float | None
    """The fastest baseline that fits with recomputation."""
    recompute: str | None = None
    """What the plan recomputes (``PlanResult.recompute``: "none" for nothing; None: no plan)."""


@dataclass(frozen=True)
class BlockPoint:
    """A V-shape family on the uniform split: the most memory a device needs for it and its step."""

    name: str
    recompute: str
    memory: int
    """Bytes: the largest static bytes plus peak activations over devices, plus the reserve."""
    step_time: float


def parse_memories(text: str) -> list[int]:
    """Device memories from comma-separated sizes ("40GiB,48GiB"), in bytes, ascending and distinct."""
    return sorted({parse_bytes(part.strip(), "frontier") for part in text.split(",")})


def plan_frontier(model: Model, memories: Sequence[int], *, num_devices: int, num_microbatches: int,
                  time_limit: float, progress: Callable[[str], None] | None = None,
                  **options: Any) -> list[MemoryPoint]:
    """``plan`` at each of ``memories`` (bytes), ``time_limit`` shared equally, ``options`` as ``plan`` takes them;
    each point the better of its plan and the one below it. An interrupted plan is the last point."""
    points: list[MemoryPoint] = []
    for memory in memories:
        try:
            planned = plan(model, num_devices=num_devices, num_microbatches=num_microbatches, device_memory=memory,
                           time_limit=time_limit / len(memories), progress=progress, **options)
            result: PlanResult | None = planned
            shown = f"{planned.placement} x{planned.chunks}, recompute {planned.recompute}"
        except InfeasibleError as exc:
            result, shown = None, str(exc)
        below = points[-1] if points else None
        rows = [(b.recompute == "none", b.step_time) for b in (result.baselines if result else ())
                if b.fits and b.step_time is not None]
        best = {rc: min((t for plain, t in rows if plain == (rc == "none")), default=None)
                for rc in ("none", "recomputed")}
        step = result.step_time if result else None
        if below is not None and below.step_time is not None and (step is None or below.step_time < step):
            points.append(MemoryPoint(memory, below.step_time, below.plan, below.carried or below.device_memory,
                                      best["none"], best["recomputed"], below.recompute))
        else:
            points.append(MemoryPoint(memory, step, shown, None, best["none"], best["recomputed"],
                                      result.recompute if result else None))
        if result is not None and result.interrupted:  # the memories left are not planned
            break
    return points


def building_blocks(model: Model, num_devices: int, num_microbatches: int,
                    reserve: int = DEFAULT_RESERVE) -> list[BlockPoint]:
    """``BLOCKS`` on the uniform V-shape split, without and with every block recomputed (those that exist for
    these devices and microbatches), each at the device memory it needs with ``reserve`` bytes kept free."""
    points = []
    layout = vshape(num_devices)
    for recompute in (NONE, FULL):
        profile, costs = model_costs(model, layout, "uniform", None, 0, recompute)
        for name in BLOCKS:
            try:
                timeline = simulate(make_schedule(name, profile, num_devices, num_microbatches))
            except ZbsolveError:
                continue
            memory = max(costs.used(timeline.peak_memory)) + reserve
            points.append(BlockPoint(name, str(recompute), int(memory), timeline.makespan))
    return points
