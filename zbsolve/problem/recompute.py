"""Activation recomputation, the choice: which blocks run their forward (or only their norms and MLP activation
function) again inside their B, written as ``RECOMPUTE_FORMS`` (docs/cost-model.md, "Recomputation"); the costs
that gives are ``problem.recompute_costs``'s."""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from typing import NamedTuple

from zbsolve.base.errors import InputError
from zbsolve.costmodel.model import OP_POLICY, RECOMPUTE_MODULES, Model


class Recompute(NamedTuple):
    """Which blocks recompute whole: none, every block ("full", torchtitan's activation checkpointing), the first N
    blocks of every stage ("uniform:N", Megatron's ``recompute_method=block``: all of a stage's blocks where it has
    fewer), or the first N_s blocks of each stage s ("per-stage:N_0,N_1,...", or "per-stage" alone: the counts still
    to be chosen, ``optimize.recompute_fit``); and whether the others recompute selectively ("selective", or
    "selective+" before uniform or per-stage: their norms and MLP activation function run again in B); or, alone,
    which of Megatron-LM's modules every block recomputes ("modules:core_attn,mlp": ``RECOMPUTE_MODULES``, its
    ``--recompute-granularity selective --recompute-modules``); or, alone, torchtitan's per-op policy in every block
    ("op": ``OP_POLICY``, its ``SelectiveAC``: each block keeps the outputs of its attention core and of every
    other product, and runs the rest of its forward again in B; costed as a module, ``modules`` ("op",))."""

    mode: str
    """none, full, uniform or per-stage."""
    blocks: int = 0
    """N of uniform:N."""
    per_stage: tuple[int, ...] = ()
    """N_s of per-stage, one per stage in stage order (empty: not chosen yet)."""
    selective: bool = False
    """The blocks not recomputed whole recompute selectively."""
    modules: tuple[str, ...] = ()
    """Megatron-LM's modules every block recomputes, in ``RECOMPUTE_MODULES`` order, or ("op",) for torchtitan's
    per-op policy (mode "none")."""

    def __str__(self) -> str:
        if self.modules == (OP_POLICY,):
            return OP_POLICY
        if self.modules:
            return "modules:" + ",".join(self.modules)
        whole = (f"uniform:{self.blocks}" if self.mode == "uniform" else
                 "per-stage:" + ",".join(map(str, self.per_stage)) if self.mode == "per-stage" and self.per_stage
                 else self.mode)
        if not self.selective:
            return whole
        return "selective" if whole == "none" else f"selective+{whole}"

    @property
    def undecided(self) -> bool:
        """Whether the per-stage counts are still to be chosen ("per-stage", "selective+per-stage")."""
        return self.mode == "per-stage" and not self.per_stage

    def layers(self, model: Model, ranges: Sequence[Sequence[int]]) -> frozenset[int]:
        """The indices of the layers that recompute whole when ``model`` is cut at ``ranges``; an ``InputError``
        when per-stage counts do not match the stages."""
        if self.mode == "none":
            return frozenset()
        if self.mode == "per-stage" and len(self.per_stage) != len(ranges):
            raise InputError(f"recompute = '{self}': {len(self.per_stage)} counts for {len(ranges)} stages")
        blocks = stage_blocks(model, ranges)
        counts = [len(mine) if self.mode == "full" else self.blocks if self.mode == "uniform" else self.per_stage[s]
                  for s, mine in enumerate(blocks)]
        for s, (mine, n) in enumerate(zip(blocks, counts)):
            if self.mode == "per-stage" and n > len(mine):
                raise InputError(f"recompute = '{self}': stage {s} has {len(mine)} blocks, fewer than {n}")
        return first_blocks(blocks, counts)

    def selected(self, model: Model, ranges: Sequence[Sequence[int]]) -> frozenset[int]:
        """The indices of the blocks that recompute selectively; an ``InputError`` naming a block without the
        figures for it (``Layer.t_sel``, ``mem_sel``: estimates have them)."""
        if not self.selective:
            return frozenset()
        whole = self.layers(model, ranges)
        chosen = frozenset(i for a, b in ranges for i in range(a, b) if model.layers[i].block and i not in whole)
        missing = [model.layers[i].name for i in sorted(chosen) if model.layers[i].mem_sel is None]
        if missing:
            raise InputError(f"recompute = '{self}': layer {missing[0]} has no t_sel and mem_sel (zbsolve estimate "
                             "writes them)")
        return chosen


    def module_names(self, model: Model) -> tuple[str, ...]:
        """``modules``, checked against ``model``: an ``InputError`` naming a block without the figures for them
        (``Layer.recompute_modules``: estimates have them), or a module no block of the model has."""
        if not self.modules:
            return ()
        blocks = [layer for layer in model.layers if layer.block]
        missing = [layer.name for layer in blocks if layer.recompute_modules is None]
        if missing:
            raise InputError(f"recompute = '{self}': layer {missing[0]} has no recompute_modules (zbsolve estimate "
                             "writes them)")
        lacking = [layer.name for layer in blocks if OP_POLICY in self.modules
                   and OP_POLICY not in (layer.recompute_modules or {})]
        if lacking:
            raise InputError(f"recompute = '{self}': block {lacking[0]} of model {model.name} is not one torchtitan's "
                             "per-op policy is costed for (dense blocks of grouped-query attention and a gated MLP)")
        has = {name for layer in blocks for name in layer.recompute_modules or {}}
        absent = [name for name in self.modules if name not in has]
        if absent:
            raise InputError(f"recompute = '{self}': no block of model {model.name} has module {absent[0]} (its "
                             f"blocks have {', '.join(n for n in RECOMPUTE_MODULES if n in has)})")
        return self.modules


