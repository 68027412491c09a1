"""What the split bound's memory terms read of a plan's model (``planning.memory_bound``): per layer, the ways a
plan may run it (each recomputation it may choose), each as the bytes a microbatch holds at least and its B's
seconds, alone and at the least in an overlapped pair; and the bytes a device has for static bytes and
activations."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import NamedTuple

from zbsolve.costmodel.model import Model
from zbsolve.io.targets import check_target
from zbsolve.optimize.bound_terms import least_in_pair
from zbsolve.problem.recompute import parse_recompute
from zbsolve.problem.recompute_costs import layer_costs


class RecomputeOption(NamedTuple):
    """One way a layer may run, as the memory terms read it."""

    hold: float
    """Bytes a microbatch holds from its F's start to its W's end, at least."""
    t_b: float
    """Seconds of its B run alone."""
    least_b: float
    """Seconds of its B at the least it lasts in an overlapped pair."""


@dataclass(frozen=True)
class MemoryTerms:
    """What the memory terms read besides the model and the placement."""

    usable_bytes: int
    """Bytes of a device for static bytes and activations: device memory - reserve."""
    options: tuple[tuple[RecomputeOption, ...], ...]
    """Per layer, the ways a plan may run it (``memory_terms``)."""


_Kind = tuple[bool, bool, tuple[str, ...]]
"""A recomputation of a block as ``layer_costs`` takes it: (whole, selective, Megatron modules)."""


def memory_terms(model: Model, recompute: str, target: str, usable_bytes: int) -> MemoryTerms | None:
    """The memory terms' reading of a plan of ``model`` asked for ``recompute`` for ``target`` with ``usable_bytes``
    a device: each block's options are those of the choice asked for (whole and not where it recomputes some
    blocks), or, where the plan decides ("auto", per-stage counts not given), every one its runtime's row may take
    (none, whole, selective, any of the row's Megatron modules: ``targets.may_take``). None where some option would
    keep fewer than no bytes (the terms need every microbatch to hold something)."""
    kinds = _recompute_kinds(recompute, target)
    options = []
    for i, layer in enumerate(model.layers):
        found = []
        for whole, selective, modules in kinds if layer.block else [(False, False, ())]:
            if selective and layer.t_sel is None or modules and not layer.recompute_modules:
                continue
            c = layer_costs(model, i, whole, selective, modules)
            if c["mem_f"] < 0:
                return None
            found.append(RecomputeOption(min(c["mem_f"], -c["mem_w"]), c["t_b"], least_in_pair(c["t_b"], c["comm_b"])))
        options.append(_pareto(found))
    return MemoryTerms(usable_bytes, tuple(options))


def _recompute_kinds(recompute: str, target: str) -> list[_Kind]:
    """The recomputations a block may take under ``recompute`` for ``target`` (``memory_terms``)."""
    row = check_target(target)
    choice = None if recompute == "auto" else parse_recompute(recompute)
    if choice is not None and not choice.undecided:
        base = (False, choice.selective, choice.modules)
        return ([base] if choice.mode in ("none",) else [(True, False, ())] if choice.mode == "full"
                else [base, (True, False, ())])
    kinds: list[_Kind] = [(False, False, ())]
    kinds += [(True, False, ())] if {"full", "uniform", "per-stage"} & set(row.recompute) else []
    kinds += [(False, True, ())] if row.selective else []
    kinds += [(False, False, tuple(c)) for n in range(1, len(row.modules) + 1)
              for c in itertools.combinations(row.modules, n)]
    return kinds


def _pareto(options: list[RecomputeOption]) -> tuple[RecomputeOption, ...]:
    """``options`` less those another matches or beats in every figure."""
    kept: list[RecomputeOption] = []
    for o in sorted(set(options)):
        if not any(k.hold <= o.hold and k.t_b <= o.t_b and k.least_b <= o.least_b for k in kept):
            kept.append(o)
    return tuple(kept)
