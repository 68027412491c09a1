"""How the CP-SAT optimizer scales: wall time, status and gap for p in 4, 8, 16, 32 and m in p..8p.

Profile: the paper's 1.5B model on every stage (or the unit profile with --unit); memory limit
``--factor`` x p x M_B. Run: .venv/bin/python benchmarks/solver_scaling.py [--time-limit 10] [--factor 2]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.table import Table

from zbsolve.problem.problem_file import Problem
from zbsolve.core.profile import UNIT
from zbsolve.optimize.solve import solve

PROFILE = Problem.load(Path(__file__).resolve().parent.parent / "problems/iclr/1.5b-p8-m24.yaml").profile


def main() -> None:
    """Print one row per (p, m)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=10.0, help="seconds per solve")
    parser.add_argument("--factor", type=float, default=2.0, help="memory limit in units of p * M_B")
    parser.add_argument("--unit", action="store_true", help="use the unit profile")
    parser.add_argument("--workers", type=int, default=None, help="CP-SAT threads (default: all cores)")
    parser.add_argument("--devices", default="4,8,16,32", help="values of p")
    args = parser.parse_args()
    profile = UNIT if args.unit else PROFILE
    console = Console(width=160)
    table = Table("p", "m", "passes", "wall s", "status", "gap", "paper_bubble",
                  title=f"CP-SAT scaling, limit {args.factor:g} x p x M_B, {'unit' if args.unit else '1.5B'} profile")
    for p in (int(x) for x in args.devices.split(",")):
        for m in (p, 2 * p, 4 * p, 8 * p):
            result = solve(profile, args.factor * p * profile.mem_f, num_microbatches=m, num_devices=p,
                           time_limit=args.time_limit, workers=args.workers, objective="span")
            cells = (str(p), str(m), str(3 * p * m), f"{result.solve_time:.2f}", result.status, f"{result.gap:.4f}",
                     f"{result.paper_bubble:.4f}")
            console.print(" ".join(cells))
            table.add_row(*cells)
    console.print(table)


if __name__ == "__main__":
    main()
