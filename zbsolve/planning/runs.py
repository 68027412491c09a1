"""One built-in order run on one split: what the plan's baselines, the plan's own-order candidates and
``configure.predict`` all simulate."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from zbsolve.core.placement import make_placement
from zbsolve.core.simulator import Timeline, simulate
from zbsolve.core.transforms import unpaired, with_limit
from zbsolve.costmodel.model import Model
from zbsolve.problem.costs import DEFAULT_RESERVE, Costs, model_costs
from zbsolve.problem.recompute import Recompute
from zbsolve.schedulers.builtins import OVERLAPPED, builtin_placement, builtin_schedule


@dataclass(frozen=True)
class BaselineSetting:
    """What every baseline row of a plan shares: built once by ``plan`` and passed whole."""

    model: Model
    """The model whose layers the splits divide, and whose costs the rows are simulated on."""
    num_devices: int
    """Pipeline devices p."""
    num_microbatches: int
    """Microbatches m."""
    device_memory: int
    """Bytes per device."""
    reserve: int = DEFAULT_RESERVE
    """Bytes per device kept free of stages and activations."""
    layout: str | None = None
    """A Megatron ``--pipeline-model-parallel-layout`` run with Megatron's schedule (None: none)."""
    megatron_ends: tuple[int | None, int | None] = (None, None)
    """Megatron's layers of the first and the last pipeline rank; either given adds Megatron's uneven split."""
    overlap: bool = True
    """Whether the runtime overlaps an F&B pair's passes (the target's ``Target.pairs``); else a built-in's pairs
    (DualPipeV's) run their passes one after the other (``core.transforms.unpaired``)."""


def builtin_run(setting: BaselineSetting, name: str, chunks: int, counts: Sequence[int], recompute: Recompute,
                limited: bool = False) -> tuple[Timeline, Costs]:
    """torch's built-in ``name`` with ``chunks`` stages per device on the layer ``counts`` per stage, on the model's
    costs with ``recompute``, simulated (under the activation budgets where ``limited``: a schedule taken as the
    plan), its F&B pairs run one pass after the other where the setting's runtime does not overlap them (but those
    of ``OVERLAPPED``, whose pairs their own runtime overlaps); its timeline and costs. A ``ZbsolveError`` where
    it does not run."""
    p = setting.num_devices
    placement = make_placement(builtin_placement(name, chunks), p, chunks)
    profile, costs = model_costs(setting.model, placement, tuple(counts), setting.device_memory, setting.reserve,
                                 recompute)
    schedule = builtin_schedule(name, profile, p, setting.num_microbatches, chunks)
    schedule = schedule if setting.overlap or name in OVERLAPPED else unpaired(schedule)
    return simulate(with_limit(schedule, costs.limits()) if limited else schedule), costs
