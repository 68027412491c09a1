"""One layer's costs before the estimate turns them into times (``zbsolve.costmodel.estimate``): the record of
a layer's FLOPs, memory-bound traffic, collectives, activation and parameter bytes per pass (``LayerCosts``), the
microbatch's share on one device (``Shard``), what each tensor-parallel collective can hide behind under overlap
(``hiding``), and the layers around the blocks: the embedding, the final norm and the head with its loss.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from zbsolve.costmodel import counting
from zbsolve.costmodel.constants import FP32_BYTES, ID_BYTES, LOSS_GRAD_COPIES, LOSS_KEPT_BYTES
from zbsolve.costmodel.hf_config import Architecture
from zbsolve.costmodel.kernels import Kernels, Matmul

Hiding = tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]]
"""Per pass (F, B, W), seconds each of its first collectives can hide behind (``LayerCosts.hiding``)."""


@dataclass(frozen=True)
class LayerCosts:
    """One layer's costs before they become times: per pass (F, B, W) its FLOPs, its HBM traffic in bytes
    (memory-bound work) and its tensor-parallel collectives; its activation bytes M_B and M_W, its parameters and
    the bytes of its output."""

    flops: tuple[int, int, int]
    traffic: tuple[int, int, int]
    collectives: tuple[int, int, int]
    m_b: int
    m_w: int
    params: int
    out_bytes: int
    selective: tuple[int, int] | None = None
    expert_params: int = 0
    all_to_all: tuple[int, int, int] | None = None
    modules: dict[str, tuple[LayerCosts, int]] | None = None
    """Megatron's recomputed modules: what each runs again (as an F) and the bytes F keeps no more."""
    kernel: tuple[float, float, float] = (0.0, 0.0, 0.0)
    """Seconds of each pass's kernels under the kernel model (products, attention core, memory-bound kernels)."""
    fp8_params: int = 0
    """Parameters of its FP8 products on the device (under ``dtype="fp8"``)."""
    hiding: Hiding = ((), (), ())
    """Per pass, seconds each of its first collectives can hide behind under TP communication overlap
    (``hiding``); a collective past them hides behind none."""
    ring: tuple[float, float] = (0.0, 0.0)
    """Seconds of F's and B's context-parallel key/value exchanges left exposed (``context.exposed``)."""
    held_b: int = 0
    """Bytes its B holds while it runs above what F kept (the loss's fp32 gradients of the logits)."""
    launches: tuple[int, int, int] = (0, 0, 0)
    """Kernels each pass launches (``Timing.seconds``: a gap after each, and no faster than their launches)."""


def hiding(matmuls: tuple[Matmul, ...], times: list[tuple[float, float, float]], collectives: tuple[int, int, int],
            tp: int) -> Hiding:
    """Per pass, the seconds each collective can hide behind: (tp - 1)/tp of the product it overlaps, which the
    overlap runs in tp chunks, one of them without a transfer beside it. The products: in F and B the column- and
    row-parallel ones in order (an all-gather before a column-parallel product, a reduce-scatter after a
    row-parallel one, and their transposes), in W the column-parallel ones (the all-gather of their input for the
    weight gradient); a collective left without one overlaps none."""
    hiding = []
    for p, count in enumerate(collectives):
        kinds = ("column", "row") if p < 2 else ("column",)
        products = [t[p] * (tp - 1) / tp for mm, t in zip(matmuls, times) if mm.split in kinds]
        hiding.append(tuple(products[:count]))
    f, b, w = hiding
    return f, b, w


