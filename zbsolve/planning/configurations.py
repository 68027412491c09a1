"""The configurations ``zbsolve configure`` searches, and what is known of each before it is timed.

A search enumerates every combination of the degrees' menus (``Space.menus``): tensor parallelism in powers of two
within a node, context parallelism in powers of two up to ``MAX_CP``, pipeline ranks among the divisors of the GPUs
up to the model's blocks, virtual stages with no more stages than blocks, expert parallelism among the divisors of
the routed experts (models with experts only), micro-batch sizes in powers of two, the optimizer shardings the
target runs (``Runtime.zero``) and the recomputation choices a plan for it times (``targets.recompute_choices``,
"auto", those that need no plan to decide them). What is refused is counted invalid, in the words of the rule that
refuses it: the degrees that do not divide (``predict.degrees``), megatron-core's rule that expert parallelism
spans the tp x cp x dp ranks of a pipeline stage, the estimate's own rules (heads over tp, the sequence over 2 cp,
experts over ep), the target's export of the setting, and its runtime row's placements, microbatches and layouts.

Before timing, two things are known of a configuration, both from ``predict``'s own model, split and order: whether
its devices can hold their static bytes and the activations every order holds (``memory_fits``: else no order
fits, and ``predict`` says so), and a lower bound on ``predict``'s step (``step_bound``). A group of
configurations that differ only in virtual stages and recomputation has a bound of its own (``group_bound``), no
more than any of theirs.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from zbsolve.base.errors import InputError, ZbsolveError
from zbsolve.core.overlap import most_saved
from zbsolve.core.placement import Placement, make_placement
from zbsolve.core.profile import Profile
from zbsolve.io.exports import RUNTIMES, TORCHTITAN, check_target, torchtitan_setting
from zbsolve.planning.predict import Configuration, configured_model, degrees
from zbsolve.planning.targets import partition_refusal, recompute_choices, runnable
from zbsolve.problem.costs import DEFAULT_RESERVE, Costs, model_costs
from zbsolve.problem.estimate.gpus import get_gpu
from zbsolve.problem.estimate.hf_config import architecture
from zbsolve.problem.model import Model
from zbsolve.problem.partition import stage_profile
from zbsolve.problem.recompute import Recompute, parse_recompute
from zbsolve.problem.recompute_costs import layer_costs
from zbsolve.schedulers.builtins import COMBINED, builtin_placement, megatron_builtin

MAX_CP = 8
"""The largest context-parallel degree searched."""


@dataclass(frozen=True)
class Space:
    """What every configuration of one search shares: the model, the cluster, the batch and the target."""

    config: str | Path
    """The model's Hugging Face config.json."""
    gpus: int
    """GPUs of the run."""
    global_batch: int
    """Sequences per step over every replica."""
    seq_len: int
    """Tokens per sequence."""
    gpu: str = "h100"
    """The GPU preset."""
    dtype: str = "bf16"
    """Type of the matrix products."""
    target: str = "megatron"
    """The runtime the configurations are for (``io.exports.RUNTIMES``)."""
    tp_comm_overlap: bool = False
    """Whether tensor-parallel collectives overlap the products beside them."""
    dispatcher: str = "alltoall"
    """How the expert all-to-all sends a token."""
    device_memory: int | None = None
    """Bytes per device (None: the GPU preset's)."""
    reserve: int = DEFAULT_RESERVE
    """Bytes per device kept free of stages and activations."""

    def configuration(self, microbatch_size: int = 1, **degrees: int | str) -> Configuration:
        """The configuration of ``microbatch_size`` and these ``degrees`` (``Configuration``'s fields by name) in
        this space."""
        return Configuration(self.config, self.gpu, self.dtype, self.seq_len, microbatch_size, self.global_batch,
                             self.gpus, device_memory=self.device_memory, reserve=self.reserve,
                             tp_comm_overlap=self.tp_comm_overlap, dispatcher=self.dispatcher,
                             **degrees)  # type: ignore[arg-type]

    def menus(self) -> dict[str, tuple[int, ...]]:
        """Each degree's menu, by ``Configuration`` field, virtual stages apart (``vp_choices``)."""
        arch, node = architecture(self.config), get_gpu(self.gpu).gpus_per_node
        experts = arch.experts.routed if arch.experts else 1
        return {"tp": _powers(min(node, self.gpus)), "cp": _powers(min(MAX_CP, self.gpus)),
                "pp": tuple(p for p in _divisors(self.gpus) if p <= arch.layers),
                "ep": tuple(e for e in _divisors(experts) if e <= self.gpus),
                "microbatch_size": _powers(self.global_batch), "zero": check_target(self.target).zero}

    def memory(self) -> int:
        """Bytes per device: the space's, else its GPU preset's (as ``predict`` takes them)."""
        return self.device_memory if self.device_memory is not None else get_gpu(self.gpu).memory_bytes

    def blocks(self) -> int:
        """The model's transformer blocks."""
        return architecture(self.config).layers


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


