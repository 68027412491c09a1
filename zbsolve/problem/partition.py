"""A model's partition into pipeline stages, and the per-stage ``Profile`` a partition gives: each stage's figure is
the exact sum of its layers'; every stage needs some F, B and W time (``untimed``: the rule, once)."""

from __future__ import annotations

import itertools
from collections.abc import Collection, Sequence
from typing import Any

from zbsolve.base.checks import check_count
from zbsolve.base.errors import InputError
from zbsolve.core.profile import Profile
from zbsolve.costmodel.constants import FSDP_LIVE_LAYERS, FSDP_PIPELINED
from zbsolve.costmodel.model import Layer, Model
from zbsolve.problem.recompute_costs import COSTS, HELD, stage_costs


def partition(model: Model, num_stages: int, spec: str | Sequence[int] = "uniform") -> list[tuple[int, int]]:
    """Half-open ranges of ``model.layers`` per stage, in stage order.

    ``spec`` is "uniform" (blocks dealt out evenly, the first stages taking one more when they do not divide;
    layers before the first block on the first stage, the final norm and head on the last), "balanced" (the split
    whose slowest stage is fastest: ``_balanced``), or the number of
    layers (entries of ``model.layers``, embedding and head included) of each stage, as a list or as text such as
    "5,4,4,4,4,4,4,6".
    """
    check_count("num_stages", num_stages)
    if isinstance(spec, str) and spec.strip() == "uniform":
        return _uniform(model, num_stages)
    if isinstance(spec, str) and spec.strip() == "balanced":
        return _balanced(model, num_stages)
    counts = _counts(spec)
    if len(counts) != num_stages:
        raise InputError(f"partition = {_shown(spec)}: {len(counts)} stages, but num_stages = {num_stages}")
    if sum(counts) != len(model.layers):
        raise InputError(f"partition = {_shown(spec)}: the counts sum to {sum(counts)}, but {model.name} has "
                         f"{len(model.layers)} layers")
    ends = [sum(counts[:s + 1]) for s in range(num_stages)]
    return check_ranges(model, list(zip([0] + ends[:-1], ends)))


def _counts(spec: str | Sequence[int]) -> list[int]:
    """Layer counts per stage from a list or from comma-separated text; each a positive integer."""
    if isinstance(spec, str):
        try:
            counts: list = [int(x) for x in spec.split(",")]
        except ValueError:
            raise InputError(f"partition = {spec!r}: should be 'uniform', 'balanced' or comma-separated layer counts "
                             "per stage, e.g. '5,4,4,6'") from None
    elif isinstance(spec, Sequence):
        counts = list(spec)
    else:
        raise InputError(f"partition = {spec!r}: should be 'uniform', 'balanced' or a list of layer counts per stage")
    for s, count in enumerate(counts):
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise InputError(f"partition = {_shown(spec)}: stage {s} has {count!r} layers; each stage needs a "
                             "whole number >= 1")
    return counts


def _shown(spec: str | Sequence[int]) -> str:
    return repr(spec if isinstance(spec, str) else list(spec))


def _uniform(model: Model, num_stages: int) -> list[tuple[int, int]]:
    """Blocks dealt out evenly; each stage after the first starts at its first block."""
    blocks = [i for i, layer in enumerate(model.layers) if layer.block]
    if len(blocks) < num_stages:
        raise InputError(f"partition = 'uniform': {model.name} has {len(blocks)} blocks, fewer than num_stages = "
                         f"{num_stages}; give layer counts per stage")
    per, extra = divmod(len(blocks), num_stages)
    firsts = [sum(per + (s < extra) for s in range(stage)) for stage in range(num_stages)]
    starts = [0] + [blocks[i] for i in firsts[1:]]
    return check_ranges(model, list(zip(starts, starts[1:] + [len(model.layers)])))


def _units(model: Model) -> list[tuple[int, int]]:
    """The ranges no stage boundary of a ``_balanced`` split falls inside: each block, and each run of the other
    layers (the embedding; MTP layers, norm and head), as Megatron's layout keeps them together."""
    units: list[tuple[int, int]] = []
    for i, layer in enumerate(model.layers):
        if units and not layer.block and not model.layers[i - 1].block:
            units[-1] = (units[-1][0], i + 1)
        else:
            units.append((i, i + 1))
    return units


def _stage_time(layers: Sequence[Layer]) -> float:
    """F + B + W of ``layers``: what a stage of them runs per microbatch."""
    return sum(layer.t_f + layer.t_b + layer.t_w for layer in layers)


