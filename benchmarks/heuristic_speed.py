"""Wall time of the heuristic scheduler (median of 5 runs) and its paper bubble rate.

Profile: the paper's 1.5B model (problems/iclr/1.5b-p8-m24.yaml) on every stage, memory limit
p * M_B (ZB-1p) and 2p * M_B (ZB-2p). Run: .venv/bin/python benchmarks/heuristic_speed.py
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from zbsolve.schedulers.heuristic import heuristic
from zbsolve.core.placement import sequential
from zbsolve.problem.problem_file import Problem
from zbsolve.core.simulator import simulate

RUNS = 5
PROFILE = Problem.load(Path(__file__).resolve().parent.parent / "problems/iclr/1.5b-p8-m24.yaml").profile


def main() -> None:
    """Print one row per (p, m, memory limit)."""
    print(f"{'p':>3} {'m':>4} {'limit':>7} {'median s':>9} {'paper_bubble':>13}")
    for p in (4, 8, 16, 32):
        for m in (p, 4 * p, 8 * p):
            for factor in (1, 2):
                times = []
                for _ in range(RUNS):
                    start = time.perf_counter()
                    schedule = heuristic(PROFILE, sequential(p), m, factor * p * PROFILE.mem_f)
                    times.append(time.perf_counter() - start)
                bubble = simulate(schedule).paper_bubble
                print(f"{p:>3} {m:>4} {f'{factor}p*M_B':>7} {statistics.median(times):>9.3f} {bubble:>13.4f}")


if __name__ == "__main__":
    main()
