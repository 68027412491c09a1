"""A zbsolve plan's recomputation applied to torchtitan 0.3.0's model parts block by block
(docs/torchtitan-recompute.md).

torchtitan applies one activation-checkpointing policy to every block of every model part. Its policies are
classes: ``Trainer.Config.activation_checkpoint`` holds a policy's config, and ``parallelize_llama``
(``torchtitan/models/llama3/parallelize.py``) calls ``ac_config.build(dump_folder=...).apply(model)`` on each model
part that ``pipeline_llm`` (``torchtitan/distributed/pipeline_parallel.py``) cut out, after tensor parallelism and
before ``torch.compile`` and FSDP. ``PlannedAC`` is such a policy: its ``apply`` recomputes the plan's blocks of the
part it is given and leaves the others alone. torchtitan's ``--override.imports`` (``torchtitan/config/override.py``)
swaps it in for whatever policy the config holds:

    --override.imports 'zbsolve.execute.torchtitan_recompute.planned_recompute={"plan": "plan.json"}'

where ``plan.json`` is the schedule document of a plan solved from a model description. The config must hold a
policy for the override to replace (``activation-checkpoint:full``, say), not ``none``.

Which blocks, from the document's ``partition`` section (``zbsolve.io.targets.plan.read_plan``): those in
``partition.recompute`` are wrapped whole by torch's checkpoint wrapper, with the same arguments as torchtitan's
``FullAC``; those in ``partition.selective`` recompute the outputs of their two norms and of their MLP's SwiGLU
product (the input of ``w2``) inside their backward, as zbsolve's executor does (``zbsolve.execute.recompute
.recompute_output``, docs/cost-model.md "Selective recomputation"): the block's class becomes a subclass whose
``forward`` runs the same operations in the same order, so its module FQNs, parameters and state dict do not change.
Selective recomputation is built for torchtitan's ``Llama3TransformerBlock`` with a dense ``FeedForward``.

A block is named by its FQN in the model part (``layers.3``), which is the plan's layer name. torch and torchtitan
are imported when used; importing this module imports torchtitan only where it is installed, to register
``PlannedAC`` and the override.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from zbsolve.base.errors import InputError
from zbsolve.io.targets.plan import Plan, read_plan
from zbsolve.problem.recompute import stage_blocks

FULL = "full"
"""A block recomputed whole (``partition.recompute``)."""
SELECTIVE = "selective"
"""A block that recomputes its norms' and its SwiGLU product's outputs (``partition.selective``)."""
OVERRIDE = "zbsolve.execute.torchtitan_recompute.planned_recompute"
"""The ``--override.imports`` target that makes torchtitan run ``PlannedAC``."""


def load_plan(plan: Plan | str | Path) -> Plan:
    """``plan``, or the plan in the schedule document at that path (an ``InputError`` if it has no partition)."""
    return plan if isinstance(plan, Plan) else read_plan(plan, "torchtitan")


def planned_blocks(plan: Plan | str | Path) -> list[tuple[list[str], dict[str, str]]]:
    """Per stage of ``plan``: its blocks' names in order, and those that recompute with ``FULL`` or
    ``SELECTIVE``."""
    plan = load_plan(plan)
    names = [layer.name for layer in plan.model.layers]
    return [([names[i] for i in blocks],
             {names[i]: FULL if i in plan.recomputed else SELECTIVE for i in blocks
              if i in plan.recomputed or i in plan.selective})
            for blocks in stage_blocks(plan.model, plan.stages)]


def apply_recompute(model_parts: Any, plan: Plan | str | Path, *, all_stages: bool = True,
                    preserve_rng_state: bool = True, determinism_check: str = "default",
                    debug: bool = False) -> dict[str, str]:
    """Recompute ``plan``'s blocks in ``model_parts`` (one module or a list: torchtitan's model parts, each with
    its blocks in ``layers``, as ``pipeline_llm`` cuts them), replacing each block in its part's ``layers``, and
    return the FQNs done with ``FULL`` or ``SELECTIVE``, in part and block order. ``plan`` is a ``Plan`` or a
    schedule document's path.

    ``all_stages``: the parts hold every stage of the plan (a model in one process); else only some (a pipeline
    rank's), and each stage one of the parts holds a block of must be held whole. A block of such a stage that the
    parts do not hold, a block of the parts that is none of the plan's, a part without ``layers``, a block already
    checkpointed (torchtitan's own policy applied too) and a selective block that is not torchtitan's llama3
    block are ``InputError``s naming the block, raised before any block is wrapped. ``preserve_rng_state``,
    ``determinism_check`` and ``debug`` go to torch's checkpoint wrapper, as torchtitan's ``FullAC`` passes its
    config's."""
    held = _held_blocks(model_parts)
    chosen: dict[str, str] = {}
    known: set[str] = set()
    for s, (blocks, kinds) in enumerate(planned_blocks(plan)):
        known.update(blocks)
        mine = [name for name in blocks if name in held]
        missing = [name for name in blocks if name not in held]
        if missing and (all_stages or mine):
            kind = f" ({kinds[missing[0]]})" if missing[0] in kinds else ""
            raise InputError(f"partition: block {missing[0]!r}{kind} of stage {s} is not in the model parts, which "
                             f"hold {_listed(mine) or 'none of its blocks'}; cut the parts as the plan's stages "
                             "(module_fqns_per_model_part)")
        chosen.update(kinds if mine else {})
    stray = [name for name in held if name not in known]
    if stray:
        raise InputError(f"model parts: block {stray[0]!r} is not a block of the plan's partition "
                         f"({_listed(sorted(known, key=_order))})")
    chosen = {name: chosen[name] for name in held if name in chosen}
    for name, kind in chosen.items():
        _check_block(name, held[name][0].get_submodule(held[name][1]), kind)
    for name, kind in chosen.items():
        layers, key = held[name]
        block = layers.get_submodule(key)
        layers.register_module(key, _checkpointed(block, preserve_rng_state, determinism_check, debug)
                               if kind == FULL else _selective(block))
    return chosen


def _held_blocks(model_parts: Any) -> dict[str, tuple[Any, str]]:
    """Each block of the parts by FQN (``layers.<key>``), with its ``layers`` container and key."""
    parts = model_parts if isinstance(model_parts, Sequence) else [model_parts]
    held: dict[str, tuple[Any, str]] = {}
    for index, part in enumerate(parts):
        try:
            layers = part.get_submodule("layers")
        except AttributeError:
            raise InputError(f"model part {index} ({type(part).__name__}) has no 'layers'; torchtitan's model "
                             "parts hold their blocks in 'layers'") from None
        for key, _ in layers.named_children():
            if f"layers.{key}" in held:
                raise InputError(f"model parts: block 'layers.{key}' is in two parts")
            held[f"layers.{key}"] = (layers, key)
    return held


def _order(name: str) -> tuple[str, int]:
    """Sort key of a block name: ``layers.10`` after ``layers.9``."""
    head, _, index = name.rpartition(".")
    return (head, int(index)) if index.isdigit() else (name, -1)


def _listed(names: Sequence[str]) -> str:
    """``names`` shortened for a message: the first three and the count."""
    return ", ".join(names[:3]) + (f", ... ({len(names)} blocks)" if len(names) > 3 else "")


def _check_block(name: str, block: Any, kind: str) -> None:
    """An ``InputError`` when ``block`` cannot be recomputed as ``kind``."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    if isinstance(block, (CheckpointWrapper, _SelectiveForward)):
        raise InputError(f"block {name!r} is already recomputed ({type(block).__name__}); apply the plan instead of "
                         "torchtitan's activation_checkpoint policy, not on top of it")
    if kind == SELECTIVE:
        from torchtitan.models.common.feed_forward import FeedForward
        from torchtitan.models.llama3.model import Llama3TransformerBlock

        ffn = getattr(block, "feed_forward", None)
        if type(block).forward is not Llama3TransformerBlock.forward or getattr(type(ffn), "forward", None) is not \
                FeedForward.forward or getattr(block, "moe", None) is not None:
            raise InputError(f"partition.selective: block {name!r} is {type(block).__name__} with feed_forward "
                             f"{type(ffn).__name__}; selective recomputation (the norms' and the SwiGLU product's "
                             "outputs) is built for torchtitan's Llama3TransformerBlock with a dense FeedForward")


def _checkpointed(block: Any, preserve_rng_state: bool, determinism_check: str, debug: bool) -> Any:
    """``block`` in torch's checkpoint wrapper, as torchtitan's ``FullAC._wrap_block`` wraps every block."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    return checkpoint_wrapper(block, preserve_rng_state=preserve_rng_state, determinism_check=determinism_check,
                              early_stop=False, debug=debug)


class _SelectiveForward:
    """The forward of a selectively recomputed llama3 block: ``Llama3TransformerBlock.forward`` and
    ``FeedForward.forward``'s operations in their order, with the outputs of ``attention_norm``, ``ffn_norm`` and
    the SwiGLU product ``silu(w1(x)) * w3(x)`` not kept for backward but recomputed once by the first backward that
    reads them (``recompute_output``)."""

    def forward(self, x: Any, attention_masks: Any, positions: Any = None) -> Any:
        from torch.nn import functional

        from zbsolve.execute.recompute import recompute_output

        block: Any = self
        ffn = block.feed_forward
        h = x + recompute_output(block.attention_norm, x, lambda y: block.attention(y, attention_masks, positions))
        gate, up = recompute_output(block.ffn_norm, h, lambda y: (ffn.w1(y), ffn.w3(y)))
        return h + recompute_output(lambda g: functional.silu(g) * up, gate, ffn.w2)

    def compile(self, *args: Any, **kwargs: Any) -> None:
        """``torch.compile`` the block's attention alone, with these arguments (torchtitan's ``apply_compile`` calls
        ``block.compile(backend=..., fullgraph=True)``). The rest stays eager: dynamo cannot trace the forward's
        saved-tensor hooks (it stops at ``untyped_storage``), and torch's own ``RMSNorm`` and ``Linear`` modules
        compiled alone give dynamo no frame (``fullgraph=True`` fails). Under AOT autograd the attention's saved
        input is still the norm's output, dropped and recomputed as in eager."""
        block: Any = self
        block.attention.compile(*args, **kwargs)


_SELECTIVE_CLASSES: dict[type, type] = {}
"""The selective subclass of each block class, made once."""


def _selective(block: Any) -> Any:
    """``block``, its class made the subclass with ``_SelectiveForward``'s forward (nothing else changes)."""
    cls = type(block)
    if cls not in _SELECTIVE_CLASSES:
        _SELECTIVE_CLASSES[cls] = type(f"Selective{cls.__name__}", (_SelectiveForward, cls),
                                       {"__module__": __name__, "__doc__": _SelectiveForward.__doc__})
    block.__class__ = _SELECTIVE_CLASSES[cls]
    return block


if importlib.util.find_spec("torchtitan") is not None:
    from dataclasses import dataclass

    from torchtitan.config.override import derive, override
    from torchtitan.distributed import activation_checkpoint as _ac

    class PlannedAC(_ac.ActivationCheckpointing):
        """torchtitan's activation-checkpointing policy of a zbsolve plan: each model part recomputes the plan's
        blocks it holds, whole or selectively (``apply_recompute`` with ``all_stages=False``)."""

        @dataclass(kw_only=True, slots=True)
        class Config(_ac.ActivationCheckpointing.Config):
            plan: str
            """The schedule document of the plan, solved from a model description (its ``partition`` section)."""

        def apply(self, model: Any) -> None:
            """Recompute the plan's blocks that ``model`` (one model part) holds."""
            from torchtitan.tools.logging import logger

            config = self.config
            assert isinstance(config, PlannedAC.Config)
            _ac._disable_dynamo_lru_cache()  # as every torchtitan policy's apply does
            done = apply_recompute(model, config.plan, all_stages=False,
                                   preserve_rng_state=config.preserve_rng_state,
                                   determinism_check=config.determinism_check, debug=config.debug)
            logger.info(f"zbsolve plan {config.plan}: recomputing "
                        f"{', '.join(f'{name} ({kind})' for name, kind in done.items()) or 'no block'} of this part")

    @override(target=_ac.ActivationCheckpointing.Config, fqns=["activation_checkpoint"],
              description="zbsolve plan: per-block recomputation")
    def planned_recompute(config: _ac.ActivationCheckpointing.Config, plan: str) -> PlannedAC.Config:
        """The ``PlannedAC`` policy of the plan at ``plan`` in place of ``config`` (whose ``preserve_rng_state``,
        ``determinism_check`` and ``debug`` it keeps). The plan is read now, so a bad document stops torchtitan
        before it builds the model."""
        load_plan(plan)
        return derive(config, PlannedAC.Config, plan=str(plan))
