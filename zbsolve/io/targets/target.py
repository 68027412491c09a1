"""The row of the target table: what a target runs, declared in its module beside its exporter (``io.targets``
finds them): the placements with the stages per device it builds, whose order of passes it runs, the recomputation
it can apply, overlapped F&B pairs, MTP layers and its conditions on the microbatches. ``plan --target``, the
baselines and the exports all read it, and a refusal names the row and the column it comes from."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from zbsolve.base.errors import InputError
from zbsolve.core.placement import Placement, placement_name
from zbsolve.costmodel.model import OP_POLICY, Model
from zbsolve.problem.recompute import Recompute

ORDERS = ("planned", "own")
"""Whose order of passes a target runs (``Target.order``)."""


@dataclass(frozen=True)
class Target:
    """One row of the target table: a runtime a plan is for."""

    name: str
    """The target's name (``plan --target``)."""
    label: str
    """The runtime as a refusal names it, with the release its row was checked against."""
    placements: Mapping[str, tuple[int, ...] | None]
    """The placements it builds, each with the stages per device it supports (None: any)."""
    order: str
    """Whose order of passes it runs: "planned" (the plan's, as exported) or "own" (its built-in schedule)."""
    own_schedule: Callable[[Model, int, int, Recompute], str] | None
    """With order "own": the built-in schedule of its order (``schedulers.builtins.BUILTINS``, or Megatron's
    ``COMBINED``) for a model over a number of devices with a number of stages per device and a recomputation;
    None with "planned"."""
    recompute: tuple[str, ...]
    """The recomputation modes it applies (``problem.recompute``'s modes, one setting for every stage unless
    "per-stage" is among them)."""
    selective: bool
    """Whether it recomputes just a block's norms and MLP activation function."""
    selective_experts: bool
    """Whether it does so in blocks with experts too (``Layer.comm_f`` set), else in dense blocks only."""
    auto_recompute: tuple[str, ...]
    """The recomputation choices ``plan --recompute auto`` times every candidate with."""
    pairs: bool
    """Whether it overlaps the passes of an F&B pair (each one's communication beside the other's computation,
    ``core.overlap``): a plan for it searches pairs, and a built-in's pairs (DualPipeV's) are timed so; without it,
    a pair's passes run one after the other (``core.transforms.unpaired``) and no document with pairs is taken."""
    mtp: bool
    """Whether it runs MTP layers under pipeline parallelism."""
    grouped_microbatches: bool
    """Whether its interleaved schedule runs microbatches in groups of p (the count a multiple of p)."""
    layout_only: bool
    """Whether it takes only the partitions Megatron's layout string expresses (no stage boundary inside the layers
    before the first block, among the MTP layers, or inside the layers after the last), else any layer boundary."""
    source: str
    """Where the row was read: the runtime's files that state each column."""
    modules: tuple[str, ...] = ()
    """The Megatron-LM modules it recomputes in every block (``costmodel.model.RECOMPUTE_MODULES``, the choice
    ``modules:M,...``), or torchtitan's per-op policy (``OP_POLICY``, the choice ``op``), with no block then
    recomputed whole; none for a runtime without such a choice."""
    paired_orders: tuple[str, ...] = ()
    """Its own orders whose F&B pairs it overlaps though ``pairs`` is False (Megatron's combined 1F1B): a document
    of such an order is taken with its pairs."""
    zero: tuple[int, ...] = (0, 1, 3)
    """The optimizer shardings it runs as the costs count them (``Setting.zero``: 0 DDP, 1 the distributed
    optimizer, 3 FSDP), which ``zbsolve configure`` searches."""

    def __post_init__(self) -> None:
        if self.order not in ORDERS or (self.order == "own") != (self.own_schedule is not None):
            raise ValueError(f"{self.name}: order = {self.order!r} needs own_schedule exactly when it is 'own'")

    def schedule_of(self, model: Model, num_devices: int, chunks: int, recompute: Recompute) -> str | None:
        """The built-in schedule this runtime runs for ``model`` over ``num_devices`` with ``chunks`` stages per
        device and ``recompute``, whatever the plan's order (order "own"), or None where it runs the plan's
        order."""
        return None if self.own_schedule is None else self.own_schedule(model, num_devices, chunks, recompute)

    def _refuse(self, column: str, what: str) -> str:
        return f"{what} (runtime table: {self.name}.{column})"

    def placement_refusal(self, name: str, chunks: int) -> str | None:
        """Why this runtime cannot build ``name`` with ``chunks`` stages per device, or None."""
        if name in self.placements:
            counts = self.placements[name]
            if counts is None or chunks in counts:
                return None
        runs = ", ".join(n if c is None else f"{n} x{'/'.join(map(str, c))}" for n, c in self.placements.items())
        return self._refuse("placements", f"{self.label} builds {runs} (stages per device), not {name} x{chunks}")

    def microbatch_refusal(self, name: str, num_devices: int, num_microbatches: int) -> str | None:
        """Why this runtime cannot run ``num_microbatches`` on ``name`` over ``num_devices``, or None."""
        if self.grouped_microbatches and name == "interleaved" and num_microbatches % num_devices:
            return self._refuse("grouped_microbatches", f"num_microbatches = {num_microbatches} is not a multiple "
                                f"of num_devices = {num_devices}: {self.label}'s interleaved schedule runs "
                                f"microbatches in groups of {num_devices}")
        return None

    def mtp_refusal(self, mtp_layers: list[str]) -> str | None:
        """Why this runtime cannot run a pipeline holding ``mtp_layers``, or None."""
        if mtp_layers and not self.mtp:
            return self._refuse("mtp", f"layers {', '.join(mtp_layers)} are MTP layers: {self.label} runs none "
                                       "under pipeline parallelism")
        return None

    def pairs_refusal(self, count: int, order: str = "") -> str | None:
        """Why this runtime cannot run a schedule (of the order named ``order``) with ``count`` overlapped F&B
        pairs, or None."""
        if count and not self.pairs and order not in self.paired_orders:
            return self._refuse("pairs", f"the schedule runs {count} overlapped F&B pair(s): {self.label} runs a "
                                         "pair's passes one after the other, not overlapped")
        return None

    def modules_refusal(self, modules: Sequence[str]) -> str | None:
        """Why this runtime cannot recompute Megatron-LM's ``modules`` (or torchtitan's per-op policy) in every
        block, or None."""
        other = [name for name in modules if name not in self.modules]
        if other and other[0] == OP_POLICY:
            return self._refuse("modules", f"{self.label} has no per-op selective checkpointing (torchtitan's)")
        if other:
            megatron = [name for name in self.modules if name != OP_POLICY]
            return self._refuse("modules", f"{self.label} recomputes {', '.join(megatron) or 'none'} of "
                                           f"Megatron-LM's --recompute-modules, not {other[0]}")
        return None

    def selective_refusal(self, expert_blocks: list[str]) -> str | None:
        """Why this runtime cannot recompute ``expert_blocks`` (blocks with experts) selectively, or None."""
        if expert_blocks and not self.selective_experts:
            return self._refuse("selective_experts", f"blocks {listed(expert_blocks)} have experts: {self.label} "
                                                     "recomputes only dense blocks selectively")
        return None

    def check_placement(self, placement: Placement, num_microbatches: int | None = None) -> tuple[str, int]:
        """(name, stages per device) of ``placement`` when this runtime builds it (and runs ``num_microbatches`` on
        it, where given); an ``InputError`` naming the row otherwise."""
        named = placement_name(placement)
        if named is None:
            routes = [list(route) for route in placement.routes]
            raise InputError(f"placement routes = {routes}: " + self._refuse("placements", f"{self.label} builds only "
                             f"{', '.join(self.placements)} placements"))
        why = self.placement_refusal(*named) or (None if num_microbatches is None else self.microbatch_refusal(
            named[0], placement.num_devices, num_microbatches))
        if why is not None:
            raise InputError(f"placement {named[0]} x{named[1]}: {why}")
        return named


def listed(names: list[str]) -> str:
    """The first three of ``names``, joined, with ", ..." when there are more."""
    return ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")


def refused(why: str | None) -> None:
    """An ``InputError`` of ``why`` when there is one."""
    if why is not None:
        raise InputError(why)
