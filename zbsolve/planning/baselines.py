"""The baselines a plan is measured against: each of torch's built-in schedules on each baseline split (uniform,
torchtitan's, Megatron's), and on the uniform and torchtitan splits with every block recomputed (torchtitan's
activation checkpointing), simulated on the plan's own costs."""

from __future__ import annotations

from zbsolve.base.errors import InputError, ZbsolveError
from zbsolve.base.units import gib
from zbsolve.core.placement import make_placement
from zbsolve.core.simulator import Timeline, simulate
from zbsolve.core.transforms import with_limit
from zbsolve.planning.result import Baseline
from zbsolve.problem.costs import DEFAULT_RESERVE, Costs, model_costs
from zbsolve.problem.model import Model
from zbsolve.problem.partition import partition
from zbsolve.problem.recompute import FULL, NONE, parse_recompute
from zbsolve.problem.splits import megatron_split, torchtitan_split
from zbsolve.schedulers.builtins import BUILTINS, builtin_schedule

SPLITS = ("uniform", "torchtitan", "megatron")
"""The splits of the baselines: equal blocks per stage, torchtitan's default, Megatron's with the embedding and
the loss counted as layers."""
RECOMPUTED = (("uniform", FULL), ("torchtitan", FULL))
"""The splits also run with recomputation, and how: what a torchtitan user gets by turning it on."""


def split_ranges(split: str, model: Model, num_stages: int) -> list[tuple[int, int]]:
    """The layer ranges per stage of a baseline split; an ``InputError`` where the split does not exist."""
    if split == "uniform":
        return partition(model, num_stages)
    if split == "torchtitan":
        return torchtitan_split(model, num_stages)
    return megatron_split(model, num_stages)


def baselines(model: Model, num_devices: int, num_microbatches: int, device_memory: int,
              reserve: int = DEFAULT_RESERVE) -> list[Baseline]:
    """Every built-in torch schedule on every baseline split, without recomputation and as ``RECOMPUTED`` says,
    simulated on the model's costs."""
    settings = [(split, NONE) for split in SPLITS] + list(RECOMPUTED)
    rows = []
    for split, recompute in settings:
        for name, builtin in BUILTINS.items():
            layout = make_placement(builtin.placement, num_devices, builtin.chunks)
            shown = str(recompute)
            try:
                counts = tuple(b - a for a, b in split_ranges(split, model, layout.num_stages))
            except InputError as exc:
                rows.append(Baseline(split, name, None, None, None, None, False, str(exc), shown))
                continue
            try:
                profile, costs = model_costs(model, layout, counts, device_memory, reserve, recompute)
                timeline = simulate(builtin_schedule(name, profile, num_devices, num_microbatches))
            except ZbsolveError as exc:
                rows.append(Baseline(split, name, counts, None, None, None, False, str(exc), shown))
                continue
            used = tuple(gib(s + a) for s, a in zip(costs.static_bytes, timeline.peak_memory))
            rows.append(Baseline(split, name, counts, timeline.makespan, timeline.bubble_rate, used,
                                 costs.first_over(timeline.peak_memory) is None, "", shown))
    return rows


def baseline_plan(model: Model, num_devices: int, num_microbatches: int, device_memory: int, reserve: int,
                  top: Baseline) -> tuple[Timeline, Costs, tuple[str, int]]:
    """A baseline taken as the plan: its schedule under the activation budgets, re-simulated; its costs, placement
    and stages per device."""
    name, c = BUILTINS[top.schedule].placement, BUILTINS[top.schedule].chunks
    assert top.counts is not None  # a baseline that fits has a split
    profile, costs = model_costs(model, make_placement(name, num_devices, c), top.counts, device_memory, reserve,
                                 parse_recompute(top.recompute))
    schedule = with_limit(builtin_schedule(top.schedule, profile, num_devices, num_microbatches), costs.limits())
    return simulate(schedule), costs, (name, c)