def _packed(model: Model, units: Sequence[tuple[int, int]], limit: float) -> list[tuple[int, int]] | None:
    """Units packed into stages of at most ``limit`` seconds, each as long as it can be, each timed (``untimed``);
    None where a stage cannot stay within ``limit``. The fewest stages any split within ``limit`` has."""
    stages: list[tuple[int, int]] = []
    first = units[0][0]
    for a, b in units:
        if (a > first and _stage_time(model.layers[first:b]) > limit
                and untimed(model.layers[first:a]) is None):
            stages.append((first, a))
            first = a
        if _stage_time(model.layers[first:b]) > limit:
            return None
    if untimed(model.layers[first:]) is not None:
        return None
    return stages + [(first, len(model.layers))]


def _balanced(model: Model, num_stages: int) -> list[tuple[int, int]]:
    """The split into ``num_stages`` whose slowest stage (``_stage_time``) is fastest, boundaries only between
    ``_units``: the least limit some packing meets (``_packed``, tried over every sum of consecutive units), then the
    slowest stages split where their halves are most even until there are ``num_stages``."""
    units = _units(model)
    if len(units) < num_stages:
        raise InputError(f"partition = 'balanced': {model.name} has {len(units)} blocks and runs of other layers, "
                         f"fewer than num_stages = {num_stages}; give layer counts per stage")
    limits = sorted({_stage_time(model.layers[units[i][0]:units[j][1]])
                     for i in range(len(units)) for j in range(i, len(units))})
    low, high = 0, len(limits) - 1  # the whole model in one stage meets the last
    while low < high:
        middle = (low + high) // 2
        fit = _packed(model, units, limits[middle])
        low, high = (low, middle) if fit is not None and len(fit) <= num_stages else (middle + 1, high)
    stages = _packed(model, units, limits[low])
    assert stages is not None
    starts = {a for a, _ in units}
    while len(stages) < num_stages:
        cuts = [(max(_stage_time(model.layers[a:c]), _stage_time(model.layers[c:b])), s, c)
                for s, (a, b) in enumerate(stages) for c in range(a + 1, b)
                if c in starts and untimed(model.layers[a:c]) is None and untimed(model.layers[c:b]) is None]
        if not cuts:
            raise InputError(f"partition = 'balanced': {model.name}'s layers cannot make {num_stages} stages that "
                             "each have F, B and W time; give layer counts per stage")
        _, s, c = min(cuts, key=lambda cut: (-_stage_time(model.layers[slice(*stages[cut[1]])]), cut[0]))
        stages[s:s + 1] = [(stages[s][0], c), (c, stages[s][1])]
    return check_ranges(model, stages)


def check_ranges(model: Model, ranges: Sequence[Sequence[int]]) -> list[tuple[int, int]]:
    """``ranges`` as (first, end) tuples if they cover every layer of ``model`` once, in order, none empty; an
    ``InputError`` naming the stage at fault otherwise."""
    n = len(model.layers)
    out: list[tuple[int, int]] = []
    for s, pair in enumerate(ranges):
        if (not isinstance(pair, Sequence) or len(pair) != 2
                or not all(isinstance(x, int) and not isinstance(x, bool) for x in pair)):
            raise InputError(f"stage {s} = {pair!r}: should be a pair of layer indices [first, end)")
        first, end = pair
        expected = out[-1][1] if out else 0
        if first != expected:
            raise InputError(f"stage {s} = [{first}, {end}): should start at layer {expected} (every layer once, "
                             "in order)")
        if end <= first:
            raise InputError(f"stage {s} = [{first}, {end}) is empty; every stage needs at least one layer")
        if end > n:
            raise InputError(f"stage {s} = [{first}, {end}) ends past the last layer: {model.name} has {n} layers")
        out.append((first, end))
    if not out or out[-1][1] != n:
        covered = out[-1][1] if out else 0
        raise InputError(f"stages cover layers [0, {covered}), but {model.name} has {n} layers")
    return out


def stage_profile(model: Model, ranges: Sequence[Sequence[int]], recomputed: Collection[int] = (),
                  selective: Collection[int] = (), modules: Sequence[str] = ()) -> Profile:
    """The per-stage profile of ``model`` cut at ``ranges``: each stage's times (seconds) and memory deltas
    (bytes) are the sums of its layers' (``recompute_costs.stage_costs``: the layers in ``recomputed`` run their forward
    again inside their B, those in ``selective`` their norms and MLP activation function, the other blocks Megatron's
    ``modules``), and t_comm is the
    model's, or the link's time for the largest activation crossing a stage boundary."""
    ranges = check_ranges(model, ranges)
    for s, (a, b) in enumerate(ranges):
        missing = untimed(model.layers[a:b])
        if missing:
            raise InputError(f"stage {s} ({module_names(model, [(a, b)])}) has {missing} = 0: every stage needs "
                             "positive F, B and W times")
    stages = [stage_costs(model, a, b, recomputed, selective, modules) for a, b in ranges]
    holds = any(stage[name] for stage in stages for name in HELD)
    sums: dict[str, Any] = {name: [stage[name] for stage in stages]  # Profile's per-stage fields, by name
                            for name in COSTS if name not in HELD or holds}
    return Profile(**sums, t_comm=comm_time(model, ranges))