@dataclass(frozen=True)
class Dropped:
    """Configurations refused, or pruned for memory, together, before any is assessed."""

    size: int
    """How many configurations."""
    why: str
    """The refusal, in one line."""
    memory: bool = False
    """Pruned for memory (``group_fits``), else invalid."""


@dataclass(frozen=True)
class Assessed:
    """One configuration as known before it is timed."""

    configuration: Configuration
    """The configuration (its order in ``schedule`` where the target's own order is another than predict's)."""
    bound: float
    """Seconds ``predict``'s step of it never beats (``step_bound``)."""
    fits: bool
    """Whether its devices can hold their static bytes and the activations every order holds (``memory_fits``)."""
    likely: bool
    """A guess, for the order of timing alone: whether it fits with its first device holding the F of as many
    microbatches as there are pipeline ranks (``likely_fits``)."""


def _powers(most: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to ``most``."""
    return tuple(2 ** k for k in range(max(most, 1).bit_length()))


def _divisors(n: int) -> tuple[int, ...]:
    """The divisors of ``n``, ascending."""
    return tuple(d for d in range(1, n + 1) if n % d == 0)


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


def groups(space: Space) -> Iterator[Group | Dropped]:
    """Every group of the space's menus, in order: a ``Group`` where its degrees are valid and it may fit, else
    what is dropped and why."""
    menus, blocks, target = space.menus(), space.blocks(), space.target
    count = len(decided_choices(target))  # a refused group's choices, with the menu of any model
    for values in itertools.product(*menus.values()):
        c = space.configuration(**dict(zip(menus, values)))
        vps = vp_choices(c.pp, blocks)
        try:
            dp, m = degrees(c)
            refusal = expert_refusal(c, dp)
            if refusal is not None:
                raise InputError(refusal)
            model = configured_model(c, dp)
            if target == TORCHTITAN.name:
                torchtitan_setting(model.setting, m)
        except InputError as exc:
            yield Dropped(len(vps) * count, str(exc))
            continue
        for choice in decided_choices(target, model):
            chosen = replace(c, recompute=choice)
            try:
                short = group_fits(model, chosen)
            except InputError as exc:
                yield Dropped(len(vps), str(exc))
                continue
            if short is not None:
                yield Dropped(len(vps), short, memory=True)
                continue
            yield Group(chosen, dp, m, vps, group_bound(model, m, c.pp, parse_recompute(choice)))


def _whole(model: Model, recompute: Recompute) -> Profile:
    """The profile of ``model`` as one stage, its blocks recomputing as ``recompute`` says."""
    whole = [(0, len(model.layers))]
    return stage_profile(model, whole, recompute.layers(model, whole), recompute.selected(model, whole),
                         recompute.module_names(model))


def group_bound(model: Model, num_microbatches: int, pp: int, recompute: Recompute) -> float:
    """A lower bound on the step of ``model`` over ``pp`` pipeline ranks with ``recompute``, whatever the split, the
    virtual stages and the order: the busiest device works at least the average, every microbatch's F, B and W of
    every layer over ``pp`` devices, less what overlapped F&B pairs could save (``core.overlap.most_saved``, each
    pass in one pair at most); and where pairs save nothing, microbatch 0 runs the F then the B of every layer one
    after the other. Blocks a split chooses to recompute (uniform:N) are timed as not recomputed: recomputation only
    adds to B, and what pairs save grows by less than it adds."""
    least = recompute._replace(mode="none", blocks=0) if recompute.mode == "uniform" else recompute
    whole = _whole(model, least)
    chain = 0.0 if _saved(whole, [0]) else whole.time("F", 0) + whole.time("B", 0)
    return max(num_microbatches * _device_work(whole, [0], True) / pp, chain)


def group_fits(model: Model, c: Configuration) -> str | None:
    """Why no device of ``c`` over its ``pp`` ranks can fit, whatever the split and virtual stages, or None: the
    heaviest device holds at least the average static bytes and, after one microbatch's F, the average of what every
    layer's F keeps (each layer's least under ``c.recompute``: recomputed whole or not, where a split chooses), by
    the one test of a fit (``Costs.first_over``)."""
    recompute = parse_recompute(c.recompute)
    static = sum(layer.static_bytes for layer in model.layers if layer.shares is None) // c.pp
    kept, names = 0.0, recompute.module_names(model)
    for i, layer in enumerate(model.layers):
        own = layer_costs(model, i, recompute.mode == "full" and layer.block, recompute.selective and layer.block,
                          names)["mem_f"]
        kept += min(own, layer_costs(model, i, True)["mem_f"]) if recompute.mode == "uniform" and layer.block else own
    average = Costs(model, (), _memory(c), c.reserve, (static,))
    if average.first_over([kept / c.pp]) is None:
        return None
    return (f"{c.recompute}: {average.shortfall(0, {'static': static, 'one microbatch': kept / c.pp})} on average "
            f"over pp = {c.pp}")


def _device_work(profile: Profile, stages: Sequence[int], paired: bool) -> float:
    """Seconds one microbatch's F, B and W of ``stages`` take on one device, less what pairs could save where
    ``paired``."""
    return sum(sum(profile.durations(s)) for s in stages) - (_saved(profile, stages) if paired else 0.0)


def _saved(profile: Profile, stages: Sequence[int]) -> float:
    """The most overlapped F&B pairs could save of one microbatch's passes of ``stages`` on one device, each pass in
    one pair at most (``core.overlap.most_saved``, which grows with the computation and the communication)."""
    work = sum(sum(profile.durations(s)) for s in stages)
    comm = sum(profile.comm("F", s) + profile.comm("B", s) for s in stages)
    return most_saved(work - comm, comm, profile.overlap_saving, profile.overlap_slowdown)


def assess(space: Space, group: Group) -> list[Assessed | Dropped]:
    """Every configuration of ``group``, one a virtual-stage count: an ``Assessed`` where the target runs it, else
    why not. The order ``predict`` times it with is the target's own where it has one (Megatron's combined 1F1B,
    ``Runtime.schedule_of``), its split ``predict``'s uniform one. Run in a worker: the model is estimated again
    there."""
    base = group.configuration
    model, recompute = configured_model(base, group.dp), parse_recompute(base.recompute)
    out: list[Assessed | Dropped] = []
    for vp in group.vps:
        own = RUNTIMES[space.target].schedule_of(model, base.pp, vp, recompute)
        c = replace(base, vp=vp, schedule=COMBINED if own == COMBINED else None)
        name = c.schedule or megatron_builtin(vp)
        layout = builtin_placement(name, vp)
        placement = make_placement(layout, base.pp, vp)
        try:
            if base.pp > 1:  # the row's pipeline rules: no pipeline, none apply
                runnable(space.target, model, [(layout, vp)], layout, base.pp, group.num_microbatches)
            profile, costs = model_costs(model, placement, "uniform", _memory(c), c.reserve, recompute)
            refusal = partition_refusal(space.target, model, [b - a for a, b in costs.ranges], base.pp)
            if refusal is not None:
                raise InputError(refusal)
        except ZbsolveError as exc:
            out.append(Dropped(1, str(exc)))
            continue
        out.append(Assessed(c, step_bound(profile, placement, group.num_microbatches, name == COMBINED),
                            memory_fits(profile, placement, costs),
                            likely_fits(profile, placement, costs, group.num_microbatches)))
    return out


def _memory(c: Configuration) -> int:
    """Bytes per device of ``c``: its own, else its GPU preset's (as ``predict`` takes them)."""
    return c.device_memory if c.device_memory is not None else get_gpu(c.gpu).memory_bytes


