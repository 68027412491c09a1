"""The optimizer on the Zero Bubble paper's twelve settings (problems/iclr) at 1F1B memory (p * M_B,
the paper's ZB-1p) and twice that (2p * M_B, ZB-2p): paper bubble rates of 1F1B, ZB-H1/ZB-H2, the
heuristic, CP-SAT (and CBC with --cbc) beside the published figure, with the lower bound, the gap
and the solve time. With --vshape, also CP-SAT on the V-shape placement at the same memory (each stage's
costs split over its two chunks).

Run: .venv/bin/python benchmarks/iclr.py [--time-limit 120] [--rows 1.5b] [--limits 1,2] [--cbc] [--vshape]
     [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from zbsolve.base.errors import ZbsolveError
from zbsolve.schedulers.families import FAMILIES, make_schedule
from zbsolve.schedulers.heuristic import heuristic
from zbsolve.core.placement import sequential
from zbsolve.problem.problem_file import Problem
from zbsolve.core.simulator import simulate
from zbsolve.optimize.solve import solve
from zbsolve.core.transforms import with_limit

ROOT = Path(__file__).resolve().parent.parent


def _family(name: str, problem: Problem, limit: float) -> float | None:
    """Paper bubble of a handcrafted family, None if it is missing or breaks the limit."""
    if name not in FAMILIES:
        return None
    p, m = problem.num_devices, problem.num_microbatches
    try:
        return simulate(with_limit(make_schedule(name, problem.profile.expand(p), p, m), limit)).paper_bubble
    except ZbsolveError:
        return None


def run_row(problem: Problem, factor: int, time_limit: float, workers: int | None, cbc: bool, vshape: bool) -> dict:
    """Every figure of one setting at memory limit ``factor * p * M_B``."""
    p, m = problem.num_devices, problem.num_microbatches
    profile = problem.profile.expand(p)
    limit = factor * p * profile.stage_value("mem_f", 0)
    began = time.perf_counter()
    warm = simulate(heuristic(profile, sequential(p), m, limit))
    heuristic_time = time.perf_counter() - began
    result = solve(profile, limit, num_microbatches=m, time_limit=time_limit, workers=workers, objective="span")
    span = result.lower_bound
    row = {"row": problem.name, "limit": f"{factor}p", "1f1b": _family("1f1b", problem, limit),
           "zb-h": _family("zb-h1" if factor == 1 else "zb-h2", problem, limit),
           "heuristic": warm.paper_bubble, "heuristic_s": heuristic_time,
           "cpsat": result.paper_bubble, "status": result.status, "solve_s": result.solve_time,
           "lower_bound": (span - max(result.timeline.work)) / span, "gap": result.gap,
           "published": problem.published.get(f"zb-{factor}p")}
    if cbc:
        other = solve(profile, limit, num_microbatches=m, solver="cbc", time_limit=time_limit, workers=workers,
                      objective="span")
        row.update(cbc=other.paper_bubble, cbc_status=other.status, cbc_s=other.solve_time)
    if vshape:
        v = solve(profile, limit, num_microbatches=m, placement="vshape", time_limit=time_limit, workers=workers,
                  objective="span")
        row.update(vshape=v.paper_bubble, v_gap=v.gap, v_s=v.solve_time)
    return row


def _cell(value: object) -> str:
    if value is None:
        return "-"
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def main() -> None:
    """Run the selected rows, print a table, optionally write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=120.0, help="seconds per solve")
    parser.add_argument("--rows", default="", help="only rows whose name contains this text")
    parser.add_argument("--limits", default="1,2", help="memory factors (of p * M_B) to run")
    parser.add_argument("--workers", type=int, default=None, help="CP-SAT threads (default: all cores)")
    parser.add_argument("--cbc", action="store_true", help="also run CBC")
    parser.add_argument("--vshape", action="store_true", help="also solve with the V-shape placement")
    parser.add_argument("--json", type=Path, default=None, help="write the rows as JSON here")
    args = parser.parse_args()
    factors = [int(x) for x in args.limits.split(",")]
    problems = [Problem.load(path) for path in sorted((ROOT / "problems" / "iclr").glob("*.yaml"))
                if args.rows in path.stem]
    columns = ["row", "limit", "1f1b", "zb-h", "heuristic", "cpsat", "published", "lower_bound", "gap", "status",
               "solve_s"] + (["cbc", "cbc_status", "cbc_s"] if args.cbc else []) + (
                   ["vshape", "v_gap", "v_s"] if args.vshape else [])
    table = Table(*columns, title="paper bubble rate: zbsolve vs the Zero Bubble paper (zb-h: ZB-H1 at 1p, ZB-H2 at 2p)")
    console = Console(width=200)
    rows = []
    for problem in problems:
        for factor in factors:
            row = run_row(problem, factor, args.time_limit, args.workers, args.cbc, args.vshape)
            rows.append(row)
            table.add_row(*(_cell(row.get(c)) for c in columns))
            console.print(" ".join(f"{c}={_cell(row.get(c))}" for c in columns))
    console.print(table)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