TIMES = ("t_f", "t_b", "t_w")
"""The pass times of a layer; every stage needs some of each."""


def untimed(layers: Sequence[Layer]) -> str | None:
    """The first pass time (t_f, t_b, t_w) that none of ``layers`` has, or None: a stage of them needs all three."""
    return next((name for name in TIMES if not any(getattr(layer, name) > 0 for layer in layers)), None)


def comm_time(model: Model, ranges: Sequence[Sequence[int]]) -> float:
    """Seconds to move an activation between stages: the model's t_comm, else the link's time for the largest
    out_bytes at a stage boundary, else 0."""
    if model.t_comm is not None:
        return model.t_comm
    ranges = check_ranges(model, ranges)
    if model.link is None or len(ranges) == 1:
        return 0.0
    return max(model.link.time(model.layers[b - 1].out_bytes) for _, b in ranges[:-1])


def timed(model: Model, counts: Sequence[int]) -> bool:
    """Whether every stage of the partition into ``counts`` layers has some F, B and W time."""
    ends = [0, *itertools.accumulate(counts)]
    return all(untimed(model.layers[a:b]) is None for a, b in zip(ends, ends[1:]))


STATIC_PARTS = ("weights", "gradients", "optimizer")
"""The parts of a device's static bytes (``held_static_parts``)."""


def held_static_bytes(layers: Sequence[Layer], pipelined: bool = False) -> int:
    """The static bytes of ``layers`` held together: the sum of their ``held_static_parts``."""
    return sum(held_static_parts(layers, pipelined).values())


def held_static_parts(layers: Sequence[Layer], pipelined: bool = False) -> dict[str, int]:
    """The static bytes of ``layers`` held together by ``STATIC_PARTS`` (a layer that does not split its own counts
    as weights), a weight two of them share counted once, and under FSDP the ``FSDP_LIVE_LAYERS`` largest of their
    ``gathered_bytes`` (weights and gradient); all of them on a ``pipelined`` device, whose runtime keeps a stage's
    parameters gathered from its forwards to its backwards and its gradients unsharded until the last microbatch
    (``FSDP_PIPELINED``)."""
    names = {layer.name for layer in layers}
    live = len(layers) if pipelined and FSDP_PIPELINED else FSDP_LIVE_LAYERS
    parts = dict.fromkeys(STATIC_PARTS, 0)
    for layer in layers:
        if layer.shares not in names:
            grads, states = layer.grad_bytes or 0, layer.optimizer_bytes or 0
            parts["weights"] += layer.static_bytes - grads - states
            parts["gradients"] += grads
            parts["optimizer"] += states
    for layer in sorted(layers, key=lambda layer: layer.gathered_bytes or 0, reverse=True)[:live]:
        parts["weights"] += (layer.gathered_bytes or 0) - (layer.gathered_grad_bytes or 0)
        parts["gradients"] += layer.gathered_grad_bytes or 0
    return parts


def module_names(model: Model, ranges: Sequence[Sequence[int]]) -> str:
    """The model's own names of the layers in the half-open ``ranges``, in order, each run of numbered modules as
    one (``tok_embeddings, layers.0-3``, ``layers.10-12``, ``layers.28-31, norm, output``): how a stage or a
    device is labelled wherever a user reads it."""
    runs: list[tuple[str, int, int] | str] = []
    for a, b in ranges:
        for layer in model.layers[a:b]:
            prefix, dot, index = layer.name.rpartition(".")
            last = runs[-1] if runs else None
            if not (dot and index.isdigit()):
                runs.append(layer.name)
            elif isinstance(last, tuple) and last[0] == prefix and last[2] == int(index) - 1:
                runs[-1] = (prefix, last[1], int(index))
            else:
                runs.append((prefix, int(index), int(index)))
    return ", ".join(run if isinstance(run, str) else f"{run[0]}.{run[1]}" + (f"-{run[2]}" if run[2] > run[1] else "")
                     for run in runs)
