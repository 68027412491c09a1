"""The closed form's parts of a decoder block (``docs/cost-model.md``), per token on one device before tensor and
expert parallelism, written once for every decoder the estimate takes: attention (grouped-query heads, or
DeepSeek's latent attention) and the dense MLP, each with the norm before it and the hidden dropout after it.
``zbsolve.costmodel.moe`` adds the routed experts and a multi-token prediction layer's entry;
``zbsolve.costmodel.estimate`` turns a layer's parts into its costs per device.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from zbsolve.costmodel.hf_config import Architecture
from zbsolve.costmodel.kernels import Matmul


@dataclass(frozen=True)
class Part:
    """Per-token figures of one part of a layer on one device without tensor parallelism."""

    flops: tuple[int, int, int]
    """FLOPs a token of F, B and W: 2 per matmul weight the token passes through, in each."""
    saved: int
    """Bytes a token F keeps for the backward (M_B)."""
    for_w: int
    """Bytes a token W needs: its matmuls' inputs and output gradients (M_W)."""
    split: int
    """Parameters split over the tensor-parallel group (matmul weights and their biases)."""
    whole: int
    """Parameters each device of the group holds whole: norms, latent down-projections, the router."""
    collectives: tuple[int, int, int]
    """Tensor-parallel collectives (each of an h-wide activation) in F, B and W."""
    recomputed: tuple[int, int] = (0, 0)
    """Selective recomputation: bytes a token its norms and activation functions move when run again, and the
    bytes of their outputs F then keeps no more."""
    experts: int = 0
    """Parameters of all the routed experts, which the expert-parallel group shares out."""
    all_to_all: int = 0
    """Expert-parallel all-to-alls in F and in B each (dispatch and combine), none in W."""
    matmuls: tuple[Matmul, ...] = ()
    """Its weight matrices as the runtime's linear layers run them (the kernel model times each by shape)."""
    elementwise: tuple[int, int, int] = (0, 0, 0)
    """HBM bytes a token its memory-bound kernels (norms, residual adds, rotary, activation functions, routing)
    move in F, B and W: the kernel model times them, an explicit efficiency leaves them to itself."""
    launches: tuple[int, int, int] = (0, 0, 0)
    """Kernels its memory-bound work launches in F, B and W (its products' and the attention core's are counted
    from ``matmuls`` and the core by ``zbsolve.costmodel.estimate``)."""

    def __add__(self, other: Part) -> Part:
        """Both parts, run one after the other."""
        def joined(a: Any, b: Any, name: str) -> Any:  # a field of either part: a number, a tuple or the matmuls
            if name == "matmuls":
                return a + b
            return tuple(map(sum, zip(a, b))) if isinstance(a, tuple) else a + b
        return Part(**{f.name: joined(getattr(self, f.name), getattr(other, f.name), f.name)
                       for f in dataclasses.fields(self)})

    @property
    def params(self) -> int:
        """All its parameters on one device without parallelism."""
        return self.split + self.whole + self.experts


def half(arch: Architecture, e: int, inner: Part) -> Part:
    """A block's half (its attention or its MLP, ``inner``) with the norm before it (``norm``) and with hidden
    dropout the mask of the dropout after it (a byte an element); the residual add after it reads two activations and
writes one in F, and adds the two gradients in B."""
    h = arch.hidden
    return inner + norm(arch, e) + Part(flops=(0, 0, 0), saved=h * arch.hidden_dropout, for_w=0, split=0, whole=0,
                                        collectives=(0, 0, 0), elementwise=(3 * h * e, 3 * h * e, 0),
                                        launches=(1, 1, 0))


def norm(arch: Architecture, e: int) -> Part:
    """The norm before a block's half: F keeps its input, its parameters are whole on every device; selective
    recomputation runs it again (it reads and writes h) and its output is kept no more. F reads and writes h, B
    reads the input and the output gradient and writes the input gradient."""
    h = arch.hidden
    return Part(flops=(0, 0, 0), saved=e * h, for_w=0, split=0, whole=arch.norm_params, collectives=(0, 0, 0),
                recomputed=(2 * h * e, h * e), elementwise=(2 * h * e, 3 * h * e, 0), launches=(1, 1, 0))


def attention(arch: Architecture, e: int) -> Part:
    """The attention half of a block, its norm included: grouped-query heads, or latent attention."""
    return half(arch, e, _latent(arch, e) if arch.latent else _heads(arch, e))


def core_flops(arch: Architecture) -> int:
    """F's FLOPs of the attention core for one (query, key) pair: QKᵀ over the query/key head size, AV over the
    value head size, every head (4·a·d with heads of size d)."""
    value = arch.latent.v if arch.latent else arch.head_dim
    return 2 * arch.heads * (arch.head_dim + value)


