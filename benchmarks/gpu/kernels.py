"""Achievable throughput of the kernels a transformer pass is made of, measured on one CUDA GPU: matrix products
over a grid of shapes in BF16 and FP8, flash attention by head dimension and sequence, the memory-bound kernels of a
block, and HBM bandwidth. Writes one JSON document (the GPU's name, torch's version, every figure) for
``docs/cost-model.md``'s measured table; needs only torch.

Usage: python benchmarks/gpu/kernels.py OUT.json [--quick]

Each figure is the median of CUDA-event timings (``triton.testing.do_bench``) on random data, after warm-up; FP8
products are ``torch._scaled_mm`` on e4m3 operands with per-tensor scales and a BF16 output, Transformer Engine's
delayed-scaling GEMM. Every result is checked against a BF16 or float32 reference before it is timed.
"""

from __future__ import annotations

import itertools
import json
import sys
import time

import torch
import torch.nn.functional as F
from triton.testing import do_bench

M_TOKENS = (1024, 2048, 4096, 8192, 16384)
"""Rows of a product: tokens of a microbatch (sequence x micro-batch size, over TP with sequence parallelism)."""
WIDTHS = (768, 1024, 1536, 2048, 3072, 4096, 7168, 8192, 14336, 16384, 28672)
"""Columns and inner sizes: hidden sizes, attention projections and MLP widths (whole and over TP 2, 4, 8) of the
Llama-3, Qwen3 and DeepSeek-V3 models, Qwen3-30B-A3B's expert width 768 and DeepSeek-V3's 2048 included."""
QUICK_WIDTHS = (768, 4096, 8192)
ATTENTION = ((64, 4096), (128, 2048), (128, 4096), (128, 8192), (192, 4096))
"""(head dimension, sequence length) of the causal attentions timed; 192: DeepSeek-V3's MLA query/key heads."""
ATTENTION_TOKENS = 32768
"""Heads x sequence per attention call: batch 1 and as many heads as make this many rows of 128-wide heads."""
FP8 = torch.float8_e4m3fn


def ms(fn, reps: int = 30) -> float:
    """Median milliseconds of ``fn`` (CUDA events, warm-up first)."""
    return float(do_bench(fn, warmup=10, rep=reps, return_mode="median"))


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref.float()).norm() / ref.float().norm())


def hbm() -> dict:
    """Device-to-device copy of 2 GiB: bytes read plus written per second."""
    x = torch.randn(2**29, device="cuda")
    y = torch.empty_like(x)
    t = ms(lambda: y.copy_(x))
    assert torch.equal(x, y)
    return {"bytes": 2 * x.nbytes, "ms": t, "bytes_per_s": 2 * x.nbytes / (t * 1e-3)}


