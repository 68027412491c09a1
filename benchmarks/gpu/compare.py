"""The measured table of a lent GPU against zbsolve's estimate: a Llama block's F, B and W and the GEMM throughput
the measurement reached, per dtype and size, from ``problems/measured/<gpu>/`` (written by ``benchmarks/gpu/run.sh``).

Usage: python benchmarks/gpu/compare.py [problems/measured/h100 | problems/measured/h200]
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from rich.console import Console

from zbsolve.present.tables import text_table
from zbsolve.costmodel.estimate import estimate
from zbsolve.costmodel.model import Model

CONFIGS = Path(__file__).resolve().parents[2] / "problems" / "models" / "configs"
MODELS = {"llama3_8b.yaml": ("llama3-8b.json", 1), "llama3_70b_tp4.yaml": ("llama3-70b.json", 4)}
"""Measured layer sets and the config and TP degree the estimate is asked for."""


def block_rows(folder: Path, gpu: str) -> list[list[str]]:
    """Per measured model: a block's F, B, W in ms, measured and estimated for the ``gpu`` preset, and their ratio."""
    rows = []
    for measured_file, (config, tp) in MODELS.items():
        measured = Model.load(folder / measured_file)
        est = estimate(CONFIGS / config, gpu=gpu, seq_len=8192, microbatch_size=1, tp=tp)
        block = [layer for layer in measured.layers if layer.block]
        ours = next(layer for layer in est.layers if layer.block)
        for name in ("t_f", "t_b", "t_w"):
            got = statistics.median(getattr(layer, name) for layer in block)
            want = getattr(ours, name)
            rows.append([f"{config} tp{tp}", name[2:].upper(), f"{1e3 * got:.2f}", f"{1e3 * want:.2f}",
                         f"{got / want:.2f}"])
    return rows


def gemm_rows(doc: dict) -> list[list[str]]:
    """Per dtype and row count: the median and the best TFLOP/s over the grid's columns and inner sizes, and the
    median at the smallest width."""
    rows = []
    for dtype in ("bf16", "fp8"):
        for m in sorted({g["m"] for g in doc["gemm"]}):
            shapes = [g for g in doc["gemm"] if g["dtype"] == dtype and g["m"] == m]
            narrow = min(g["n"] for g in shapes)
            rows.append([dtype, str(m), f"{statistics.median(g['tflops'] for g in shapes):.0f}",
                         f"{max(g['tflops'] for g in shapes):.0f}",
                         f"{statistics.median(g['tflops'] for g in shapes if g['n'] == narrow):.0f}"])
    return rows


def main() -> None:
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "problems/measured/h100")
    doc = json.loads((folder / "kernels.json").read_text())
    gpu = "h200" if "H200" in doc["gpu"] else "h100"  # the preset of the device the grid names
    console = Console(width=160)
    console.print(text_table(["model", "pass", "measured ms", "estimated ms", "ratio"], block_rows(folder, gpu),
                     f"{doc['gpu']}: one block, eager torch BF16, seq 8192, micro-batch 1 (estimate: zbsolve "
                     "estimate, TP collectives included)"))
    console.print(text_table(["dtype", "m", "median TFLOP/s", "best", f"n={min(g['n'] for g in doc['gemm'])} median"],
                     gemm_rows(doc), f"{doc['gpu']}: matrix products over the grid ({doc['torch']})"))


if __name__ == "__main__":
    main()