def memory_fits(profile: Profile, placement: Placement, costs: Costs) -> bool:
    """Whether every device can hold its static bytes and the least activations any order holds there
    (``least_activations``) within the device memory less the reserve, by the one test of a fit
    (``Costs.first_over``): where it cannot, no order fits, ``predict``'s included."""
    return costs.first_over(least_activations(profile, placement)) is None


def likely_fits(profile: Profile, placement: Placement, costs: Costs, num_microbatches: int) -> bool:
    """A guess, no bound: whether every device fits holding the F of each of its stages for as many microbatches as
    there are pipeline ranks (at most ``num_microbatches``), as 1F1B's first rank does when its first B starts."""
    held = min(num_microbatches, placement.num_devices)
    return costs.first_over([held * need for need in least_activations(profile, placement)]) is None


def least_activations(profile: Profile, placement: Placement) -> list[float]:
    """Per device, activation bytes every order reaches (the memory rule, ``core.memory``): when a microbatch's
    last F on the device starts, the F of each of its stages is held; while its B of a stage runs, that stage's F
    and what the B holds (``Profile.held_in``: a recomputed forward). A microbatch never holds less than nothing
    (its B leaves what its W reads, its W the rest), so the others only add. Not one microbatch run alone
    (``min_feasible_limits``): a recomputing B allocates what W reads, which a fused BW never holds."""
    route = placement.routes[0]
    needs = []
    for d in range(placement.num_devices):
        stages = [s for s, e in enumerate(route) if e == d]
        forward = sum(profile.delta("F", s) for s in stages)
        needs.append(max(forward, max(profile.delta("F", s) + profile.held_in("B", s) for s in stages)))
    return needs


def step_bound(profile: Profile, placement: Placement, num_microbatches: int, paired: bool) -> float:
    """A lower bound on the step of any order of ``num_microbatches`` on ``profile`` placed by ``placement`` (its
    one route): each device's share is at least the F of the stages before its first one (no pass of it can start
    before microbatch 0 reaches it; dropped where F&B pairs run, ``paired``), all of its passes one after the other
    (less what pairs could save) and its tail (``Profile.device_tails``)."""
    route, tails = placement.routes[0], profile.device_tails(placement)
    shares = []
    for d in range(placement.num_devices):
        stages = [s for s, e in enumerate(route) if e == d]
        head = 0.0 if paired else sum(profile.time("F", s) for s in range(stages[0]))
        shares.append(head + num_microbatches * _device_work(profile, stages, paired) + tails[d])
    return max(shares)
