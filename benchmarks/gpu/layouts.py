"""The three products of a linear layer in the layouts training runs them, on one CUDA GPU in BF16: F (x Wᵀ: the
activation row-major, the weight as nn.Linear stores it), B (the input gradient dy W: the weight not transposed) and
W (the weight gradient dyᵀ x: both operands transposed, the tokens the inner size), over the grid of
``kernels.py``'s row counts and a subset of its widths; each checked against a float32 reference, then timed. The
W layout's rate against F's on the same (m, n, k) says how much slower weight gradients run than the grid of
``kernels.py`` (F's layout) predicts. Writes one JSON document; needs only torch.

Usage: python benchmarks/gpu/layouts.py OUT.json
"""

from __future__ import annotations

import itertools
import json
import sys

import torch
from triton.testing import do_bench

TOKENS = (1024, 4096, 8192, 16384)
"""Tokens of a microbatch on the device (the rows of F and B, the inner size of W)."""
WIDTHS = (768, 2048, 4096, 7168, 8192, 14336, 28672)
"""A layer's input and output widths."""


def ms(fn) -> float:
    """Median milliseconds of ``fn`` (CUDA events, warm-up first)."""
    return float(do_bench(fn, warmup=10, rep=30, return_mode="median"))


def layer(tokens: int, n_in: int, n_out: int) -> dict:
    """F, B and W of one linear layer of ``n_in`` -> ``n_out`` on ``tokens`` tokens, each 2·tokens·n_in·n_out."""
    x = torch.randn(tokens, n_in, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n_out, n_in, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(tokens, n_out, device="cuda", dtype=torch.bfloat16)
    passes = {"F": (lambda: x @ w.t(), lambda: x.float() @ w.float().t()),
              "B": (lambda: dy @ w, lambda: dy.float() @ w.float()),
              "W": (lambda: dy.t() @ x, lambda: dy.float().t() @ x.float())}
    flops = 2 * tokens * n_in * n_out
    out = {"tokens": tokens, "n_in": n_in, "n_out": n_out}
    for name, (fn, ref) in passes.items():
        expected = ref()
        err = float((fn().float() - expected).norm() / expected.norm())
        assert err < 1e-2, (name, tokens, n_in, n_out, err)
        out[name] = flops / (ms(fn) * 1e-3) / 1e12
    return out


def main() -> None:
    torch.manual_seed(0)
    rows = []
    for tokens, n_in, n_out in itertools.product(TOKENS, WIDTHS, WIDTHS):
        rows.append(layer(tokens, n_in, n_out))
    doc = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "dtype": "bf16",
           "method": "median of triton.testing.do_bench (CUDA events) on random data after warm-up", "layers": rows}
    for name in ("B", "W"):
        ratios = sorted(r[name] / r["F"] for r in rows)
        print(f"{name} / F rate over {len(rows)} layers: median {ratios[len(ratios) // 2]:.3f}, "
              f"10th percentile {ratios[len(ratios) // 10]:.3f}, 90th {ratios[9 * len(ratios) // 10]:.3f}",
              flush=True)
    with open(sys.argv[1], "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
