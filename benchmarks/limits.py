"""Limits and interrupts at scale: `zbsolve solve -o` as a user runs it, on the unit profile.

"limit" rows: the command's wall time against --time-limit (the contract: at most the limit + max(2 s, 5%)), the
result's objective against the first family of the placement that fits (the floor, which a solve builds when its
limit allows: "no worse" says whether the result is) and against the first schedule (the placement's cheapest family
that fits, else one microbatch at a time, which every solve builds whatever the limit: "first s" is what building
and simulating it takes here, the one part of a solve a limit cannot shorten), and the peak RSS; a limit shorter
than the first schedule needs is refused, and the row says the least the solve named. "interrupt" rows: one SIGINT a
given number of seconds after the start; the exit code (130), and whether the schedule document was written and
passes `zbsolve check`. Rows print as they finish; run nothing else CPU-heavy beside it.

Run: .venv/bin/python benchmarks/limits.py [--quick] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

from zbsolve.present.tables import records_table

LIMITS = [("vshape", 128, 1024, 1.0, 20), ("sequential", 128, 1024, 1.0, 20), ("vshape", 32, 256, 0.5, 1),
          ("vshape", 64, 512, 0.5, 5), ("sequential", 64, 512, 1.0, 3)]
"""(placement, p, m, memory factor, time limit) of each "limit" row."""
INTERRUPTS = [("sequential", 64, 512, 1.0, "span", 4.0), ("sequential", 64, 512, None, "makespan", 3.0),
              ("vshape", 64, 512, 0.5, "span", 4.0), ("vshape", 64, 512, 0.5, "span", 1.0)]
"""(placement, p, m, memory factor or None, objective, seconds to the SIGINT) of each "interrupt" row, with a time
limit of 60 s: in the search, once the solve is over (its step times or document), in the V-shape's warm start,
and before any schedule exists (the signal is answered once the first schedule does)."""
QUICK = 2
"""Rows of each kind with ``--quick``."""
ZBSOLVE = [sys.executable, "-m", "zbsolve"]


def _problem(folder: Path, p: int, m: int, factor: float | None) -> Path:
    path = folder / f"unit-p{p}-m{m}.yaml"
    path.write_text(f"num_devices: {p}\nnum_microbatches: {m}\n" + (f"mem_factor: {factor}\n" if factor else ""))
    return path


def _floor(placement: str, p: int, m: int, factor: float) -> float:
    """The objective of the first family of ``placement`` that fits ``factor`` x 1F1B's peak."""
    from zbsolve.schedulers.families import PLACEMENT_FAMILIES, make_schedule
    from zbsolve.problem.memory_factor import reference_peak
    from zbsolve.core.profile import UNIT
    from zbsolve.core.simulator import simulate

    limit = factor * reference_peak(UNIT, p, m)
    for name in PLACEMENT_FAMILIES[placement]:
        timeline = simulate(make_schedule(name, UNIT, p, m))
        if max(timeline.peak_memory) <= limit:
            return timeline.makespan
    return float("inf")


def _first(placement: str, p: int, m: int, factor: float) -> tuple[float, float]:
    """The objective of a solve's first schedule under ``factor`` x 1F1B's peak, and the seconds that building and
    simulating it take here."""
    from zbsolve.core.profile import UNIT
    from zbsolve.core.simulator import simulate
    from zbsolve.core.spec import make_spec
    from zbsolve.optimize.backends.protocol import Log
    from zbsolve.optimize.warm_start import first_schedule
    from zbsolve.problem.memory_factor import reference_peak

    spec = make_spec(UNIT, factor * reference_peak(UNIT, p, m), num_microbatches=m, num_devices=p, placement=placement)
    began = time.monotonic()
    timeline = simulate(first_schedule(spec, Log(None))[1])
    return timeline.makespan, time.monotonic() - began


def limit_row(folder: Path, placement: str, p: int, m: int, factor: float, limit: float, repeats: int) -> dict:
    """Median wall seconds and peak RSS of ``repeats`` solves, the objective (or the refusal of a limit shorter than
    the first schedule needs), the first schedule's and the floor's."""
    problem, out = _problem(folder, p, m, factor), folder / "out.json"
    walls, rss, refused = [], [], ""
    for _ in range(repeats):
        out.unlink(missing_ok=True)
        began = time.monotonic()
        run = subprocess.run(["/usr/bin/time", "-f", "%M", *ZBSOLVE, "solve", problem, "--placement", placement,
                              "--time-limit", str(limit), "-q", "-o", out], capture_output=True, text=True)
        walls.append(time.monotonic() - began)
        lines = run.stderr.strip().splitlines()
        rss.append(int(lines[-1]) / 1024)
        refused = lines[-2].split("give ")[-1] if run.returncode == 2 else refused
    objective = json.loads(out.read_text())["solver"]["value"] if out.exists() else f"refused: {refused}"
    budget = limit + max(2.0, 0.05 * limit)
    wall = statistics.median(walls)
    floor, (first, first_seconds) = _floor(placement, p, m, factor), _first(placement, p, m, factor)
    return {"placement": placement, "p": p, "m": m, "factor": factor, "limit s": limit,
            "wall s": f"{wall:.1f}", "within": "met" if max(walls) <= budget else f"MISSED (max {max(walls):.1f})",
            "first s": f"{first_seconds:.1f}", "objective": objective, "first": first, "floor": floor,
            "no worse": "-" if refused else "met" if objective <= floor else "first" if objective <= first
            else "MISSED",
            "MiB": f"{statistics.median(rss):.0f}"}


def interrupt_row(folder: Path, placement: str, p: int, m: int, factor: float | None, objective: str,
                  after: float) -> dict:
    """One SIGINT ``after`` seconds into a solve: its exit code and whether a valid document was written."""
    problem, out = _problem(folder, p, m, factor), folder / "interrupted.json"
    out.unlink(missing_ok=True)
    process = subprocess.Popen([*ZBSOLVE, "solve", problem, "--placement", placement, "--time-limit", "60",
                                "--objective", objective, "-q", "-o", out],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(after)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate()
    valid = out.exists() and subprocess.run([*ZBSOLVE, "check", out, "-q"]).returncode == 0
    says = (stderr.strip().splitlines() or ["-"])[-1]
    return {"placement": placement, "p": p, "m": m, "factor": factor or "-", "objective": objective,
            "SIGINT at s": after, "exit": process.returncode, "written": "valid" if valid else "no",
            "says": says.split(" is in ")[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="Only the first rows of each kind.")
    parser.add_argument("--repeats", type=int, default=3, help="Solves per limit row (the median is printed).")
    args = parser.parse_args()
    console = Console(width=200)
    with tempfile.TemporaryDirectory() as folder:
        rows = []
        for case in LIMITS[:QUICK] if args.quick else LIMITS:
            rows.append(limit_row(Path(folder), *case, args.repeats))
            console.print(rows[-1])
        console.print(records_table(rows, "time limits: zbsolve solve -o, wall seconds (median)"))
        rows = []
        for case in INTERRUPTS[:QUICK] if args.quick else INTERRUPTS:
            rows.append(interrupt_row(Path(folder), *case))
            console.print(rows[-1])
        console.print(records_table(rows, "interrupts: one SIGINT"))


if __name__ == "__main__":
    main()
