"""Plans each runtime runs as planned, against that runtime's own recipe on the same costs: per row the plan for
``--target megatron`` or ``--target torchtitan`` (``--recompute auto --chunks auto``), the baseline it must beat, the
ratio and its target, printed met or missed.

- Llama-3-70B (``zbsolve estimate problems/models/configs/llama3-70b.json --gpu h100 --seq-len 8192
  --microbatch-size 1 --tp 4``), p = 8, m = 64, 64 GiB, the recipe's layout ``LAYOUT_70B``: for Megatron, the plan
  at most 0.90x the layout with its best recomputation from Megatron's menu; for torchtitan, at most 0.78x the best
  torch built-in on torchtitan's split with full recomputation.
- DeepSeek-V3 (``problems/models/deepseek-v3.yaml``), p = 8, m = 128, for Megatron: the plan no slower than the
  published layout ``LAYOUT_V3`` (VP 4) with Megatron's schedule and its best recomputation.

Run: .venv/bin/python benchmarks/runtimes.py [--time-limit 300] [--only TEXT] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from zbsolve.planning.planner import plan
from zbsolve.planning.result import Baseline, PlanResult
from zbsolve.present.tables import records_table
from zbsolve.costmodel.estimate import estimate
from zbsolve.costmodel.model import Model

ROOT = Path(__file__).resolve().parent.parent
LAYOUT_70B = "Et*2|(t*2|)*34,t*3|(t*2|)*3,tL"
"""Llama-3-70B's layout over 8 ranks with 5 virtual stages each, as Megatron-Bridge's perf recipe gives it."""
LAYOUT_V3 = "Et|(tt|)*30mL"
"""DeepSeek-V3's published layout over 8 ranks with 4 virtual stages each (Megatron-Bridge's perf recipe)."""


def llama3_70b() -> Model:
    """Llama-3-70B at TP 4 on H100, seq 8192, micro-batch 1."""
    return estimate(ROOT / "problems" / "models" / "configs" / "llama3-70b.json", gpu="h100", seq_len=8192,
                    microbatch_size=1, tp=4)


def layout_best(result: PlanResult) -> Baseline | None:
    """The fastest fitting row of Megatron's schedule on the given layout (any recomputation of its menu)."""
    rows = [b for b in result.baselines if b.split == "layout" and b.fits and b.step_time is not None]
    return min(rows, key=lambda b: b.step_time, default=None)


def titan_full(result: PlanResult) -> Baseline | None:
    """The fastest fitting torch built-in on torchtitan's split with every block recomputed."""
    rows = [b for b in result.baselines if b.split == "torchtitan" and b.recompute == "full" and b.fits
            and b.step_time is not None]
    return min(rows, key=lambda b: b.step_time, default=None)


@dataclass(frozen=True)
class Row:
    """One plan and what it is held against."""

    name: str
    model: Callable[[], Model]
    target: str
    p: int
    m: int
    memory: str | None
    layout: str
    against: Callable[[PlanResult], Baseline | None]
    bound: float
    """The ratio the plan must reach or beat."""


ROWS = (
    Row("llama3-70b tp4", llama3_70b, "megatron", 8, 64, "64GiB", LAYOUT_70B, layout_best, 0.90),
    Row("llama3-70b tp4", llama3_70b, "torchtitan", 8, 64, "64GiB", LAYOUT_70B, titan_full, 0.78),
    Row("deepseek-v3", lambda: Model.load(ROOT / "problems" / "models" / "deepseek-v3.yaml"), "megatron", 8, 128,
        None, LAYOUT_V3, layout_best, 1.00),
)


def run(row: Row, time_limit: float) -> dict:
    """Plan ``row`` and measure it against its baseline."""
    result = plan(row.model(), num_devices=row.p, num_microbatches=row.m, device_memory=row.memory,
                  recompute="auto", chunks="auto", target=row.target, baseline_layout=row.layout,
                  time_limit=time_limit)
    base = row.against(result)
    ratio = None if base is None else result.step_time / base.step_time
    return {"model": row.name, "target": row.target, "p": row.p, "m": row.m,
            "plan": f"{result.placement} x{result.chunks} {result.recompute}", "step s": result.step_time,
            "against": None if base is None else f"{base.split} {base.schedule} {base.recompute}",
            "baseline s": None if base is None else base.step_time, "ratio": ratio, "target ratio": row.bound,
            "met": ratio is not None and ratio <= row.bound + 1e-9,
            "largest memory GiB": max(result.summary()["memory_gib"]), "plan s": result.plan_time}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=300.0, help="Seconds per plan.")
    parser.add_argument("--json", type=Path, help="Also write the rows here.")
    parser.add_argument("--only", help="Run only the rows whose model or target contains this text.")
    args = parser.parse_args()
    console = Console(width=240)
    records = []
    for row in ROWS:
        if args.only and args.only not in f"{row.name} {row.target}":
            continue
        records.append(run(row, args.time_limit))
        console.print(records_table(records, "Plans each runtime runs as planned"))
    misses = [f"{r['model']} --target {r['target']}: {r['ratio']}" for r in records if not r["met"]]
    console.print("every target met" if not misses else "missed: " + "; ".join(misses))
    if args.json:
        args.json.write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
