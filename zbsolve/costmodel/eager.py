"""A block's memory-bound kernels as eager PyTorch runs torchtitan's Llama block (``docs/cost-model.md``, "Eager
kernels"): without ``torch.compile`` each elementwise op and reduction of the module's code is a kernel of its own,
reading its inputs and writing its output at its dtype, and autograd runs each op's derivative formula
(``tools/autograd/derivatives.yaml``) as kernels of their own in B, where ``block`` counts the fused kernels a
compiled or Megatron-LM block runs.

Counted from torchtitan 9dec370's ``torchtitan/models/llama/model.py`` (``TransformerBlock``, ``Attention``,
``apply_rotary_emb``, ``repeat_kv``, ``FeedForward``) and ``torchtitan/models/norms.py`` (``RMSNorm``: the norm in
FP32, ``_norm(x.float()).type_as(x) * weight``), per token of ``e``-byte activations: bytes moved and kernels
launched in F and B (W runs only the weights' products). Per-token scalars (the norm's mean and its inverse root)
move bytes too few to count and are counted as kernels alone.
"""

from __future__ import annotations

from zbsolve.costmodel.constants import FP32_BYTES
from zbsolve.costmodel.hf_config import Architecture

Traffic = tuple[tuple[int, int, int], tuple[int, int, int]]
"""HBM bytes a token and kernels launched, each in F, B and W."""


def rms_norm(h: int, e: int) -> Traffic:
    """torchtitan's ``RMSNorm`` of an h-wide token. F: ``x.float()``, ``pow(2)``, ``mean``, ``+ eps``, ``rsqrt``,
    ``x * rsqrt``, ``type_as(x)``, ``* weight`` (8 kernels). B: the weight's product backward (the input gradient,
    the weight's gradient and its sum over the tokens, 3), the cast to FP32 (1), the FP32 product's (its input
    gradient, the inverse root's product and its sum over h, 3), the inverse root's (3 on per-token scalars),
    ``mean``'s (the gradient spread over h, 1), ``pow``'s (``grad * (2 * x.pow(1))``: a copy and two products, 3),
    the two gradients of the FP32 input added (1) and the cast back (1): 16 kernels."""
    f32 = FP32_BYTES
    forward = (e + f32) * h + 2 * f32 * h + f32 * h + 2 * f32 * h + (f32 + e) * h + 2 * e * h
    backward = (6 * e * h + (e + f32) * h + 6 * f32 * h + f32 * h + 7 * f32 * h + 3 * f32 * h + (f32 + e) * h)
    return (forward, backward, 0), (8, 16, 0)


def rotary(width: int, e: int) -> Traffic:
    """``apply_rotary_emb`` on a ``width``-wide tensor (Q or K): cast to FP32, the complex product with the
    frequencies (a position's, shared by every head: not counted), cast back; B the same three (the product's
    gradient by the conjugate frequencies)."""
    moved = (e + FP32_BYTES) * width + 2 * FP32_BYTES * width + (FP32_BYTES + e) * width
    return (moved, moved, 0), (3, 3, 0)


def llama_block(arch: Architecture, e: int) -> Traffic:
    """The memory-bound kernels of torchtitan's Llama ``TransformerBlock`` in eager PyTorch: two ``RMSNorm``;
    rotary on Q and K; ``repeat_kv``'s copies of K and V to every query head (``expand`` then ``reshape``; none
    where the heads are as many), summed back over the copies in B; ``silu(w1(x)) * w3(x)`` (2 kernels; B: the
    product's two gradients and ``silu``'s, 3); the two residual adds. In B autograd adds the gradients of each
    tensor read by more than one op: the block's input and h (a norm and a residual add each), the attention
    norm's output (wq, wk, wv: 2 adds) and the MLP norm's (w1, w3: 1), 5 adds. The flash attention core's output
    needs no copy (``output.transpose(1, 2).contiguous()`` restores the layout torch's flash kernel wrote)."""
    h, qd, kd, f = arch.hidden, arch.q_width, arch.kv_width, arch.ffn
    norm, q, k = rms_norm(h, e), rotary(qd, e), rotary(kd, e)
    repeats = qd != kd
    repeat = 2 * e * (qd + kd) * repeats
    forward = 2 * norm[0][0] + q[0][0] + k[0][0] + repeat + 5 * e * f + 2 * 3 * e * h
    backward = 2 * norm[0][1] + q[0][1] + k[0][1] + repeat + 9 * e * f + 5 * 3 * e * h
    kernels_f = 2 * norm[1][0] + q[1][0] + k[1][0] + 2 * repeats + 2 + 2
    kernels_b = 2 * norm[1][1] + q[1][1] + k[1][1] + 2 * repeats + 3 + 5
    return (forward, backward, 0), (kernels_f, kernels_b, 0)


def takes(arch: Architecture) -> bool:
    """Whether ``llama_block`` counts the blocks of ``arch``: dense, grouped-query attention without q/k norms or
    biases, a SwiGLU MLP (the blocks torchtitan's Llama model runs)."""
    return (arch.experts is None and not arch.latent and arch.gated and not arch.qk_norm and not arch.biases
            and not arch.qkv_bias and not arch.sinks)
