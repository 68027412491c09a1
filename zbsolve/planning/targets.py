"""What a plan for a runtime may choose (``plan --target``), read from the target table (``io.targets.TARGETS``):
the recomputation choices and the placements the search may use, so that no plan hands a runtime a decision it
cannot run, and no export of such a plan is refused."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

from zbsolve.base.errors import InputError
from zbsolve.costmodel.model import Model
from zbsolve.io.targets import check_target
from zbsolve.io.targets.megatron.layout import megatron_layout
from zbsolve.problem.recompute import OP, parse_recompute


def recompute_choices(target: str, recompute: str, model: Model | None = None) -> tuple[str, ...]:
    """The recomputation choices a plan for ``target`` (of ``model``, where given) times each candidate with: the
    row's ``auto_recompute`` for "auto" (without the selective ones where the row cannot recompute ``model``'s expert
    blocks selectively, and the module choices only where ``model``'s blocks have their figures and each module
    saves bytes in some block: ``saving_modules``), else ``recompute`` itself when ``target`` can run it; an
    ``InputError`` naming the row otherwise."""
    row = check_target(target)
    experts = _selective_refusal(target, model)
    if recompute == "auto":
        saving = saving_modules(model)
        return tuple(c for c in row.auto_recompute if (experts is None or not parse_recompute(c).selective)
                     and set(parse_recompute(c).modules) <= saving)
    choice = parse_recompute(recompute)
    if choice.modules:
        refused_modules = row.modules_refusal(choice.modules)
        if refused_modules is not None:
            other = "torchtitan" if choice == OP else "megatron"
            raise InputError(f"recompute = {recompute!r}: {refused_modules}; use --target {other}")
        return (recompute,)
    if choice.mode not in row.recompute:
        raise InputError(f"recompute = {recompute!r}: {target} runs only {', '.join(row.recompute)} (one setting "
                         f"for every stage; runtime table: {target}.recompute); use --target zbsolve for per-stage "
                         "choices")
    if choice.selective and not row.selective:
        raise InputError(f"recompute = {recompute!r}: {target} cannot run zbsolve's selective recomputation (the "
                         f"norms and MLP activation function of a block; runtime table: {target}.selective); use "
                         "--target zbsolve")
    if choice.selective and experts is not None:
        raise InputError(f"recompute = {recompute!r}: {experts}")
    return (recompute,)


def saving_modules(model: Model | None) -> set[str]:
    """The Megatron-LM modules whose recomputation saves bytes in some block of ``model`` (none without a model, or
    where a block has no figures: ``Layer.recompute_modules``)."""
    figures = [] if model is None else [layer.recompute_modules for layer in model.layers if layer.block]
    known = [costs for costs in figures if costs is not None]
    if not known or len(known) < len(figures):
        return set()
    return {name for costs in known for name, cost in costs.items() if cost.mem > 0}


def expert_blocks(model: Model) -> list[str]:
    """The names of ``model``'s blocks with experts (``Layer.experts``)."""
    return [layer.name for layer in model.layers if layer.block and layer.experts]


def _selective_refusal(target: str, model: Model | None) -> str | None:
    """Why ``target``'s row cannot recompute ``model``'s blocks selectively, for its expert blocks, or None."""
    return None if model is None else check_target(target).selective_refusal(expert_blocks(model))


def runnable(target: str, model: Model, placements: list[tuple[str, int]], placement: str, num_devices: int,
             num_microbatches: int, note: Callable[[str], None] | None = None) -> list[tuple[str, int]]:
    """The (placement, stages per device) of ``placements`` that ``target``'s row runs with ``num_microbatches``
    on ``num_devices`` for ``model``, ``note`` hearing one line for each one dropped; an ``InputError`` naming the
    row when none is left, or when the model holds layers the row refuses."""
    row = check_target(target)
    mtp = row.mtp_refusal(model.mtp_layers)
    if mtp is not None:
        raise InputError(f"target = {target!r}: {mtp}")
    refusals = {(name, c): row.placement_refusal(name, c) or row.microbatch_refusal(name, num_devices,
                                                                                    num_microbatches)
                for name, c in placements}
    kept = [option for option, why in refusals.items() if why is None]
    for (name, c), why in refusals.items():
        if why is not None and kept and note is not None:
            note(f"{name} x{c}: not searched for --target {target}: {why}")
    if not kept:
        raise InputError(f"placement = {placement!r}: {next(iter(refusals.values()))}")
    return kept


def partition_refusal(target: str, model: Model, counts: Sequence[int], num_devices: int) -> str | None:
    """Why ``target``'s row cannot take the partition of ``model`` with ``counts`` layers per stage placed looped over
    ``num_devices``, or None."""
    if not check_target(target).layout_only:
        return None
    ends = list(itertools.accumulate(counts, initial=0))
    try:
        megatron_layout(model, list(zip(ends, ends[1:])), num_devices)
    except InputError as exc:
        return f"{exc} (runtime table: {target}.layout_only)"
    return None


def may_take(target: str, recompute: str, chosen: str, model: Model | None = None) -> bool:
    """Whether a plan asked for ``recompute`` (of ``model``, where given) may take a baseline that recomputes as
    ``chosen``: the same choice, or any ``target`` can run when the plan decides ("auto", or per-stage counts not
    given), selective only where the row recomputes the model's blocks so, modules only where it recomputes them."""
    if recompute == "auto" or parse_recompute(recompute).undecided:
        choice = parse_recompute(chosen)
        row = check_target(target)
        return (choice.mode in row.recompute and row.modules_refusal(choice.modules) is None
                and (not choice.selective or (row.selective and _selective_refusal(target, model) is None)))
    return chosen == str(parse_recompute(recompute))
