"""What each runtime a plan is for can run (``plan --target``): which recomputation choices and placements the
search may use, so that no plan hands a runtime a decision it cannot express (docs/torch.md, the exports)."""

from __future__ import annotations

from zbsolve.base.errors import InputError
from zbsolve.problem.recompute import parse_recompute

TARGETS = ("zbsolve", "torchtitan", "megatron")
"""zbsolve's own executor runs any plan; torchtitan and Megatron as their exports say."""
AUTO = {"zbsolve": ("none", "full", "per-stage", "selective", "selective+per-stage"), "torchtitan": ("none", "full"),
        "megatron": ("none", "full", "uniform:1", "uniform:2")}
"""The recomputation choices ``recompute="auto"`` times every candidate with, per target."""
MODES = {"zbsolve": ("none", "full", "uniform", "per-stage"), "torchtitan": ("none", "full"),
         "megatron": ("none", "full", "uniform")}
"""The recomputation modes a target can run: torchtitan applies one activation_checkpoint policy (none or full)
to every block of every model part; Megatron one --recompute-num-layers N for every (virtual) stage. Selective
recomputation (norms and MLP activation function) only zbsolve's runtime runs: torchtitan's op-level policy
keeps other tensors, and Megatron's recompute modules have no dense MLP's activation function alone."""
SELECTIVE = ("zbsolve",)
"""The targets that run selective recomputation."""
PLACEMENTS = {"zbsolve": ("sequential", "interleaved", "vshape"), "torchtitan": ("sequential", "interleaved", "vshape"),
              "megatron": ("sequential", "interleaved")}
"""The placements a target can run: Megatron's layout puts stage i on rank i % p (no V-shape)."""


def check_target(target: str) -> str:
    """``target`` if it is one of ``TARGETS``; an ``InputError`` otherwise."""
    if target not in TARGETS:
        raise InputError(f"target = {target!r} is unknown; choose one of {', '.join(TARGETS)}")
    return target


def recompute_choices(target: str, recompute: str) -> tuple[str, ...]:
    """The recomputation choices a plan for ``target`` times each candidate with: ``AUTO[target]`` for "auto",
    else ``recompute`` itself when ``target`` can run it; an ``InputError`` naming why otherwise."""
    if recompute == "auto":
        return AUTO[check_target(target)]
    choice = parse_recompute(recompute)
    if choice.mode not in MODES[check_target(target)]:
        raise InputError(f"recompute = {recompute!r}: {target} runs only {', '.join(MODES[target])} (one setting "
                         f"for every stage); use --target zbsolve for per-stage choices")
    if choice.selective and target not in SELECTIVE:
        raise InputError(f"recompute = {recompute!r}: {target} cannot run zbsolve's selective recomputation (the "
                         "norms and MLP activation function of a block); use --target zbsolve")
    return (recompute,)


def runnable(target: str, placements: list[tuple[str, int]], placement: str) -> list[tuple[str, int]]:
    """The (placement, stages per device) of ``placements`` that ``target`` can run; an ``InputError`` when the
    placement asked for (not "auto") is not one of them."""
    kept = [(name, c) for name, c in placements if name in PLACEMENTS[target]]
    if not kept:
        raise InputError(f"placement = {placement!r}: {target} runs only {', '.join(PLACEMENTS[target])}")
    return kept


def may_take(target: str, recompute: str, chosen: str) -> bool:
    """Whether a plan asked for ``recompute`` may take a baseline that recomputes as ``chosen``: the same choice, or
    any ``target`` can run when the plan decides ("auto", or per-stage counts not given)."""
    if recompute == "auto" or parse_recompute(recompute).undecided:
        choice = parse_recompute(chosen)
        return choice.mode in MODES[target] and (target in SELECTIVE or not choice.selective)
    return chosen == str(parse_recompute(recompute))
