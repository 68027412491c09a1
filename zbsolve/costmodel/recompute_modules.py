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
from zbsolve.costmodel.constants import COMBINE_KEPT_COPIES
from zbsolve.costmodel.hf_config import Architecture
from zbsolve.costmodel.kernels import Matmul
from zbsolve.costmodel.model import OP_POLICY

LSE_BYTES = 4
"""Bytes of flash attention's log-sum-exp a token and head (FP32), which its forward returns beside its output."""


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
    kept: int | None = None
    """Bytes a token F still keeps, where the policy names what it keeps (torchtitan's per-op policy): F keeps no
    more the rest of the block's M_B (its attention probabilities, where kept, stay); None where ``saved`` says
    what it drops."""
    launches: int = 0
    """Kernels it launches again (none counted where not given)."""


def checkpointed(part: Part, kept_input: int) -> Redo:
    """A module checkpointed whole: its part's F again; F keeps only its input (``kept_input`` of its part's
    ``saved``, 0 where the part's saved bytes do not count the input)."""
    return Redo(flops=part.flops[0], collectives=part.collectives[0], all_to_all=part.all_to_all,
                saved=part.saved - kept_input, matmuls=part.matmuls, elementwise=part.elementwise[0])


def discarded(part: Part) -> Redo:
    """A module whose output is dropped and made again: its kernels' traffic (``Part.recomputed``)."""
    return Redo(traffic=part.recomputed[0], saved=part.recomputed[1])


def modules(arch: Architecture, e: int, index: int, block: Part | None = None) -> dict[str, Redo]:
    """The modules block ``index`` has (``costmodel.model.RECOMPUTE_MODULES``), each recomputed alone: the attention
    core; the norms that are modules of their own (latent attention's input norm, the norm before the experts);
    latent attention's up-projections; the dense MLP with its fused norm, or the MoE layer (router, routed and
    shared experts, its input kept), the experts' activation functions and the shared experts; and in a dense block
    of grouped-query attention and a gated MLP, torchtitan's per-op policy (``op``, ``OP_POLICY``), its memory-bound
    kernels those of ``block`` (default: the fused block's, ``moe.block``)."""
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
        if not arch.latent and arch.gated:
            found[OP_POLICY] = op(arch, e, block)
        return found
    routed = moe.routed(arch, e, combined=COMBINE_KEPT_COPIES["megatron"])
    found["moe"] = checkpointed(moe.router(arch, e) + routed + moe.shared(arch, e), e * arch.hidden)
    found["moe_act"] = discarded(moe.routed(arch, e))
    if arch.experts is not None and arch.experts.shared_ffn:
        found["shared_experts"] = checkpointed(moe.shared(arch, e), 0)
    return found


def op(arch: Architecture, e: int, block: Part | None = None) -> Redo:
    """torchtitan's per-op selective activation checkpointing of a dense block of grouped-query attention and a
    SwiGLU MLP (``SelectiveAC``, torchtitan 0.3.0 ``torchtitan/distributed/activation_checkpoint.py``; the same rule
    as its ``_apply_ac_to_transformer_block`` "op" at 9dec370): F keeps the outputs of the ops in its save list
    (matmuls, flash attention, reduce-scatter, ``max``) except every second matmul of the block, counted from 1 in
    the order the forward runs them (``meta[mm_count_key] % 2 == 0``: recomputed), and its input; everything else
    runs again in B. torchtitan's llama3 block (``models/common/attention.py`` ``QKVLinear.forward``: wq, wk, wv;
    ``GQAttention.forward``: the core, then wo; ``models/common/feed_forward.py``: ``w2(silu(w1(x)) * w3(x))``)
    runs q, k, v, o, w1, w3, w2: q, v, w1 and w2 are kept, k, o and w3 run again. So F keeps a token's block input
    (h), q and o's input (the core's output, qd each), v (kd), w1's output (f), w2's output (h) and the core's
    log-sum-exp (``LSE_BYTES`` a head); B runs again k, o and w3, every memory-bound kernel of the block's F (its
    norms, rotary, residual adds, SwiGLU) and, under tensor parallelism, the all-gathers of the two halves' inputs
    (not in the save list; their reduce-scatters are). Those kernels are ``block``'s F (default: the fused block's,
    ``moe.block``; eager PyTorch's: ``costmodel.eager``)."""
    h, qd, kd, f = arch.hidden, arch.q_width, arch.kv_width, arch.ffn
    again = (Matmul(h, kd), Matmul(qd, h, "row", shared_input=True), Matmul(h, f))
    whole = block or moe.block(arch, e, 0)
    return Redo(flops=2 * sum(mm.k * mm.n for mm in again), matmuls=again, elementwise=whole.elementwise[0],
                collectives=2, kept=e * (2 * h + 2 * qd + kd + f) + LSE_BYTES * arch.heads,
                launches=whole.launches[0] + len(again))