def stage_blocks(model: Model, ranges: Sequence[Sequence[int]]) -> list[list[int]]:
    """Per stage, the indices of its blocks, in order."""
    return [[i for i in range(a, b) if model.layers[i].block] for a, b in ranges]


def first_blocks(blocks: Sequence[Sequence[int]], counts: Sequence[int]) -> frozenset[int]:
    """The first ``counts[s]`` of each stage's ``blocks[s]`` (all of them where it has fewer): the blocks a count per
    stage recomputes, as zbsolve, ``per-stage`` and Megatron's ``--recompute-method block`` choose them."""
    return frozenset(i for mine, n in zip(blocks, counts) for i in mine[:n])


def leading_counts(blocks: Sequence[Sequence[int]], chosen: Collection[int]) -> tuple[int, ...] | int:
    """Per stage, how many of its ``blocks`` are ``chosen`` when these are its first ones on every stage
    (``first_blocks`` gives them back); else the first stage whose are not."""
    counts = []
    for s, mine in enumerate(blocks):
        n = sum(i in chosen for i in mine)
        if first_blocks([mine], [n]) != frozenset(i for i in mine if i in chosen):
            return s
        counts.append(n)
    return tuple(counts)


def selective_known(model: Model) -> bool:
    """Whether every block of ``model`` has the figures of selective recomputation (``Layer.t_sel``, ``mem_sel``)."""
    return all(layer.mem_sel is not None for layer in model.layers if layer.block)


NONE = Recompute("none")
FULL = Recompute("full")
PER_STAGE = Recompute("per-stage")
"""Per-stage counts, to be chosen."""
OP = Recompute("none", modules=(OP_POLICY,))
"""torchtitan's per-op selective activation checkpointing in every block."""
MODULES_FORM = "modules:M,M,..."
"""How a choice of Megatron-LM's recomputed modules is written (M in ``RECOMPUTE_MODULES``)."""
RECOMPUTE_FORMS = ("none", "full", "uniform:N", "per-stage", "per-stage:N,N,...", "selective",
                   "selective+uniform:N", "selective+per-stage", "selective+per-stage:N,N,...", MODULES_FORM, OP_POLICY)