def _heads(arch: Architecture, e: int) -> Part:
    """Grouped-query heads: q/k/v's input, Q, K, V and o's input kept (and the inputs of Qwen3-MoE's q and k norms,
    whose d weights each are whole); biases on q, k, v (``qkv_bias``) and on o (``biases``); gpt-oss's sink logit
    a head (``sinks``), split with the heads, its time within the attention core's; two collectives in F and B,
    one in W. Kernels: the fused q/k/v product and o; rotary on Q and K (read and written in F and in B), the q
    and k norms."""
    h, qd, kd = arch.hidden, arch.q_width, arch.kv_width
    weights = h * (qd + 2 * kd) + qd * h
    biases = (qd + 2 * kd) * (arch.qkv_bias or arch.biases) + h * arch.biases + arch.heads * arch.sinks
    rotary, norms = 2 * (qd + kd) * e, (qd + kd) * e * arch.qk_norm
    return Part(flops=(2 * weights,) * 3, saved=e * (h + 2 * qd + 2 * kd + (qd + kd) * arch.qk_norm),
                for_w=e * (h + qd + 2 * kd + qd + h), split=weights + biases, whole=2 * arch.head_dim * arch.qk_norm,
                collectives=(2, 2, 1),
                matmuls=(Matmul(h, qd + 2 * kd, fused_norm=True), Matmul(qd, h, "row", shared_input=True)),
                elementwise=(rotary + 2 * norms, rotary + 3 * norms, 0), launches=(1 + 2 * arch.qk_norm,) * 2 + (0,))


def _latent(arch: Architecture, e: int) -> Part:
    """Latent attention: h projected down to the query latent (q_rank) and to the key/value latent with the
    shared rotary key (kv_rank + rope), each latent normed and projected up to the heads (``latent_up``), then o.
    The down-projections and the latents' norms are whole on every device, as Megatron-LM keeps them; o is split by
    heads. Kept besides ``latent_up``'s: the down-projections' input, each latent before and after its norm, and o's
    input; the collectives of o in F and B. Kernels: the fused down-projection, o, the latents' norms."""
    h, a, m = arch.hidden, arch.heads, arch.latent
    assert m is not None
    down = h * (m.q_rank + m.kv_rank + m.rope)
    latents = (m.q_rank + m.kv_rank) * e
    return latent_up(arch, e) + Part(
        flops=(2 * (down + a * m.v * h),) * 3, saved=e * (h + 2 * m.q_rank + 2 * m.kv_rank + a * m.v),
        for_w=e * (2 * h + m.q_rank + m.kv_rank + m.rope + a * m.v), split=a * m.v * h,
        whole=down + m.q_rank + m.kv_rank, collectives=(1, 1, 0),
        matmuls=(Matmul(h, m.q_rank + m.kv_rank + m.rope, "whole"), Matmul(a * m.v, h, "row", shared_input=True)),
        elementwise=(2 * latents, 3 * latents, 0), launches=(2, 2, 0))


def latent_up(arch: Architecture, e: int) -> Part:
    """Latent attention's up-projections with the rotary embedding (Megatron-LM's ``mla_up_proj``): the query
    latent (h without one) and the key/value latent projected up to the heads, queries and keys of nope + rope,
    values of v, split by heads. Kept: their outputs Q, K and V; W needs their inputs and output gradients; a
    collective (the gather of their input) in each pass. Kernels: the two up-projections; rotary on the queries'
    and the shared key's rope parts."""
    h, a, m = arch.hidden, arch.heads, arch.latent
    assert m is not None
    qk = m.nope + m.rope
    up = (m.q_rank or h) * a * qk + m.kv_rank * a * (m.nope + m.v)
    rotary = 2 * (a + 1) * m.rope * e
    return Part(flops=(2 * up,) * 3, saved=e * (2 * a * qk + a * m.v),
                for_w=e * (m.q_rank + m.kv_rank + a * qk + a * (m.nope + m.v)), split=up, whole=0,
                collectives=(1, 1, 1), matmuls=(Matmul(m.q_rank or h, a * qk, fused_norm=bool(m.q_rank)),
                         Matmul(m.kv_rank, a * (m.nope + m.v), fused_norm=True)),
                elementwise=(rotary, rotary, 0), launches=(1, 1, 0))


def dense_mlp(arch: Architecture, e: int) -> Part:
    """The dense MLP half of a block, its norm included (``half``, ``mlp``)."""
    return half(arch, e, mlp(arch, e))


def mlp(arch: Architecture, e: int) -> Part:
    """A dense MLP: SwiGLU (gate, up, down: 3 matrices) or two matrices around a GeLU, of inner size f, with biases
    (``biases``). Kept: its input and its activation function's inputs and output (3·f gated, 2·f not), which W needs
    with the h-wide output gradient; selective recomputation runs the activation function again (it reads those and
    writes f). Kernels: the fused gate/up product (or fc1) and down (fc2); the activation function (``activation``)."""
    h, f = arch.hidden, arch.ffn
    matrices = 3 if arch.gated else 2
    return Part(flops=(2 * matrices * h * f,) * 3, saved=e * (h + matrices * f), for_w=e * (2 * h + matrices * f),
                split=matrices * h * f + (f + h) * arch.biases, whole=0, collectives=(2, 2, 1),
                recomputed=(e * matrices * f, e * f),
                matmuls=(Matmul(h, (matrices - 1) * f, fused_norm=True), Matmul(f, h, "row")),
                elementwise=activation(f, e, arch.gated), launches=(1, 1, 0))


def activation(f: int, e: int, gated: bool) -> tuple[int, int, int]:
    """HBM bytes a token of an activation function over ``f``: SwiGLU reads the gate and up outputs and writes
    their product in F, reads them and the product's gradient and writes their gradients in B; GeLU reads and
    writes f in F, reads f and its gradient and writes one in B."""
    return (3 * f * e, 5 * f * e, 0) if gated else (2 * f * e, 3 * f * e, 0)
