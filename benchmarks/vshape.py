"""The optimizer with the V-shape placement on the Zero Bubble paper's V settings (problems/vshape), each
under the memory of a published schedule (ZB-V, V-Half, V-Min: the schedule's own simulated peak, about 1,
1/2 and 1/3 of 1F1B's): the published paper bubble beside zbsolve's, the bound's, the gap and the solve time.

Run: .venv/bin/python benchmarks/vshape.py [--time-limit 60] [--rows p16] [--workers N] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from zbsolve.schedulers.families import make_schedule
from zbsolve.problem.memory_factor import reference_peak
from zbsolve.problem.problem_file import Problem
from zbsolve.core.simulator import simulate
from zbsolve.optimize.solve import solve

ROOT = Path(__file__).resolve().parent.parent
BUDGETS = ("zb-v", "v-half", "v-min")
"""Published schedules whose memory is the budget."""


def run_row(problem: Problem, name: str, time_limit: float, workers: int | None) -> dict:
    """zbsolve's V-shape schedule of one setting under the peak memory of family ``name``."""
    p, m = problem.num_devices, problem.num_microbatches
    limit = simulate(make_schedule(name, problem.profile, p, m)).peak
    share = limit / reference_peak(problem.profile, p, m)
    began = time.perf_counter()
    result = solve(problem.profile, limit, num_microbatches=m, num_devices=p, placement="vshape",
                   time_limit=time_limit, workers=workers, objective="span")
    span = result.lower_bound
    return {"row": problem.name, "budget": name, "share": share, "published": problem.published.get(name),
            "zbsolve": result.paper_bubble, "bound": (span - max(result.timeline.work)) / span, "gap": result.gap,
            "status": result.status, "seconds": time.perf_counter() - began}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=60.0, help="Seconds per solve.")
    parser.add_argument("--rows", default="", help="Only problems whose name contains this (e.g. p16).")
    parser.add_argument("--workers", type=int, default=None, help="Solver threads (default: all cores).")
    parser.add_argument("--json", type=Path, default=None, help="Also write the rows as JSON.")
    args = parser.parse_args()
    problems = [Problem.load(path) for path in sorted((ROOT / "problems" / "vshape").glob("*.yaml"))]
    problems = sorted((q for q in problems if args.rows in q.name), key=lambda q: (q.num_devices, q.num_microbatches))
    table = Table(title=f"V-shape placement, paper bubble (time limit {args.time_limit:g}s)")
    for col in ("setting", "budget", "x 1F1B", "published", "zbsolve", "bound", "gap", "status", "time s"):
        table.add_column(col, justify="left" if col in ("setting", "budget", "status") else "right")
    console = Console(width=160)
    rows = []
    for problem in problems:
        for name in BUDGETS:
            row = run_row(problem, name, args.time_limit, args.workers)
            rows.append(row)
            cells = (row["row"], name, f"{row['share']:.3f}",
                     "-" if row["published"] is None else f"{row['published']:.4f}", f"{row['zbsolve']:.4f}",
                     f"{row['bound']:.4f}", f"{row['gap']:.4f}", row["status"], f"{row['seconds']:.1f}")
            table.add_row(*cells)
            console.print(" ".join(cells))
    console.print(table)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
