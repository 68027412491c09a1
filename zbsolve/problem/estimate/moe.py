"""The closed form's parts of a mixture-of-experts decoder's layers (``docs/cost-model.md``, "Mixture of experts"),
per token on one device before tensor and expert parallelism: attention (grouped-query or DeepSeek's latent
attention), the MLP (dense, or routed and shared experts with their router), the entry of a multi-token prediction
layer, and the bytes of an expert-parallel all-to-all; and the settings a mixture-of-experts estimate refuses.
``zbsolve.problem.estimate.formula`` turns a layer's parts into its costs per device.

Routing is assumed balanced: every device of the expert-parallel group receives as many tokens as it sends, so
each processes ``top_k`` expert MLPs per token of its own microbatch. Experts are not split by tensor parallelism
(Megatron-LM's ``--expert-tensor-parallel-size 1``): a device holds ``E / ep`` whole experts, and its tokens
(``1/tp`` of the microbatch under sequence parallelism) are dispatched to them by all-to-all.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from zbsolve.base.errors import InputError
from zbsolve.problem.estimate.gpus import LINKS
from zbsolve.problem.estimate.hf_config import Architecture

FP32_BYTES = 4
"""Bytes of the router's fp32 probabilities and of the top-k weights (every router here takes its softmax or
sigmoid in fp32)."""


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
    """Parameters split over the tensor-parallel group."""
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

    def __add__(self, other: Part) -> Part:
        """Both parts, run one after the other."""
        return Part(*(tuple(map(sum, zip(a, b))) if isinstance(a, tuple) else a + b
                      for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other))))

    @property
    def params(self) -> int:
        """All its parameters on one device without parallelism."""
        return self.split + self.whole + self.experts


def check(arch: Architecture, method: str, replicas: int, ep: int, a2a_link: str | None) -> None:
    """Refuse expert parallelism and an all-to-all link without experts, an ``ep`` that does not divide the
    routed experts (or, ``replicas`` = tp·dp under ZeRO-1, those replicas), and counting experts."""
    experts = arch.experts
    if experts is None:
        if ep > 1 or a2a_link is not None:
            what = f"ep = {ep}" if ep > 1 else f"a2a_link = {a2a_link!r}"
            raise InputError(f"{what}: model_type {arch.model_type!r} has no experts (expert parallelism needs a "
                             "mixture-of-experts model)")
        return
    if a2a_link is not None and a2a_link not in LINKS:
        raise InputError(f"a2a_link = {a2a_link!r}: should be one of {', '.join(LINKS)}")
    if experts.routed % ep:
        raise InputError(f"ep = {ep}: should divide {experts.key} = {experts.routed} (each device holds "
                         "as many whole experts)")
    if replicas % ep:
        raise InputError(f"ep = {ep}: should divide tp·dp = {replicas} under zero = 1 (the experts' optimizer "
                         "states are sharded over their tp·dp/ep replicas)")
    if method == "count":
        raise InputError(f"method = 'count': {arch.model_type}'s experts route tokens by their values, which the "
                         "meta device counting runs on lacks; use --method formula")


def split_by_tp(arch: Architecture) -> list[tuple[str, int]]:
    """The sizes tensor parallelism splits, by their config key: heads, and the inner sizes of dense MLPs and of
    the shared experts (routed experts stay whole)."""
    sizes = [("num_attention_heads", arch.heads), ("num_key_value_heads", arch.kv_heads)]
    experts = arch.experts
    if experts is None or not all(experts.layers):
        sizes.append(("intermediate_size", arch.ffn))
    if experts is not None and experts.shared_ffn:
        sizes.append(("the shared experts' inner size", experts.shared_ffn))
    return sizes


def attention(arch: Architecture, e: int) -> Part:
    """The attention half of a block, its norm included: grouped-query heads, or latent attention."""
    return _latent(arch, e) if arch.latent else _heads(arch, e)


def core_flops(arch: Architecture) -> int:
    """F's FLOPs of the attention core for one (query, key) pair: QKᵀ over the query/key head size, AV over the
    value head size, every head (4·a·d with heads of size d)."""
    value = arch.latent.v if arch.latent else arch.head_dim
    return 2 * arch.heads * (arch.head_dim + value)


def _heads(arch: Architecture, e: int) -> Part:
    """As the dense block's: its norm's input, q/k/v's input, Q, K, V and o's input kept (and the inputs of
    Qwen3-MoE's q and k norms); two collectives in F and B, one in W."""
    h, qd, kd = arch.hidden, arch.q_width, arch.kv_width
    weights = h * (qd + 2 * kd) + qd * h
    return Part(flops=(2 * weights,) * 3, saved=e * (2 * h + 2 * qd + 2 * kd + (qd + kd) * arch.qk_norm),
                for_w=e * (h + qd + 2 * kd + qd + h), split=weights + (qd + 2 * kd) * arch.qkv_bias,
                whole=h + 2 * arch.head_dim * arch.qk_norm, collectives=(2, 2, 1), recomputed=(2 * h * e, h * e))


def _latent(arch: Architecture, e: int) -> Part:
    """Latent attention: h projected down to the query latent (q_rank) and to the key/value latent with the
    shared rotary key (kv_rank + rope), each latent normed and projected up to the heads (queries and keys of
    nope + rope, values of v), then o. The down-projections and the latents' norms are whole on every device, as
    Megatron-LM keeps them; the up-projections and o are split by heads. Kept: the block norm's and the
    down-projections' input, each latent before and after its norm, Q, K, V and o's input."""
    h, a, m = arch.hidden, arch.heads, arch.latent
    assert m is not None
    qk = m.nope + m.rope
    down = h * (m.q_rank + m.kv_rank + m.rope)
    up = (m.q_rank or h) * a * qk + m.kv_rank * a * (m.nope + m.v) + a * m.v * h
    return Part(flops=(2 * (down + up),) * 3,
                saved=e * (2 * h + 2 * m.q_rank + 2 * m.kv_rank + 2 * a * qk + 2 * a * m.v),
                for_w=e * (2 * h + 2 * m.q_rank + 2 * m.kv_rank + m.rope + a * qk + a * (m.nope + m.v) + a * m.v),
                split=up, whole=down + h + m.q_rank + m.kv_rank, collectives=(2, 2, 1),
                recomputed=(2 * h * e, h * e))


def mlp(arch: Architecture, e: int, experts: bool) -> Part:
    """The MLP half of a block, its norm included: routed experts where ``experts``, else a dense SwiGLU MLP."""
    return _experts(arch, e) if experts else _dense(arch, e)


def _dense(arch: Architecture, e: int) -> Part:
    """A SwiGLU MLP of inner size f, as the dense block's."""
    h, f = arch.hidden, arch.ffn
    return Part(flops=(6 * h * f,) * 3, saved=e * (2 * h + 3 * f), for_w=e * (2 * h + 3 * f), split=3 * h * f,
                whole=h, collectives=(2, 2, 1), recomputed=(e * (2 * h + 3 * f), e * (h + f)))


def _experts(arch: Architecture, e: int) -> Part:
    """The router (h x E, and Qwen2-MoE's h x 1 shared-expert gate), ``top_k`` routed SwiGLU experts of inner size
    f_e and the shared experts (inner size f_s, split over tp as a dense MLP) on every token.

    Kept by F, a token: the norm's and the MLP's input (h each), the router's fp32 probabilities (E) and top-k
    weights (k), the k dispatched copies of the token (k·h), each expert's gate and up outputs and down input
    (3·f_e), the experts' outputs the combine weighs (k·h), the shared experts' 3·f_s (and, gated, their output h
    and the gate). W needs the router's input and output gradient, each expert's inputs and output gradients
    (k·(2h + 3·f_e)), the shared experts' (3·f_s + h) and the gate's output gradient."""
    h, x = arch.hidden, arch.experts
    assert x is not None
    k, fe, fs = x.top_k, x.ffn, x.shared_ffn
    router = h * x.routed + h * x.shared_gate
    saved = e * (2 * h + 2 * k * h + 3 * k * fe + 3 * fs + (h + 1) * x.shared_gate) + FP32_BYTES * (x.routed + k)
    for_w = e * (h + x.routed + k * (2 * h + 3 * fe) + (3 * fs + h) * (fs > 0) + x.shared_gate)
    return Part(flops=(2 * (3 * h * (k * fe + fs) + router),) * 3, saved=saved, for_w=for_w, split=3 * h * fs,
                whole=router + h, collectives=(2, 2, 1) if fs else (0, 0, 0),
                recomputed=(e * (2 * h + 3 * (k * fe + fs)), e * (h + k * fe + fs)), experts=3 * h * fe * x.routed,
                all_to_all=2)


def block(arch: Architecture, e: int, index: int) -> Part:
    """Block ``index`` (a multi-token prediction layer's block for an index past the last: of the last's kind)."""
    assert arch.experts is not None
    return attention(arch, e) + mlp(arch, e, arch.experts.layers[min(index, arch.layers - 1)])


def projection(arch: Architecture, e: int) -> Part:
    """A multi-token prediction layer's entry (DeepSeek-V3, Megatron-LM's ``eh_proj``): the hidden state and the
    next token's embedding, each normed, concatenated and projected from 2h to h (split over tp). Kept: the two
    norms' inputs and the projection's 2h-wide input; W needs that input and the h-wide output gradient. Under
    tensor parallelism an all-gather of the 2h-wide input and one of the output in F, their transposes in B, the
    input gathered again in W: 3, 3 and 2 h-wide collectives."""
    h = arch.hidden
    return Part(flops=(4 * h * h,) * 3, saved=e * 4 * h, for_w=e * 3 * h, split=2 * h * h, whole=2 * h,
                collectives=(3, 3, 2))


def active(part: Part, arch: Architecture) -> int:
    """The parameters of ``part`` a token uses: all but the routed experts it is not sent to."""
    x = arch.experts
    return part.params - (part.experts - part.experts // x.routed * x.top_k if x else 0)


def all_to_all_bytes(tokens: int, arch: Architecture, e: int, ep: int) -> int:
    """Bytes a device sends in one dispatch or combine: of its ``tokens``' top_k copies of h, the (ep - 1)/ep
    that go to other devices' experts under balanced routing."""
    assert arch.experts is not None
    return tokens * arch.experts.top_k * arch.hidden * e * (ep - 1) // ep