"""How a recomputation choice is written."""
NESTED = {"moe": ("moe_act", "shared_experts")}
"""Modules that run inside another's checkpoint, which saves their bytes already."""


def parse_recompute(text: str | Recompute) -> Recompute:
    """A recomputation choice from its text (``RECOMPUTE_FORMS``); anything else is an ``InputError``."""
    if isinstance(text, Recompute):
        return text
    if str(text).strip() == OP_POLICY:
        return OP
    modules = re.fullmatch(r"\s*modules:(.*?)\s*", str(text))
    if modules is not None:
        return Recompute("none", modules=_modules(str(text), modules[1]))
    match = re.fullmatch(r"\s*(none|full|selective|(selective\+)?(uniform:(\d+)|per-stage(?::(\d+(?:,\d+)*))?))\s*",
                         str(text))
    if match is None or match[4] is not None and int(match[4]) < 1:
        raise InputError(f"recompute = {text!r}: should be one of {', '.join(RECOMPUTE_FORMS)} (N >= 1 in uniform:N)")
    selective = match[1] == "selective" or match[2] is not None
    if match[4]:
        return Recompute("uniform", int(match[4]), selective=selective)
    if match[3] and match[3].startswith("per-stage"):
        return Recompute("per-stage", per_stage=tuple(int(x) for x in match[5].split(",")) if match[5] else (),
                         selective=selective)
    return Recompute("none" if selective else match[1], selective=selective)


def _modules(text: str, listed: str) -> tuple[str, ...]:
    """The modules of "modules:``listed``", in ``RECOMPUTE_MODULES`` order; an ``InputError`` naming an unknown or
    missing one, or one inside another (``NESTED``)."""
    names = [name.strip() for name in listed.split(",")]
    unknown = next((name for name in names if name not in RECOMPUTE_MODULES), None)
    if unknown is not None:
        raise InputError(f"recompute = {text!r}: module {unknown!r} should be one of {', '.join(RECOMPUTE_MODULES)} "
                         "(Megatron-LM's --recompute-modules)")
    for outer, inner in NESTED.items():
        both = [name for name in inner if outer in names and name in names]
        if both:
            raise InputError(f"recompute = {text!r}: module {both[0]} runs inside {outer}, which recomputes it "
                             f"already; choose one")
    return tuple(name for name in RECOMPUTE_MODULES if name in names)


def described(model: Model, ranges: Sequence[Sequence[int]], recomputed: Collection[int],
              selective: Collection[int] = (), modules: Sequence[str] = ()) -> str:
    """The shortest text (``RECOMPUTE_FORMS``) that chooses ``recomputed`` and ``selective`` at ``ranges`` (or
    Megatron's ``modules``, which come alone), or "layers" when the recomputed blocks of some stage are not its first
    ones, or only some of the others recompute selectively."""
    if modules:
        return str(Recompute("none", modules=tuple(modules)))
    blocks = [i for a, b in ranges for i in range(a, b) if model.layers[i].block]
    if not selective:
        return _whole(model, ranges, recomputed)
    if set(selective) != set(blocks) - set(recomputed):
        return "layers"
    whole = _whole(model, ranges, recomputed)
    return whole if whole == "layers" else str(parse_recompute(whole)._replace(selective=True))


def _whole(model: Model, ranges: Sequence[Sequence[int]], recomputed: Collection[int]) -> str:
    """``described`` for blocks that recompute whole."""
    blocks = stage_blocks(model, ranges)
    leading = leading_counts(blocks, recomputed)
    if isinstance(leading, int):
        return "layers"
    counts = [(n, len(mine)) for n, mine in zip(leading, blocks)]
    if not any(n for n, _ in counts):
        return "none"
    if all(n == total for n, total in counts):
        return "full"
    most = max(n for n, _ in counts)
    if all(n == min(most, total) for n, total in counts):  # a stage with fewer blocks recomputes them all
        return f"uniform:{most}"
    return str(Recompute("per-stage", per_stage=tuple(n for n, _ in counts)))