def gemm(m: int, n: int, k: int, dtype: str) -> dict:
    """One (m x k) @ (k x n) product in ``dtype`` ("bf16" or "fp8"), checked, then timed."""
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)  # a weight, as nn.Linear stores it
    ref = a @ b.t()
    if dtype == "bf16":
        def run() -> torch.Tensor:
            return a @ b.t()
        bound = 1e-2
    else:
        sa, sb = a.abs().max().float() / 448, b.abs().max().float() / 448
        a8, b8 = (a.float() / sa).to(FP8), (b.float() / sb).to(FP8)

        def run() -> torch.Tensor:
            return torch._scaled_mm(a8, b8.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
        bound = 8e-2
    err = relative_error(run(), ref)
    assert err < bound, (m, n, k, dtype, err)
    t = ms(run)
    return {"m": m, "n": n, "k": k, "dtype": dtype, "ms": t, "tflops": 2 * m * n * k / (t * 1e-3) / 1e12,
            "rel_error": err}


def attention(head_dim: int, seq: int) -> dict:
    """Causal flash attention (``scaled_dot_product_attention``, BF16) forward, and forward with backward."""
    heads = max(1, ATTENTION_TOKENS * 128 // (seq * head_dim))
    v_dim = 128 if head_dim == 192 else head_dim
    q, k = (torch.randn(1, heads, seq, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            for _ in range(2))
    v = torch.randn(1, heads, seq, v_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    ref = F.scaled_dot_product_attention(q[:, :1].float(), k[:, :1].float(), v[:, :1].float(), is_causal=True)
    err = relative_error(out[:, :1], ref)
    assert err < 2e-2, (head_dim, seq, err)
    grad = torch.randn_like(out)
    t_f = ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    t_fb = ms(lambda: torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, is_causal=True), (q, k, v), grad))
    # causal: half of the 2*s*s*(d_qk + d_v) products of each head
    flops = heads * seq * seq * (head_dim + v_dim)
    return {"head_dim": head_dim, "v_dim": v_dim, "seq": seq, "heads": heads, "f_ms": t_f, "fb_ms": t_fb,
            "f_tflops": flops / (t_f * 1e-3) / 1e12, "b_tflops": 2.5 * flops / ((t_fb - t_f) * 1e-3) / 1e12,
            "rel_error": err}


def memory_bound(tokens: int, hidden: int, ffn: int) -> dict:
    """RMSNorm, SwiGLU's gate, a residual add and rotary (eager torch, BF16) on one microbatch: each time, and the
    bytes it must read and write over that time."""
    x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
    w = torch.ones(hidden, device="cuda", dtype=torch.bfloat16)
    gate = torch.randn(tokens, ffn, device="cuda", dtype=torch.bfloat16)
    up = torch.randn_like(gate)
    heads = torch.randn(1, hidden // 128, tokens, 128, device="cuda", dtype=torch.bfloat16)
    cos, sin = (torch.randn(tokens, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))

    def rotary() -> torch.Tensor:
        a, b = heads[..., :64], heads[..., 64:]
        return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)

    cases = {"rms_norm": (lambda: F.rms_norm(x, (hidden,), w), 2 * x.nbytes),
             "swiglu": (lambda: F.silu(gate) * up, 3 * gate.nbytes),
             "residual_add": (lambda: x + x, 2 * x.nbytes),
             "rotary": (rotary, 2 * heads.nbytes)}
    out = {}
    for name, (fn, moved) in cases.items():
        t = ms(fn)
        out[name] = {"tokens": tokens, "hidden": hidden, "ffn": ffn, "ms": t, "bytes": moved,
                     "bytes_per_s": moved / (t * 1e-3)}
    return out


def main() -> None:
    path, quick = sys.argv[1], "--quick" in sys.argv[2:]
    began = time.monotonic()
    props = torch.cuda.get_device_properties(0)
    doc = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda,
           "memory_bytes": props.total_memory, "multiprocessors": props.multi_processor_count,
           "method": "median of triton.testing.do_bench (CUDA events) on random data after warm-up"}
    torch.manual_seed(0)
    doc["hbm"] = hbm()
    print(f"{doc['gpu']}: {props.total_memory / 2**20:.0f} MiB, copy {doc['hbm']['bytes_per_s'] / 1e12:.2f} TB/s",
          flush=True)
    widths = QUICK_WIDTHS if quick else WIDTHS
    doc["gemm"] = []
    for dtype in ("bf16", "fp8"):
        for m, n, k in itertools.product(M_TOKENS, widths, widths):
            doc["gemm"].append(gemm(m, n, k, dtype))
        peak = max(g["tflops"] for g in doc["gemm"] if g["dtype"] == dtype)
        print(f"{dtype}: {sum(g['dtype'] == dtype for g in doc['gemm'])} shapes, best {peak:.0f} TFLOP/s "
              f"({time.monotonic() - began:.0f} s)", flush=True)
    doc["attention"] = [attention(d, s) for d, s in ATTENTION]
    for a in doc["attention"]:
        print(f"attention d={a['head_dim']} s={a['seq']}: F {a['f_tflops']:.0f}, B {a['b_tflops']:.0f} TFLOP/s",
              flush=True)
    doc["memory_bound"] = {**memory_bound(8192, 4096, 14336)}
    for name, r in doc["memory_bound"].items():
        print(f"{name}: {r['bytes_per_s'] / 1e12:.2f} TB/s", flush=True)
    doc["seconds"] = time.monotonic() - began
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {path} in {doc['seconds']:.0f} s")


if __name__ == "__main__":
    main()
