"""Megatron-LM's ``--recompute-modules`` of a block (``docs/cost-model.md``, "Megatron's recomputed modules"), per
token on one device before tensor and expert parallelism, from the block's parts (``block``, ``moe``): what each
module runs again inside B and the bytes F then keeps no more. ``zbsolve.costmodel.estimate`` turns them into
each block's ``Layer.recompute_modules``.

Checked against megatron-core 0.16.1 with its default Transformer Engine layer specs
(``megatron/core/models/gpt/gpt_layer_specs.py``): a norm fused into the matmul after it (grouped-query attention's
input norm into ``linear_qkv``, a dense MLP's norm into ``linear_fc1``) is no ``layernorm`` module
(``transformer_layer.py``: ``IdentityOp`` is not recomputed), and the dense ``mlp`` checkpoint then takes the norm's
input and drops its output too. ``core_attn``, ``mlp``, ``moe`` and ``shared_experts`` are checkpoints
(``tensor_parallel.checkpoint``: they keep their input and run their forward again); ``layernorm``, ``moe_act`` and
``mla_up_proj`` drop their outputs and run again just before the backward needs them
(``CheckpointWithoutOutput``).
"""

from __future__ import annotations

from dataclasses import dataclass

from zbsolve.costmodel import moe
from zbsolve.costmodel.block import Part, latent_up, mlp, norm
from zbsolve.costmodel.hf_config import Architecture
from zbsolve.costmodel.kernels import Matmul


@dataclass(frozen=True)
class Redo:
    """A module of a block recomputed, a token."""

    flops: int = 0
    """FLOPs of the matmuls it runs again (its part's F)."""
    traffic: int = 0
    """HBM bytes of the memory-bound kernels it runs again (norms, activation functions), counted under an
    explicit efficiency too."""
    matmuls: tuple[Matmul, ...] = ()
    """The products it runs again (the kernel model times their F)."""
    elementwise: int = 0
    """HBM bytes of its part's memory-bound kernels in F, which the kernel model times and an explicit efficiency
    leaves to itself."""
    collectives: int = 0
    """Tensor-parallel collectives it runs again (its part's F)."""
    all_to_all: int = 0
    """Expert-parallel all-to-alls it runs again (its part's F)."""
    saved: int = 0
    """Bytes F keeps no more."""
    core: bool = False
    """Whether it is the attention core: its FLOPs over the attended pairs run again, and without flash attention
    its probabilities are kept no more."""


def checkpointed(part: Part, kept_input: int) -> Redo:
    """A module checkpointed whole: its part's F again; F keeps only its input (``kept_input`` of its part's
    ``saved``, 0 where the part's saved bytes do not count the input)."""
    return Redo(flops=part.flops[0], collectives=part.collectives[0], all_to_all=part.all_to_all,
                saved=part.saved - kept_input, matmuls=part.matmuls, elementwise=part.elementwise[0])


def discarded(part: Part) -> Redo:
    """A module whose output is dropped and made again: its kernels' traffic (``Part.recomputed``)."""
    return Redo(traffic=part.recomputed[0], saved=part.recomputed[1])


def modules(arch: Architecture, e: int, index: int) -> dict[str, Redo]:
    """The modules block ``index`` has (``costmodel.model.RECOMPUTE_MODULES``), each recomputed alone: the attention
    core; the norms that are modules of their own (latent attention's input norm, the norm before the experts);
    latent attention's up-projections; the dense MLP with its fused norm, or the MoE layer (router, routed and
    shared experts, its input kept), the experts' activation functions and the shared experts."""
    experts = arch.experts is not None and arch.experts.layers[min(index, arch.layers - 1)]
    found = {"core_attn": Redo(core=True)}
    separate = bool(arch.latent) + experts
    if separate:
        found["layernorm"] = Redo(traffic=separate * norm(arch, e).recomputed[0],
                                  saved=separate * norm(arch, e).recomputed[1])
    if arch.latent:
        up = latent_up(arch, e)
        found["mla_up_proj"] = Redo(flops=up.flops[0], collectives=up.collectives[0], saved=up.saved,
                                    matmuls=up.matmuls, elementwise=up.elementwise[0])
    if not experts:
        found["mlp"] = checkpointed(mlp(arch, e), 0)
        return found
    found["moe"] = checkpointed(moe.router(arch, e) + moe.routed(arch, e) + moe.shared(arch, e), e * arch.hidden)
    found["moe_act"] = discarded(moe.routed(arch, e))
    if arch.experts is not None and arch.experts.shared_ffn:
        found["shared_experts"] = checkpointed(moe.shared(arch, e), 0)
    return found
