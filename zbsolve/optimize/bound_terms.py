"""The terms lower bounds share: the stages each device runs, the most an overlapped F&B pair saves and the least a
pass lasts inside one (``core.overlap``), the cheapest move of an activation between stages, and, for the bounds
CP-SAT minimises over partitions (``planning.split_bound``, ``planning.memory_bound``), the scale of their integer
units and the stage boundaries as variables. ``optimize.bound`` (one schedule's formulation), the split bounds and
``configure.bounds`` (a configuration before it is timed) read them from here."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from ortools.sat.python import cp_model

from zbsolve.core.overlap import OVERLAP_SAVING, OVERLAP_SLOWDOWN, most_saved
from zbsolve.core.placement import Placement
from zbsolve.costmodel.model import Model
from zbsolve.problem.partition import TIMES, comm_time

RESOLUTION = 10**9
"""A partition model's largest step is scaled to about this many integer units."""


def route_stages(route: Sequence[int], num_devices: int) -> list[list[int]]:
    """Per device, the stages ``route`` places on it, in order."""
    return [[s for s, d in enumerate(route) if d == device] for device in range(num_devices)]


def device_stages(placement: Placement) -> list[list[int]]:
    """Per device, the stages any of ``placement``'s routes places on it, in order."""
    return [sorted({s for route in placement.routes for s, d in enumerate(route) if d == device})
            for device in range(placement.num_devices)]


def pair_saving(compute: float, comm: float, saving: float = OVERLAP_SAVING,
                slowdown: float = OVERLAP_SLOWDOWN) -> float:
    """The most an overlapped F&B pair saves of passes computing ``compute`` and communicating ``comm`` seconds
    (``core.overlap.most_saved``; by default with the overlap a model's stage profiles carry)."""
    return most_saved(compute, comm, saving, slowdown)


def least_in_pair(seconds: float, comm: float) -> float:
    """The least a pass of ``seconds`` (``comm`` of them communication) lasts inside an overlapped pair: a pair lasts
    at least its two passes less ``pair_saving`` of them, and that saving is the sum of each pass's own."""
    return seconds - pair_saving(seconds - comm, comm)


def least_hop(model: Model) -> float:
    """Seconds of the cheapest move of an activation between stages, whatever the partition."""
    if model.t_comm is not None or model.link is None:
        return comm_time(model, [(0, len(model.layers))])
    return min(model.link.time(layer.out_bytes) for layer in model.layers[:-1]) if len(model.layers) > 1 else 0.0


def stage_boundaries(cp: cp_model.CpModel, model: Model, num_stages: int) -> list:
    """Stage boundaries as variables of ``cp`` (0 and the layer count fixed at the ends), each stage at least one
    layer with some F, B and W time."""
    L, S = len(model.layers), num_stages
    bounds = [cp.new_constant(0)] + [cp.new_int_var(s, L - S + s, f"b{s}") for s in range(1, S)] \
        + [cp.new_constant(L)]
    for s in range(S):
        cp.add(bounds[s + 1] >= bounds[s] + 1)
    for name in TIMES:  # how many layers before each index have a positive time: every stage needs one
        counts = list(itertools.accumulate((getattr(layer, name) > 0 for layer in model.layers), initial=0))
        at = [cp.new_int_var(0, counts[-1], "") for _ in range(S + 1)]
        for s in range(S + 1):
            cp.add_element(bounds[s], counts, at[s])
        for s in range(S):
            cp.add(at[s + 1] >= at[s] + 1)
    return bounds
