"""The configurations ``zbsolve configure`` searches, and what is known of each before it is timed.

A search enumerates every combination of the degrees' menus (``Space.menus``): tensor parallelism in powers of two
within a node, context parallelism in powers of two up to ``MAX_CP``, pipeline ranks among the divisors of the GPUs
up to the model's blocks, virtual stages with no more stages than blocks, expert parallelism among the divisors of
the routed experts (models with experts only), micro-batch sizes in powers of two, the optimizer shardings the
target runs (``Target.zero``) and the recomputation choices a plan for it times (``targets.recompute_choices``,
"auto", those that need no plan to decide them). What is refused is counted invalid, in the words of the rule that
refuses it: the degrees that do not divide (``predict.degrees``), megatron-core's rule that expert parallelism
spans the tp x cp x dp ranks of a pipeline stage, the estimate's own rules (heads over tp, the sequence over 2 cp,
experts over ep), the target's export of the setting, and its runtime row's placements, microbatches and layouts.

The menus are enumerated a shape (tp, cp, pp, ep) at a time (``shape_groups``, one job of the search), in groups
of configurations that differ only in virtual stages. Before timing, two things are known of a group and of each of
its configurations (``configure.bounds``): whether its devices can hold their static bytes and the
activations every order holds, and a lower bound on ``predict``'s step.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zbsolve.base.errors import InputError, ZbsolveError
from zbsolve.configure.bounds import (
    ModelAsOneStage,
    group_bound,
    group_fits,
    group_likely,
    group_need,
    order_fits,
    order_need,
    step_bound,
)
from zbsolve.configure.predict import Configuration, configured_model, degrees
from zbsolve.configure.runtime_rules import runtime_warnings
from zbsolve.core.placement import make_placement
from zbsolve.costmodel.hf_config import architecture
from zbsolve.costmodel.model import Model
from zbsolve.io.targets import TARGETS, check_target
from zbsolve.io.targets.torchtitan import TORCHTITAN, torchtitan_setting
from zbsolve.planning.targets import partition_refusal, recompute_choices, runnable
from zbsolve.problem.costs import model_costs
from zbsolve.problem.partition import partition
from zbsolve.problem.recompute import parse_recompute
from zbsolve.schedulers.builtins import COMBINED, builtin_placement, megatron_builtin

MAX_CP = 8
"""The largest context-parallel degree searched."""
SHAPE = ("tp", "cp", "pp", "ep")
"""The degrees of a shape: one enumeration job (``shape_groups``), its micro-batch sizes and ZeRO levels inside."""
SPLITS = ("uniform", "balanced")
"""The splits of the layers into stages each pipeline is timed with (``partition``): blocks dealt out evenly, and
the slowest stage fastest; the second only where it differs."""
ZERO_ORDER = (3, 1, 0)
"""ZeRO levels from the fewest static bytes a device holds to the most (``estimate``: ZeRO 3 shards the weights,
gradients and optimizer states over the replicas, ZeRO 1 the optimizer states, ZeRO 0 nothing); the activations are
the same at each."""


@dataclass(frozen=True)
class Space:
    """What every configuration of one search shares: the model, the cluster, the batch and the knobs not searched
    (its ``setup``), and the target."""

    setup: Configuration
    """The configuration the search starts from: its degrees and micro-batch size 1 (each searched)."""
    target: str = "megatron"
    """The runtime the configurations are for (``io.targets.TARGETS``)."""

    @classmethod
    def of(cls, config: str | Path, *, target: str = "megatron", **knobs: Any) -> Space:
        """The space of the model of ``config`` under ``knobs`` (``Setup``'s fields: gpus, global_batch, seq_len,
        gpu, dtype, ...) for ``target``, whose memory and calibration follow torchtitan's runtime for the torchtitan
        target (``Setup.runtime``)."""
        runtime = {"runtime": "torchtitan"} if target == "torchtitan" else {}
        return cls(Configuration(config=config, **{"microbatch_size": 1, **runtime, **knobs}), target)

    def configuration(self, microbatch_size: int = 1, **degrees: int | str) -> Configuration:
        """The configuration of ``microbatch_size`` and these ``degrees`` (``Configuration``'s fields by name) in
        this space."""
        return self.setup.model_copy(update={"microbatch_size": microbatch_size, **degrees})

    def menus(self) -> dict[str, tuple[int, ...]]:
        """Each degree's menu, by ``Configuration`` field, virtual stages apart (``vp_choices``)."""
        s = self.setup
        arch, node = architecture(s.config), s.device.gpus_per_node
        experts = arch.experts.routed if arch.experts else 1
        return {"tp": _powers(min(node, s.gpus)), "cp": _powers(min(MAX_CP, s.gpus)),
                "pp": tuple(p for p in _divisors(s.gpus) if p <= arch.layers),
                "ep": tuple(e for e in _divisors(experts) if e <= s.gpus),
                "microbatch_size": _powers(s.global_batch), "zero": check_target(self.target).zero}

    def blocks(self) -> int:
        """The model's transformer blocks."""
        return architecture(self.setup.config).layers


@dataclass(frozen=True)
class Group:
    """Configurations that differ only in virtual stages: one estimated model, one recomputation choice."""

    configuration: Configuration
    """Its degrees and recomputation, with one virtual stage."""
    dp: int
    """Data-parallel degree."""
    num_microbatches: int
    """Microbatches of a step on each pipeline."""
    vps: tuple[int, ...]
    """The virtual stages per pipeline rank searched (``vp_choices``)."""
    bound: float
    """Seconds no configuration of the group's steps beats (``group_bound``)."""
    likely: bool = True
    """A guess, for the order of timing alone: whether its configurations are likely to fit (``group_likely``)."""
    first: bool = False
    """Whether its configurations are recipe-shaped (``recipe_shaped``): timed before the long tail."""


@dataclass(frozen=True)
class Dropped:
    """Configurations refused, or pruned for memory, together, before any is assessed."""

    size: int
    """How many configurations."""
    why: str
    """The refusal, in one line."""
    memory: bool = False
    """Pruned for memory (``group_fits``), else invalid."""
    need: float = 0.0
    """Pruned for memory: the bytes a device needs at least by the bound that pruned them (``group_need``)."""


@dataclass(frozen=True)
class Assessed:
    """One configuration as known before it is timed."""

    configuration: Configuration
    """The configuration (its order in ``schedule`` where the target's own order is another than predict's)."""
    bound: float
    """Seconds ``predict``'s step of it never beats (``step_bound``)."""
    fits: bool
    """Whether its devices can hold their static bytes and the activations its own order holds (``order_fits``):
    where they cannot, ``predict`` says it does not fit."""
    likely: bool
    """Whether it is timed among the first (it fits by ``order_fits``)."""
    first: bool = False
    """Whether it is recipe-shaped (``recipe_shaped``): timed before the long tail."""
    warnings: tuple[str, ...] = ()
    """What the target's runtime warns of it, each with its rule's source (``runtime_rules``)."""
    need: float = 0.0
    """Where it does not fit by ``order_fits``: the bytes its busiest device needs by that bound (``order_need``)."""


def _powers(most: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to ``most``."""
    return tuple(2 ** k for k in range(max(most, 1).bit_length()))


def _divisors(n: int) -> tuple[int, ...]:
    """The divisors of ``n``, ascending."""
    return tuple(d for d in range(1, n + 1) if n % d == 0)


def recipe_shaped(c: Configuration) -> bool:
    """Whether ``c`` is shaped as the published recipes are, what a practitioner tries first: tensor parallelism
    within a node (every menu's), no context parallelism, one sequence a microbatch, the optimizer states sharded
    (ZeRO 1 or 3), no recomputation or the selective one; its pipeline split uniform or balanced (every split
    searched), its virtual stages any."""
    return c.cp == 1 and c.microbatch_size == 1 and c.zero in (1, 3) and c.recompute in ("none", "selective")


def vp_choices(pp: int, blocks: int) -> tuple[int, ...]:
    """Virtual stages per pipeline rank: 1 without a pipeline, else every count with no more stages than blocks."""
    return (1,) if pp == 1 else tuple(range(1, blocks // pp + 1))


def decided_choices(target: str, model: Model | None = None) -> tuple[str, ...]:
    """The recomputation choices a plan for ``target`` times (``recompute_choices``, "auto") that say which blocks
    recompute without a plan choosing them (per-stage counts are a plan's: the refine step's)."""
    return tuple(c for c in recompute_choices(target, "auto", model) if not parse_recompute(c).undecided)


def expert_refusal(c: Configuration, dp: int) -> str | None:
    """Why expert parallelism ``c.ep`` cannot span the ranks of a pipeline stage, or None: megatron-core's
    ``initialize_model_parallel`` needs expert-tensor x expert x pipeline parallel to divide the world size, experts
    whole (expert-tensor parallel 1), so ep must divide tp x cp x dp; torchtitan borrows them from the same ranks."""
    ranks = c.tp * c.cp * dp
    if ranks % c.ep:
        return f"ep = {c.ep}: should divide tp x cp x dp = {c.tp} x {c.cp} x {dp} = {ranks}, the ranks of a stage"
    return None


def shapes(space: Space) -> list[dict[str, int]]:
    """Every combination of the tp, cp, pp and ep menus, by ``Configuration`` field: what one enumeration job takes
    (``shape_groups``). Those that split the model over the most devices come first (the likeliest to fit, where
    the enumeration is cut short)."""
    menus = space.menus()
    every = [dict(zip(SHAPE, values)) for values in itertools.product(*(menus[name] for name in SHAPE))]
    return sorted(every, key=lambda shape: -math.prod(shape.values()))


def shape_size(space: Space, shape: dict[str, int]) -> int:
    """The configurations of ``shape``: its micro-batch sizes, ZeRO levels, virtual stages and recomputation
    choices (those of any model, ``decided_choices`` without one, as a refused shape's are counted)."""
    menus = space.menus()
    return (len(menus["microbatch_size"]) * len(menus["zero"]) * len(vp_choices(shape["pp"], space.blocks()))
            * len(decided_choices(space.target)))


def shape_refusal(space: Space, shape: dict[str, int]) -> str | None:
    """Why no configuration of ``shape`` is valid whatever its micro-batch size and ZeRO level, or None: degrees
    that do not divide even with one sequence a microbatch (``predict.degrees``), or expert parallelism that cannot
    span the ranks of a stage (``expert_refusal``)."""
    c = space.configuration(**shape)
    try:
        dp, _ = degrees(c)
    except InputError as exc:
        return str(exc)
    return expert_refusal(c, dp)


def groups(space: Space) -> Iterator[Group | Dropped]:
    """Every group of the space's menus, shape by shape (``shapes``): a ``Group`` where its degrees are valid and it
    may fit, else what is dropped and why."""
    for shape in shapes(space):
        refusal = shape_refusal(space, shape)
        yield from [Dropped(shape_size(space, shape), refusal)] if refusal is not None else shape_groups(space, shape)


def shape_groups(space: Space, shape: dict[str, int]) -> list[Group | Dropped]:
    """Every group of a valid ``shape`` (``shape_refusal``): one a micro-batch size, ZeRO level and recomputation
    choice, a ``Group`` where it is valid and may fit (``group_fits``), else what is dropped and why. One job of the
    search, run in a worker.

    Groups are pruned for memory without their model where smaller ones were: ``group_fits`` weighs the static bytes,
    which do not depend on the micro-batch size, and the activations every layer's F keeps under the choice, each
    the bytes of a token times the microbatch's tokens (sequence x micro-batch size / cp), rounded up per tensor:
    doubling the tokens (the next size of the menu) at least doubles each, less one byte, and what a recomputation
    subtracts (a module, the selective outputs) is such a product too, so no layer keeps less. ZeRO 3 holds no more
    static bytes than ZeRO 1, and ZeRO 1 no more than ZeRO 0 (``ZERO_ORDER``: the weights and gradients sharded,
    then the optimizer states), their activations equal. So once a choice is pruned at micro-batch size b, it is
    at every larger size, at this level and at those after it, which are enumerated in that order, sizes ascending;
    where every choice is, the model is not estimated (a model's choices are its architecture's and the target's,
    the same at every size and level: ``decided_choices``)."""
    menus, blocks, target = space.menus(), space.blocks(), space.target
    count = len(decided_choices(target))  # a refused group's choices, with the menu of any model
    pruned: dict[str, tuple[int, str, float]] = {}  # choice: the least micro-batch size pruned so far, why, the need
    choices: tuple[str, ...] = ()
    out: list[Group | Dropped] = []
    for zero in (z for z in ZERO_ORDER if z in menus["zero"]):
        for size in menus["microbatch_size"]:
            c = space.configuration(microbatch_size=size, zero=zero, **shape)
            vps = vp_choices(c.pp, blocks)
            try:
                dp, m = degrees(c)
                if choices and all(x in pruned and pruned[x][0] <= size for x in choices):
                    out.append(Dropped(len(vps) * len(choices), f"{pruned[choices[0]][1]}, and so at any larger "
                                       "micro-batch size or less sharded ZeRO", True,
                                       min(pruned[x][2] for x in choices)))
                    continue
                model = configured_model(c, dp)
                if target == TORCHTITAN.name:
                    torchtitan_setting(model.setting, m)
            except InputError as exc:
                out.append(Dropped(len(vps) * count, str(exc)))
                continue
            choices, whole = decided_choices(target, model), ModelAsOneStage(model)
            for choice in choices:
                chosen = c.model_copy(update={"recompute": choice})
                if choice in pruned and pruned[choice][0] <= size:
                    out.append(Dropped(len(vps), pruned[choice][1], True, pruned[choice][2]))
                    continue
                try:
                    short = group_fits(whole, chosen)
                except InputError as exc:
                    out.append(Dropped(len(vps), str(exc)))
                    continue
                if short is not None:
                    need = group_need(whole, chosen)  # those pruned after it, larger or less sharded, need more
                    pruned[choice] = size, f"{short} (micro-batch size {size}, ZeRO {zero})", need  # none smaller
                    out.append(Dropped(len(vps), short, True, need))
                    continue
                recompute = parse_recompute(choice)
                paired = any(TARGETS[target].schedule_of(model, c.pp, vp, recompute) == COMBINED for vp in vps)
                out.append(Group(chosen, dp, m, vps, group_bound(whole, m, c.pp, recompute, paired),
                                 group_likely(whole, chosen, m), recipe_shaped(chosen)))
    return out


def assess(space: Space, group: Group) -> list[Assessed | Dropped]:
    """Every configuration of ``group``, one a virtual-stage count and split (``SPLITS``): an ``Assessed`` where the
    target runs it and its rules (``runtime_rules``) do not refuse it, else why not. The order ``predict`` times it with
    is the target's own where it has one (Megatron's combined 1F1B, ``Target.schedule_of``). Run in a worker: the model
    is estimated again there."""
    base = group.configuration
    model, recompute = configured_model(base, group.dp), parse_recompute(base.recompute)
    out: list[Assessed | Dropped] = []
    for vp, split in itertools.product(group.vps, SPLITS):
        own = TARGETS[space.target].schedule_of(model, base.pp, vp, recompute)
        c = base.model_copy(update={"vp": vp, "schedule": COMBINED if own == COMBINED else None, "partition": split})
        name = c.schedule or megatron_builtin(vp)
        layout = builtin_placement(name, vp)
        placement = make_placement(layout, base.pp, vp)
        try:
            if base.pp > 1:  # the row's pipeline rules: no pipeline, none apply
                runnable(space.target, model, [(layout, vp)], layout, base.pp, group.num_microbatches)
            ranges = partition(model, placement.num_stages, split)
            if split != SPLITS[0] and ranges == partition(model, placement.num_stages, SPLITS[0]):
                continue  # the same configuration as the uniform split
            counts = tuple(b - a for a, b in ranges)
            profile, costs = model_costs(model, placement, counts, c.memory, c.kept, recompute)
            refusal = partition_refusal(space.target, model, counts, base.pp)
            if refusal is not None:
                raise InputError(refusal)
            warnings = runtime_warnings(space.target, c)
            fits = order_fits(profile, costs, name, base.pp, group.num_microbatches, vp)
            need = 0.0 if fits else order_need(profile, costs, name, base.pp, group.num_microbatches, vp)
        except ZbsolveError as exc:
            out.append(Dropped(1, str(exc)))
            continue
        out.append(Assessed(c, step_bound(profile, placement, group.num_microbatches, name == COMBINED), fits,
                            fits, group.first, warnings, need))
    return out


