"""Plans where memory binds (issue 19's targets): Llama-3-70B as Megatron-Bridge's recipe shapes it (TP4, PP8, m=64,
seq 8192, microbatch 1, H100), planned with recomputation and deep interleaving allowed, against the uniform and
torchtitan splits with every block recomputed and each torch built-in that fits; and the same model at TP2.

Run: .venv/bin/python benchmarks/recompute.py [--time-limit 300] [--memories 80,64] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from zbsolve.base.errors import InfeasibleError
from zbsolve.planning.planner import plan
from zbsolve.problem.estimate.formula import estimate

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "problems" / "models" / "configs" / "llama3-70b.json"
TARGETS = {80: 0.76, 64: 0.88}
"""Plan step time / the best fitting baseline with every block recomputed, per device memory (GiB)."""
GAP_TARGET = 0.05
"""The plan's gap to its bound at 80 GiB."""


def best_recomputed(result) -> object:
    """The fastest baseline on the uniform or torchtitan split with every block recomputed that fits."""
    rows = [b for b in result.baselines if b.fits and b.recompute == "full" and b.step_time is not None]
    return min(rows, key=lambda b: b.step_time, default=None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=300.0, help="seconds per plan")
    parser.add_argument("--memories", default="80,64", help="device memory in GiB, comma-separated")
    parser.add_argument("--json", type=Path, default=None, help="write the rows as JSON here")
    args = parser.parse_args()
    rows = []
    model = estimate(CONFIG, gpu="h100", seq_len=8192, microbatch_size=1, tp=4)
    for gib in (int(x) for x in args.memories.split(",")):
        began = time.monotonic()
        result = plan(model, num_devices=8, num_microbatches=64, device_memory=f"{gib}GiB", chunks="auto",
                      recompute="auto", time_limit=args.time_limit)
        base = best_recomputed(result)
        ratio = result.step_time / base.step_time if base is not None else None
        target = TARGETS.get(gib)
        met = ratio is not None and target is not None and ratio <= target and (gib != 80 or result.gap <= GAP_TARGET)
        rows.append({"setting": f"70B tp4, {gib} GiB", "plan": f"{result.placement} x{result.chunks}, recompute "
                     f"{result.recompute}", "step_s": result.step_time, "gap": result.gap,
                     "baseline": None if base is None else f"{base.schedule} ({base.split}, full)",
                     "baseline_s": None if base is None else base.step_time, "ratio": ratio,
                     "target": None if target is None else f"<= {target}" + (f", gap <= {GAP_TARGET}" if gib == 80
                                                                             else ""),
                     "met": met, "plan_s": time.monotonic() - began})
    tp2 = estimate(CONFIG, gpu="h100", seq_len=8192, microbatch_size=1, tp=2)
    began = time.monotonic()
    try:
        result = plan(tp2, num_devices=8, num_microbatches=64, device_memory="80GiB", chunks="auto",
                      recompute="auto", time_limit=args.time_limit)
        outcome = f"{result.placement} x{result.chunks}, recompute {result.recompute}: {result.step_time:.2f}s"
        met = True
    except InfeasibleError as exc:
        outcome = str(exc)
        met = " does not fit: " in outcome and "what would help:" in outcome
    rows.append({"setting": "70B tp2, 80 GiB", "plan": outcome, "step_s": None, "gap": None, "baseline": None,
                 "baseline_s": None, "ratio": None, "target": "fits, or names device, shortfall, remedy",
                 "met": met, "plan_s": time.monotonic() - began})
    table = Table(title=f"recomputation and deep interleaving (plan --chunks auto --recompute auto, "
                        f"--time-limit {args.time_limit:g})")
    for column in ("setting", "plan", "step s", "gap", "best baseline, full recomputation", "its step s", "ratio",
                   "target", "met", "plan s"):
        table.add_column(column)
    for r in rows:
        table.add_row(r["setting"], r["plan"], *(f"{r[k]:.3f}" if r[k] is not None else "-"
                                                 for k in ("step_s", "gap")),
                      r["baseline"] or "-", f"{r['baseline_s']:.3f}" if r["baseline_s"] else "-",
                      f"{r['ratio']:.3f}" if r["ratio"] else "-", r["target"], "met" if r["met"] else "MISSED",
                      f"{r['plan_s']:.0f}")
    Console(width=220).print(table)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
