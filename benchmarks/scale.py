"""Scale: seconds and peak memory of a family + the simulator, of the heuristic and of a solve, from 10^4 to
1.5 x 10^6 passes (sequential ZB-H1 and V-shape ZB-V, unit profile, memory limit p * M_B, 1F1B's peak).

Each measurement runs in a fresh process under a timeout and an address-space cap, so its peak RSS is that
row's: "MiB" is the process's peak RSS, "B/pass" the peak's growth over the RSS after imports, per pass.
"sim k/s" is the simulator alone, in thousands of passes per second. Rows print as they finish.

Run: .venv/bin/python benchmarks/scale.py [--quick] [--timeout 300] [--memory-gib 12] [--time-limit 30]
     [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROWS = [("sequential", 16, 256), ("sequential", 32, 512), ("sequential", 64, 512), ("sequential", 64, 2048),
        ("sequential", 128, 2048), ("sequential", 128, 4096),
        ("vshape", 8, 256), ("vshape", 32, 512), ("vshape", 64, 1024), ("vshape", 64, 2048), ("vshape", 64, 4096)]
"""(placement, p, m) of each row: 3 x stages x m passes, stages p (sequential) or 2p (vshape)."""
QUICK = [("sequential", 16, 256), ("sequential", 64, 512), ("vshape", 8, 256), ("vshape", 32, 512)]
"""The rows of ``--quick``."""
FAMILY = {"sequential": "zb-h1", "vshape": "zb-v"}
"""The family measured on each placement."""
TASKS = ("family", "heuristic", "solve")
"""What a child process measures."""


def _rss_bytes() -> int:
    """This process's peak RSS so far, in bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def child(task: str, placement: str, p: int, m: int, time_limit: float) -> dict:
    """Measure one task in this (fresh) process."""
    from zbsolve.schedulers.families import make_schedule
    from zbsolve.schedulers.heuristic import heuristic
    from zbsolve.core.placement import sequential, vshape
    from zbsolve.core.profile import UNIT
    from zbsolve.core.simulator import simulate
    from zbsolve.optimize.solve import solve

    limit = p * UNIT.mem_f
    base = _rss_bytes()
    began = time.perf_counter()
    out: dict = {}
    if task == "family":
        schedule = make_schedule(FAMILY[placement], UNIT, p, m)
        sim_began = time.perf_counter()
        simulate(schedule)
        out["sim_s"] = time.perf_counter() - sim_began
        out["passes"] = sum(len(ops) for ops in schedule.devices)
    elif task == "heuristic":
        if placement == "sequential":
            heuristic(UNIT, sequential(p), m, limit)
        else:
            heuristic(UNIT.per_chunk(p, 2), vshape(p), m, limit)
    else:
        result = solve(UNIT, limit, num_microbatches=m, num_devices=p, placement=placement, time_limit=time_limit,
                       objective="span")
        out["status"] = result.status
    out["seconds"] = time.perf_counter() - began
    out["rss"] = _rss_bytes()
    out["growth"] = out["rss"] - base
    return out


def measure(task: str, placement: str, p: int, m: int, args: argparse.Namespace) -> dict:
    """Run ``child`` in a fresh process; its figures, or {"error": why}."""
    gib = args.memory_gib

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (gib << 30, gib << 30))

    command = [sys.executable, __file__, "--child", json.dumps([task, placement, p, m, args.time_limit])]
    try:
        done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=args.timeout, preexec_fn=cap)
    except subprocess.TimeoutExpired:
        return {"error": f"over {args.timeout:g} s"}
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        return {"error": lines[-1][:60] if lines else f"exit code {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_row(placement: str, p: int, m: int, args: argparse.Namespace) -> dict:
    """Every figure of one row."""
    passes = 3 * p * m * (1 if placement == "sequential" else 2)
    row: dict = {"placement": placement, "p": p, "m": m, "passes": passes}
    for task in TASKS:
        got = measure(task, placement, p, m, args)
        if "error" in got:
            row[f"{task}_error"] = got["error"]
            continue
        row[f"{task}_s"] = got["seconds"]
        row[f"{task}_mib"] = got["rss"] / 2 ** 20
        row[f"{task}_bpp"] = got["growth"] / passes
        if task == "family":
            row["sim_kps"] = got["passes"] / got["sim_s"] / 1e3
        if task == "solve":
            row["solve_status"] = got["status"]
    return row


COLUMNS = [("placement", "placement"), ("p", "p"), ("m", "m"), ("passes", "passes"),
           ("family_s", "family+sim s"), ("sim_kps", "sim k/s"), ("family_mib", "MiB"), ("family_bpp", "B/pass"),
           ("heuristic_s", "heuristic s"), ("heuristic_mib", "MiB"), ("heuristic_bpp", "B/pass"),
           ("solve_s", "solve s"), ("solve_status", "status"), ("solve_mib", "MiB"), ("solve_bpp", "B/pass")]
"""(row key, heading) of each column."""


def _cell(row: dict, key: str) -> str:
    """A row's figure as text; a failed task shows why in its seconds column."""
    value = row.get(key)
    if value is None:
        return row.get(key.split("_")[0] + "_error", "-") if key.endswith("_s") else "-"
    if isinstance(value, float):
        return f"{value:.0f}" if key.endswith(("_bpp", "_mib", "_kps")) else f"{value:.2f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def main() -> None:
    """Run the rows, print each as it finishes and then a table, optionally write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only a few small rows")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per measurement")
    parser.add_argument("--memory-gib", type=int, default=12, help="address-space cap per measurement, GiB")
    parser.add_argument("--time-limit", type=float, default=30.0, help="time_limit of each solve, seconds")
    parser.add_argument("--json", type=Path, default=None, help="write the rows as JSON here")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child(*json.loads(args.child))))
        return
    table = Table(*(heading for _, heading in COLUMNS), title="scale: family + simulator, heuristic, solve")
    console = Console(width=200)
    rows = []
    for placement, p, m in QUICK if args.quick else ROWS:
        row = run_row(placement, p, m, args)
        rows.append(row)
        cells = [_cell(row, key) for key, _ in COLUMNS]
        table.add_row(*cells)
        console.print(" ".join(f"{heading}={cell}" for (_, heading), cell in zip(COLUMNS, cells)))
    console.print(table)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