@dataclass(frozen=True)
class Shard:
    """A microbatch's ``tokens`` tokens on one device of ``tp`` (and of ``ep`` for the ``experts`` routed experts,
    and of ``cp``: the device's share of the sequence), its kernels timed by ``kernels``, a key/value chunk's
    exchange round the context-parallel ring taking ``ring`` seconds, under ``runtime`` (whose loss and experts'
    combine the activations follow): what a per-token size comes to."""

    tokens: int
    tp: int
    ep: int
    kernels: Kernels
    experts: int
    cp: int = 1
    ring: float = 0.0
    runtime: str = "megatron"

    def bytes(self, per_token: int) -> int:
        """Bytes of an activation of ``per_token`` bytes a token, split over the tensor-parallel group
        (sequence parallelism: each device holds a 1/tp slice, rounded up)."""
        return -(-self.tokens * per_token // self.tp)


def with_counts(part: LayerCosts, counts: counting.Counts, tp: int) -> LayerCosts:
    """``part`` with the counted FLOPs and activation bytes, each divided over the ``tp`` devices (rounded up)."""
    f, b, w = (-(-flops // tp) for flops in counts.flops)
    return dataclasses.replace(part, flops=(f, b, w), m_b=-(-counts.m_b // tp), m_w=-(-counts.m_w // tp))


def embedding_costs(arch: Architecture, shard: Shard, e: int) -> LayerCosts:
    """A gather: no FLOPs; F reads the rows and writes the output, W reads the output gradient and reads and
    writes fp32 gradient rows (scatter-add); B has nothing to do (its input is token ids). A kernel in F and W."""
    n, h, t = shard.tokens, arch.hidden, shard.tp
    ids = n * ID_BYTES
    grad = shard.bytes(h * e)
    params = -(-arch.vocab // t) * h + arch.positions * h
    traffic = (2 * n * h * e, 0, n * h * (e + 2 * FP32_BYTES))
    return LayerCosts(flops=(0, 0, 0), traffic=traffic,
                  collectives=(1, 0, 1) if t > 1 else (0, 0, 0), m_b=ids, m_w=ids + grad, params=params,
                  out_bytes=shard.bytes(h * e), kernel=streamed(shard, traffic), launches=(1, 0, 1))


def streamed(shard: Shard, traffic: tuple[int, int, int]) -> tuple[float, float, float]:
    """Seconds of each pass's memory-bound ``traffic`` under the kernel model."""
    f, b, w = map(shard.kernels.memory, traffic)
    return f, b, w


def probability_bytes(arch: Architecture, e: int, seq_len: int, flash_attention: bool) -> int:
    """Bytes a token attention keeps without flash attention: its softmax probabilities over all s keys (and with
    attention dropout also its mask and output); none with flash attention."""
    if flash_attention:
        return 0
    return e * arch.heads * seq_len + (arch.heads * seq_len + e * arch.heads * seq_len) * arch.attention_dropout


def norm_costs(arch: Architecture, shard: Shard, e: int) -> LayerCosts:
    """Memory-bound: F reads and writes the activation, B reads it and the output gradient and writes the input
    gradient (and its weight gradient: only matmul weights wait for W). A kernel in F and B."""
    slice_bytes = shard.bytes(arch.hidden * e)
    traffic = (2 * slice_bytes, 3 * slice_bytes, 0)
    return LayerCosts(flops=(0, 0, 0), traffic=traffic, collectives=(0, 0, 0),
                  m_b=slice_bytes, m_w=0, params=arch.norm_params, out_bytes=slice_bytes,
                  kernel=streamed(shard, traffic), launches=(1, 1, 0))


def output_costs(arch: Architecture, shard: Shard, e: int) -> LayerCosts:
    """The head's matmul (2·tokens·h·V FLOPs in each of F, B and W, V split over tp) and the loss as the runtime
    computes it: F keeps ``LOSS_KEPT_BYTES`` a logit (Megatron: the 16-bit logits holding their gradient,
    Transformer Engine's fused cross entropy; torchtitan: fp32 log-probabilities), W keeps the logits' gradient
    with the head's input; while it runs B holds ``LOSS_GRAD_COPIES`` fp32 gradients of the logits beside. The
    product stays in 16 bits under FP8 (Megatron-LM's default keeps the head out of FP8). Kernels: the product in
    each pass, the log-softmax and the loss in F, their backwards in B."""
    n, h, t = shard.tokens, arch.hidden, shard.tp
    vocab = -(-arch.vocab // t)
    matmul = 2 * n * h * vocab
    logits = n * vocab
    x = shard.bytes(h * e)
    traffic = (logits * (e + FP32_BYTES), logits * (FP32_BYTES + e), 0)
    head = Matmul(h, arch.vocab, fp8=False)
    product = shard.kernels.matmul(head, n, t)
    collectives = (1, 1, 1) if t > 1 else (0, 0, 0)
    return LayerCosts(flops=(matmul, matmul, matmul), traffic=traffic,
                  collectives=collectives, m_b=x + logits * LOSS_KEPT_BYTES[shard.runtime], m_w=x + logits * e,
                  params=vocab * h, out_bytes=FP32_BYTES, hiding=hiding((head,), [product], collectives, t),
                  held_b=LOSS_GRAD_COPIES[shard.runtime] * logits * FP32_BYTES,
                  kernel=_added(product, streamed(shard, traffic)), launches=(3, 3, 1))


def _added(x: tuple[float, float, float], y: tuple[float, float, float]) -> tuple[float, float, float]:
    """Per pass, the seconds of ``x`` and ``y`` together."""
    return x[0] + y[0], x[1] + y[1], x[2] + y[2]
