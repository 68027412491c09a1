"""The kernel model (zbsolve.costmodel.kernels) against the matrix products and flash attention measured on
a lent H100 (problems/measured/h100/kernels.json), and its rules on their own."""

from __future__ import annotations

import json
import statistics

import pytest

from conftest import ROOT
from zbsolve.costmodel.gpus import GPUS
from zbsolve.costmodel import estimate as estimate_module
from zbsolve.costmodel.estimate import estimate
from zbsolve.costmodel.kernels import TILE, Kernels, Matmul, attention_rate, fp8_casts
from zbsolve.costmodel.routing import busiest

MEASURED = json.loads((ROOT / "problems" / "measured" / "h100" / "kernels.json").read_text())
H100 = GPUS["h100"]


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_gemm_model_against_the_measured_grid(dtype):
    """Over the 605 shapes of each dtype the model's time is within 6% of the measured one at the median and
    within 40% for nine shapes in ten (docs/cost-model.md gives the figures)."""
    kernels = Kernels(H100, dtype)
    errors = sorted(abs(kernels.gemm(g["m"], g["n"], g["k"], fp8=dtype == "fp8") / (g["ms"] * 1e-3) - 1)
                    for g in MEASURED["gemm"] if g["dtype"] == dtype)
    assert len(errors) == 605
    assert statistics.median(errors) <= 0.06
    assert errors[int(0.9 * len(errors))] <= 0.40


def test_attention_rate_is_the_measured_one_at_measured_points():
    for a in MEASURED["attention"]:
        f, b = attention_rate(a["head_dim"], a["seq"])
        assert f == pytest.approx(a["f_tflops"] * 1e12, rel=0.01) and b == pytest.approx(a["b_tflops"] * 1e12, rel=0.01)


def test_gemm_rules():
    """Full waves run faster per FLOP than a wave left mostly idle; FP8 faster than BF16 on a large product, and
    only under dtype fp8; a deep inner size faster per FLOP than a shallow one; nothing for an empty product."""
    bf16, fp8 = Kernels(H100, "bf16"), Kernels(H100, "fp8")
    columns = 4 * TILE[1]  # 4 tiles a row of tiles: 33 rows of tiles fill the H100's 132 SMs once
    full, more = H100.sms // 4 * TILE[0], (H100.sms // 4 + 1) * TILE[0]
    assert bf16.gemm(more, columns, 8192) / more > 1.5 * bf16.gemm(full, columns, 8192) / full
    assert fp8.gemm(8192, 8192, 8192, fp8=True) < 0.6 * bf16.gemm(8192, 8192, 8192)
    assert fp8.gemm(8192, 8192, 8192) == bf16.gemm(8192, 8192, 8192)
    assert bf16.gemm(8192, 8192, 256) / 256 > 1.2 * bf16.gemm(8192, 8192, 8192) / 8192
    assert bf16.gemm(0, 8192, 8192) == 0.0


def test_matmul_splits():
    """Tensor parallelism divides a column- or row-parallel product's FLOPs; routed experts share the busiest
    expert-parallel device's token copies (``routing.busiest``) out over its experts."""
    k = Kernels(H100, "bf16")
    whole = k.matmul(Matmul(4096, 16384), 8192, 1)
    split = k.matmul(Matmul(4096, 16384), 8192, 4)
    assert all(0.2 < s / w < 0.3 for s, w in zip(split, whole))
    experts = k.matmul(Matmul(2048, 1536, split="expert", copies=8), 4096, 1, ep=8, experts=128)
    rows = -(-busiest(4096 * 8, 8) // 16)
    assert rows > 4096 * 8 // 16
    assert experts == (16 * k.gemm(rows, 1536, 2048), 16 * k.gemm(rows, 2048, 1536), 16 * k.gemm(2048, 1536, rows))


def test_each_local_expert_is_its_own_product():
    """A local expert's product fills its own waves: 8 experts of 128 rows by 8 tiles of columns (8 tiles each, 64
    of 132 SMs) take 8 of one expert's time, not that of one product of 64 tiles; with as many rows as one
    grouped product of their tiles would fill, each expert's idle SMs make the sum slower than that product."""
    k = Kernels(H100, "bf16")
    experts = k.matmul(Matmul(8 * TILE[1], 4096, split="expert"), 8 * TILE[0], 1, ep=1, experts=8)
    one = k.gemm(TILE[0], 4096, 8 * TILE[1])
    assert experts[0] == 8 * one
    assert experts[0] > 1.5 * k.gemm(8 * TILE[0], 4096, 8 * TILE[1])


def test_fp8_casts_by_hand():
    """F casts an FP8 product's input (2 bytes read, 1 written in each of two layouts) unless a fused norm wrote
    it; B casts every FP8 product's output gradient; 16-bit products cast nothing; W casts nothing."""
    matmuls = (Matmul(8, 24, fused_norm=True), Matmul(16, 8, "row"), Matmul(8, 4, "expert", copies=2),
               Matmul(8, 3, "whole", fp8=False))
    assert fp8_casts(matmuls, 2) == (4 * 16 + 4 * 8 * 2, 4 * 24 + 4 * 8 + 4 * 4 * 2, 0)


def test_fp8_casts_lengthen_an_fp8_block_only(monkeypatch):
    """A Llama-style block's F and B take longer under FP8 by its casts' bytes at the memory rate, W not: q/k/v and
    fc1 take their fused norms' FP8 output, o's and fc2's inputs are cast, and all four output gradients. The block
    is large enough that its passes are not bound by the host's kernel launches."""
    h, f, heads, kv_heads, seq_len, batch = 2048, 4096, 16, 8, 1024, 2
    config = {"model_type": "llama", "hidden_size": h, "intermediate_size": f, "num_attention_heads": heads,
              "num_key_value_heads": kv_heads, "num_hidden_layers": 1, "vocab_size": 128,
              "max_position_embeddings": seq_len}
    cast = estimate(config, seq_len=seq_len, microbatch_size=batch, dtype="fp8").layers[1]
    monkeypatch.setattr(estimate_module, "fp8_casts", lambda matmuls, e: (0, 0, 0))
    uncast = estimate(config, seq_len=seq_len, microbatch_size=batch, dtype="fp8").layers[1]
    memory = Kernels(H100, "fp8").memory
    tokens, q_kv = seq_len * batch, h + 2 * kv_heads * (h // heads)
    assert cast.t_f - uncast.t_f == pytest.approx(memory(tokens * 4 * (h + f)))
    assert cast.t_b - uncast.t_b == pytest.approx(memory(tokens * 4 * (q_kv + h + 2 * f + h)))
    assert cast.t_w == uncast.t_w
