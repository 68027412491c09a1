"""Kernel-level times of a pass (``docs/cost-model.md``, "Times"): each weight matrix's products by shape, the
attention core at flash attention's throughput by head size and sequence, memory-bound kernels at a fused kernel's
share of HBM bandwidth (``Gpu.memory_bytes_per_s``). The constants (``zbsolve.costmodel.constants``) were fitted
to a lent H100's grid; flash attention's rates and the memory-bound share come from the preset's measured table
(``zbsolve.costmodel.measured``), the H100's scaled by the BF16 peaks for a preset without one. A ``Calibration``
scales the tensor-core kernels' seconds, the routed experts' grouped products' beyond them and the memory-bound
kernels' (1 unless told).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from zbsolve.costmodel.calibration import Calibration
from zbsolve.costmodel.constants import ATTENTION_B_FLOPS, ATTENTION_REFERENCE, K_HALF_BYTES, SPLIT_K_DEPTH, TILE
from zbsolve.costmodel.gpus import GPUS, Gpu
from zbsolve.costmodel.measured import kernel_table
from zbsolve.costmodel.routing import busiest


@dataclass(frozen=True)
class Matmul:
    """A weight matrix a token's activation passes through (``y = x·W``, W of ``k`` x ``n``), as a runtime's
    linear layer runs it: fused q/k/v and gate/up weights are one matrix."""

    k: int
    """Input width."""
    n: int
    """Output width."""
    split: str = "column"
    """How tensor parallelism splits it: "column" (n over tp, every token's row after the all-gather), "row" (k over
    tp), "whole" (every device the whole matrix, over its 1/tp of the tokens) or "expert" (routed experts:
    whole, over the tokens sent to the device's experts)."""
    fp8: bool = True
    """Whether Transformer Engine runs it in FP8 under ``dtype="fp8"`` (not the router, the head)."""
    shared_input: bool = False
    """Whether its input is also kept in 16 bits by another kernel (o's input: flash attention's output), so
    that FP8 saves a copy more instead of halving it."""
    copies: int = 1
    """Copies of each token it runs on (routed experts: top_k)."""
    fused_norm: bool = False
    """Whether the norm before it is fused into it and writes its input in FP8 under ``dtype="fp8"`` (Transformer
    Engine's ``LayerNormLinear``: Megatron's ``linear_qkv``, a dense MLP's ``linear_fc1``, latent attention's
    up-projections), so that no cast of its input runs."""


@dataclass(frozen=True)
class Kernels:
    """The kernel model of one GPU preset and dtype: seconds of products, attention and memory-bound kernels."""

    gpu: Gpu
    """The preset."""
    dtype: str
    """"bf16", "fp16" or "fp8"."""
    calibration: Calibration = Calibration()
    """Multipliers on the seconds of its tensor-core kernels (products, attention core) and memory-bound kernels."""

    def gemm(self, m: int, n: int, k: int, fp8: bool = False) -> float:
        """Seconds of a product of (m x k)·(k x n): the achievable rate times wave quantization of the
        output tiles (split-K where they leave SMs idle) times the inner size's depth, bounded below by the bytes
        the operands move at the fused memory rate."""
        if m * n * k == 0:
            return 0.0
        fp8 = fp8 and self.dtype == "fp8"
        if fp8:
            assert self.gpu.fp8_flops is not None, "a setup in FP8 is refused on a GPU without FP8 tensor cores"
            peak = self.gpu.fp8_flops * self.gpu.fp8_gemm_fraction
        else:
            peak = self.gpu.flops * self.gpu.gemm_fraction
        element = 1 if fp8 else 2
        tiles = math.ceil(m / TILE[0]) * math.ceil(n / TILE[1])
        split = max(1, min(self.gpu.sms // tiles, k // SPLIT_K_DEPTH)) if tiles < self.gpu.sms else 1
        units = tiles * split
        wave = units / (math.ceil(units / self.gpu.sms) * self.gpu.sms)
        depth = k / (k + K_HALF_BYTES / element)
        compute = 2 * m * n * k / (peak * wave * depth)
        return max(compute * self.calibration.scale("gemm"), self.memory((m * k + k * n) * element + m * n * 2))

    def matmul(self, mm: Matmul, tokens: int, tp: int, ep: int = 1, experts: int = 1) -> tuple[float, float, float]:
        """Seconds of F (x·W), B (the input gradient) and W (the weight gradient, the tokens as inner size) of
        ``mm`` over a microbatch of ``tokens`` on one device of ``tp`` (routed experts: ``experts`` of them shared
        out over ``ep``, the busiest device's token copies (``routing.busiest``) shared evenly among its own, each local
        expert's product timed on its own rows, its own waves and split-K, the experts' times summed: Transformer
        Engine's ``GroupedLinear`` runs one cuBLAS product per expert; the sum scaled by the calibration's
        ``grouped``)."""
        k, n, rows, groups, times = mm.k, mm.n, tokens, 1, 1.0
        if mm.split == "column":
            n = -(-n // tp)
        elif mm.split == "row":
            k = -(-k // tp)
        else:
            rows = -(-tokens // tp)
        if mm.split == "expert":
            groups, times = experts // ep, self.calibration.scale("grouped")
            rows = max(1, -(-busiest(rows * mm.copies, ep) // groups))
        return (groups * times * self.gemm(rows, n, k, fp8=mm.fp8), groups * times * self.gemm(rows, k, n, fp8=mm.fp8),
                groups * times * self.gemm(k, n, rows, fp8=mm.fp8))

    def attention(self, flops_f: float, head_dim: int, seq: int, flash: bool) -> tuple[float, float]:
        """Seconds of the attention core's F and B whose F counts ``flops_f`` over every attended pair (causal
        pairs counted twice less the diagonal, as the estimate counts them): under flash attention the causal half
        at the measured rate of the head size and sequence (scaled by the preset's BF16 peak); without it every
        score at the BF16 product rate."""
        times = self.calibration.scale("gemm")
        if not flash:
            rate = self.gpu.flops * self.gpu.gemm_fraction
            return flops_f / rate * times, 2 * flops_f / rate * times
        f, b = attention_rate(head_dim, seq, self.gpu.measured)
        scale = self.gpu.flops / GPUS[self.gpu.measured].flops
        return flops_f / 2 / (f * scale) * times, ATTENTION_B_FLOPS * flops_f / 2 / (b * scale) * times

    def memory(self, traffic: float) -> float:
        """Seconds of memory-bound kernels moving ``traffic`` bytes over HBM at a fused kernel's rate."""
        return traffic / self.gpu.memory_bytes_per_s * self.calibration.scale("memory_bound")


def attention_rate(head_dim: int, seq: int, measured: str = "h100") -> tuple[float, float]:
    """The F and B flash-attention FLOP/s of the ``measured`` preset's table for heads of ``head_dim`` at sequence
    ``seq``: the reference head size's, linear in log2 of the sequence between the measured ones (the nearest
    outside them), times the ratio of the nearest measured head size's rate to the reference's at 4096."""
    table = kernel_table(measured).attention
    reference = table[ATTENTION_REFERENCE]
    seqs = sorted(reference)
    x = min(max(math.log2(max(seq, 1)), math.log2(seqs[0])), math.log2(seqs[-1]))
    i = min(bisect.bisect_right([math.log2(s) for s in seqs], x), len(seqs) - 1)
    lo, hi = seqs[i - 1], seqs[i]
    share = (x - math.log2(lo)) / (math.log2(hi) - math.log2(lo))
    f, b = (reference[lo][j] + share * (reference[hi][j] - reference[lo][j]) for j in (0, 1))
    nearest = min(table, key=lambda d: (abs(d - head_dim), d))
    at = table[nearest][4096]
    return f * at[0] / reference[4096][0], b * at[1] / reference[4096][1]


def product_launches(matmuls: tuple[Matmul, ...], local_experts: int, fp8: bool) -> tuple[int, int, int]:
    """Kernels the products of ``matmuls`` launch in F, B and W: one a product in each pass, one a local expert for
    routed experts (Transformer Engine's ``GroupedLinear`` runs one cuBLAS product per expert); under ``fp8`` the
    casts of ``fp8_casts``, one a product (a grouped product's in one multi-tensor kernel)."""
    products = sum(local_experts if mm.split == "expert" else 1 for mm in matmuls)
    casts = (sum(1 for mm in matmuls if mm.fp8 and not mm.fused_norm), sum(1 for mm in matmuls if mm.fp8), 0)
    return (products + casts[0] * fp8, products + casts[1] * fp8, products)


def fp8_saved(matmuls: tuple[Matmul, ...], e: int) -> tuple[int, int]:
    """Bytes a token F keeps (M_B) and W needs (M_W) more under FP8: Transformer Engine saves an FP8 product's input
    cast to FP8 for its weight gradient, in place of the 16-bit one (``e - 1`` bytes less an element), or beside it
    where another kernel keeps that (one more; W then needs only the FP8 copy)."""
    kept = sum((1 if mm.shared_input else 1 - e) * mm.k * mm.copies for mm in matmuls if mm.fp8)
    return kept, sum((1 - e) * mm.k * mm.copies for mm in matmuls if mm.fp8)


def fp8_casts(matmuls: tuple[Matmul, ...], e: int) -> tuple[int, int, int]:
    """HBM bytes a token Transformer Engine's FP8 casts move in F, B and W (``transformer_engine/pytorch/module/
    linear.py``, ``grouped_linear.py``: the input and output-gradient quantizers, ``cast_transpose``): F casts each
    FP8 product's ``e``-byte input to FP8 in both layouts (rowwise for the product, columnwise for W's), unless a
    fused norm wrote it in FP8; B casts each one's output gradient the same way for B's and W's products. The
    weights' casts run once a step (cached across microbatches) and are left out."""
    f = sum((e + 2) * mm.k * mm.copies for mm in matmuls if mm.fp8 and not mm.fused_norm)
    return f, sum((e + 2) * mm.n * mm.copies for mm in matmuls if mm.fp8), 0
