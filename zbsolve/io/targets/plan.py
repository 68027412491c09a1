"""A solved plan as the exports read it: the schedule document's schedule, the model partition its stages stand
for, and the blocks that recompute."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from zbsolve.base.errors import InputError
from zbsolve.core.schedule import Schedule, pair_count
from zbsolve.costmodel.model import Model
from zbsolve.io.document import Loaded, load_document
from zbsolve.io.targets.launch import Launch, read_launch
from zbsolve.io.targets.target import Target, listed, refused
from zbsolve.problem.recompute import stage_blocks

INDEXED = re.compile(r".+\.\d+")
"""A module FQN that is an entry of a ModuleList or ModuleDict by index (``layers.3``, ``blocks.0``): the blocks of a
partition whose layers do not say."""


@dataclass(frozen=True)
class Plan:
    """A solved plan: its schedule, the model partition the schedule's stages stand for, and the layers that
    recompute."""

    schedule: Schedule
    model: Model
    """The partition's layers, a layer a block where its record says so, else where its name is ``INDEXED``; and the
    training setting the costs are for ("partition.setting"), where the document has one."""
    stages: tuple[tuple[int, int], ...]
    """Half-open layer ranges per stage, in stage order."""
    recomputed: frozenset[int] = frozenset()
    """The layers that run their forward again inside their B (the document's "partition.recompute")."""
    selective: frozenset[int] = frozenset()
    """The blocks whose norms and MLP activation function run again inside their B ("partition.selective")."""
    modules: tuple[str, ...] = ()
    """Megatron-LM's modules every block recomputes ("partition.modules")."""
    launch: Launch | None = None
    """What to launch it with (the document's "launch" section: ``megatron.launch``), where the document says."""

    def check(self, target: Target) -> tuple[str, int]:
        """(placement name, stages per device) of the plan when ``target``'s row of the target table runs it: its
        placement and microbatches, its MTP layers, its overlapped pairs, its recomputed modules and its selectively
        recomputed blocks; an ``InputError`` naming the row and ``plan --target`` (a plan it runs) otherwise."""
        try:
            named = target.check_placement(self.schedule.placement, self.schedule.num_microbatches)
            refused(target.mtp_refusal(self.model.mtp_layers))
            refused(target.pairs_refusal(pair_count(self.schedule), self.schedule.name))
        except InputError as refusal:
            raise InputError(f"{refusal}; plan with --target {target.name}") from None
        why = target.modules_refusal(self.modules)
        if why is not None:
            raise InputError(f"partition.modules = {list(self.modules)}: {why}; plan with --target {target.name}")
        if self.selective and not target.selective:
            names = [self.model.layers[i].name for i in sorted(self.selective)]
            raise InputError(f"partition.selective = {listed(names)}: "
                             f"{target.label} cannot recompute just a block's norms and MLP activation function "
                             "(runtime table: " f"{target.name}.selective); plan with --target {target.name}")
        layers = self.model.layers
        why = target.selective_refusal([layers[i].name for i in sorted(self.selective)
                                         if layers[i].experts])
        if why is not None:
            raise InputError(f"partition.selective: {why}; plan with --target {target.name}")
        return named

    def stage_recompute(self) -> list[tuple[list[int], list[int]]]:
        """Per stage, its blocks and its recomputed layers (layer indices, in order)."""
        return [(blocks, [i for i in range(a, b) if i in self.recomputed])
                for blocks, (a, b) in zip(stage_blocks(self.model, self.stages), self.stages)]


def counted(stages: Sequence[tuple[list[int], list[int]]]) -> str:
    """The recomputed blocks of every stage, counted: ``stages 0-3 recompute [1, 2, 2, 2] of their [2, 2, 2, 2]
    blocks``."""
    return (f"stages 0-{len(stages) - 1} recompute {[len(chosen) for _, chosen in stages]} of their "
            f"{[len(blocks) for blocks, _ in stages]} blocks")


def read_plan(document: str | Path | Loaded, fmt: str) -> Plan:
    """The plan in the schedule document at ``document`` (or read: ``io.document.Loaded``); a document without a
    "partition" section is an ``InputError`` naming it and the format ``fmt`` that needs it."""
    loaded = document if isinstance(document, Loaded) else load_document(document)
    section, costs = loaded.data.get("partition"), loaded.costs
    if section is None:
        raise InputError(f"{loaded.where}: partition is missing; format {fmt!r} needs the model's layers and stages "
                         "(solve a model description, e.g. problems/models/llama3-8b.yaml)")
    assert costs is not None and costs.model is not None  # the partition section is there
    records = section["layers"]
    layers = [layer if "block" in record else layer.model_copy(update={"block": bool(INDEXED.fullmatch(layer.name))})
              for layer, record in zip(costs.model.layers, records)]
    model = Model(name=costs.model.name, setting=costs.model.setting, layers=layers)
    return Plan(loaded.schedule, model, costs.ranges, frozenset(costs.recomputed), frozenset(costs.selective),
                costs.modules, read_launch(loaded.data.get("launch"), loaded.where))

