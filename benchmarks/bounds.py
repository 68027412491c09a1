"""Issue 32's targets, each printed met or missed. This file holds the section of limits that hold whatever the
size: on the unit profile (no memory limit) with p = 128 and m = 1024, `zbsolve solve --placement vshape` and
`--placement sequential` with `--time-limit 20 -o out.json`, run as a user runs them; each row's wall time (the
median and the largest of --repeats runs), the kept schedule's name (the family, heuristic, v-greedy or solver
that produced it), its status and objective, whether the document passes `zbsolve check`, and the target: every
run within 22 s with a valid document. The load average is printed beside the rows: the machine is shared, so say
what else ran. Rows print as they finish; run nothing else CPU-heavy beside it.

Run: .venv/bin/python benchmarks/bounds.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

from zbsolve.present.tables import records_table

ZBSOLVE = [sys.executable, "-m", "zbsolve"]
LIMITS = [("vshape", 128, 1024, 20.0, 22.0), ("sequential", 128, 1024, 20.0, 22.0)]
"""(placement, p, m, --time-limit, target wall seconds) of each limits row."""


def limits_row(folder: Path, placement: str, p: int, m: int, limit: float, target: float, repeats: int) -> dict:
    """``repeats`` runs of ``zbsolve solve -o`` on the unit profile: wall seconds, validity and the kept phase."""
    problem, out = folder / f"unit-p{p}-m{m}.yaml", folder / "out.json"
    problem.write_text(f"num_devices: {p}\nnum_microbatches: {m}\n")
    walls, valid, kept, says = [], [], "-", "-"
    for _ in range(repeats):
        out.unlink(missing_ok=True)
        began = time.monotonic()
        run = subprocess.run([*ZBSOLVE, "solve", problem, "--placement", placement, "--time-limit", str(limit), "-q",
                              "-o", out], capture_output=True, text=True)
        walls.append(time.monotonic() - began)
        valid.append(out.exists() and subprocess.run([*ZBSOLVE, "check", out, "-q"]).returncode == 0)
        if out.exists():
            doc = json.loads(out.read_text())
            kept, says = doc["name"], f"{doc['solver']['status']}, {doc['solver']['value']:g}"
        elif run.returncode:
            says = (run.stderr.strip().splitlines() or ["-"])[-1][:80]
    met = all(valid) and max(walls) <= target
    return {"placement": placement, "p": p, "m": m, "limit s": f"{limit:g}",
            "wall s": f"{statistics.median(walls):.1f}", "max s": f"{max(walls):.1f}", "target s": f"{target:g}", "valid": f"{sum(valid)}/{repeats}",
            "kept": kept, "result": says, "load": " ".join(f"{x:.1f}" for x in os.getloadavg()),
            "target met": "met" if met else "MISSED"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="Runs per row (the median and the largest printed).")
    args = parser.parse_args()
    console = Console(width=200)
    with tempfile.TemporaryDirectory() as folder:
        rows = []
        for case in LIMITS:
            rows.append(limits_row(Path(folder), *case, args.repeats))
            console.print(rows[-1])
        console.print(records_table(rows, "limits: zbsolve solve -o on the unit profile, wall seconds"))


if __name__ == "__main__":
    main()
