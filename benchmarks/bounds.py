"""The targets on plans' gaps and on the limits at scale, each printed met or missed, in two sections.

- plans: each plan below at its time limit (300 s): Llama-3-70B TP4 (``zbsolve estimate``'s costs), p = 8,
  m = 64, ``--chunks auto --recompute auto`` with Megatron-Bridge's layout as a baseline, at 80 and 64 GiB, for each
  target (zbsolve, megatron, torchtitan): gap <= 5% at 80 GiB and <= 8% at 64 GiB, never a zero bound;
  Llama-3-8B p = 8, m = 32 at 40 GiB, ``--recompute auto``: gap <= 10%; DeepSeek-V3 (problems/models) p = 16,
  m = 64 at 80 GiB, ``--recompute auto``: the plan strictly faster than every baseline that fits, gap <= 15%. Each
  row names the phase whose schedule was kept (``PlanResult.source``: the search's candidate, CP-SAT, a baseline) and
  who made that schedule (its name: a family, the heuristic, the periodic pattern, CP-SAT, pairs).
- limits, that hold whatever the size: on the unit profile (no memory limit) with p = 128 and m = 1024,
  `zbsolve solve --placement vshape` and `--placement sequential` with `--time-limit 20 -o out.json`, run as a user
  runs them; `zbsolve plan` of a model of 2p blocks at p = 128, m = 1024 on each placement; and `zbsolve configure`
  of Llama-3.1-405B on 1,024 H100s, a global batch of 1,024 sequences of 8,192 tokens (pipelines up to p = 64, the
  divisors of 1,024 up to its 126 blocks, and up to m = 1,024 microbatches), and of the same model with 128 blocks
  (up to p = 128). Each row's wall time (the median and the largest of --repeats runs), the kept schedule's name
  (the family, heuristic, v-greedy or solver that produced it; a plan's source), its status and objective (a plan's
  placement, p, m and step), whether the document passes `zbsolve check`, and the target: every run within 22 s
  with a valid document.

The load average is printed beside the rows: the machine is shared, so say what else ran. Rows print as they finish;
run nothing else CPU-heavy beside it.

Run: .venv/bin/python benchmarks/bounds.py [--section plans|limits] [--only TEXT] [--time-limit 300] [--repeats 3]
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

from zbsolve.base.units import GIB
from zbsolve.planning.planner import plan
from zbsolve.costmodel.estimate import estimate
from zbsolve.costmodel.model import Model
from zbsolve.present.tables import records_table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plan import heavy_head  # noqa: E402  (benchmarks/plan.py's model of a heavy output layer)

ROOT = Path(__file__).resolve().parent.parent
LAYOUT_70B = "Et*2|(t*2|)*34,t*3|(t*2|)*3,tL"
"""Megatron-Bridge's Llama-3-70B layout (PP8, VP5), a baseline of each 70B plan."""
PLANS = [*((f"Llama-3-70B tp4 {target} {gib} GiB", "70b", 8, 64, gib, target, gap, False)
           for gib, gap in ((80, 0.05), (64, 0.08)) for target in ("zbsolve", "megatron", "torchtitan")),
         ("Llama-3-8B 40 GiB", "llama3-8b", 8, 32, 40, "zbsolve", 0.10, False),
         ("DeepSeek-V3 80 GiB", "deepseek-v3", 16, 64, 80, "zbsolve", 0.15, True)]
"""(row, model, p, m, GiB, target, the largest gap, whether the plan must beat every baseline) of each plan row."""
ZBSOLVE = [sys.executable, "-m", "zbsolve"]
LIMITS = [("solve", "vshape", 128, 1024, 20.0, 22.0), ("solve", "sequential", 128, 1024, 20.0, 22.0),
          *(("plan", placement, 128, 1024, 20.0, 22.0) for placement in ("sequential", "interleaved", "vshape")),
          ("configure", "as chosen", 64, 1024, 20.0, 22.0), ("configure", "as chosen", 128, 1024, 20.0, 22.0)]
"""(command, placement, p, m, --time-limit, target wall seconds) of each limits row; a configure row's p and m are
the largest its menus hold."""
CONFIG_405B = ROOT / "problems" / "models" / "configs" / "llama3.1-405b.json"


def limits_row(folder: Path, command: str, placement: str, p: int, m: int, limit: float, target: float,
               repeats: int) -> dict:
    """``repeats`` runs of ``zbsolve solve -o`` on the unit profile, of ``zbsolve plan -o`` of ``heavy_head`` with 2p
    blocks at 80 GiB, or of ``zbsolve configure -o`` of Llama-3.1-405B with at least p blocks on 1,024 GPUs, a
    global batch of m: wall seconds, validity and the kept phase."""
    out = folder / "out.json"
    placed = ["--placement", placement]
    if command == "configure":
        config = json.loads(CONFIG_405B.read_text())
        config["num_hidden_layers"] = max(config["num_hidden_layers"], p)
        problem = folder / f"llama3.1-405b-{config['num_hidden_layers']}.json"
        problem.write_text(json.dumps(config))
        args, placed = ["configure", problem, "--gpus", "1024", "--global-batch", str(m), "--seq-len", "8192"], []
    elif command == "solve":
        problem = folder / f"unit-p{p}-m{m}.yaml"
        problem.write_text(f"num_devices: {p}\nnum_microbatches: {m}\n")
        args = ["solve", problem]
    else:
        problem = folder / f"heavy-head-{2 * p}.yaml"
        heavy_head(2 * p, p).save(problem)
        args = ["plan", problem, "--devices", str(p), "--microbatches", str(m), "--device-memory", "80GiB"]
    walls, valid, kept, says, failed = [], [], "-", "-", []
    for _ in range(repeats):
        out.unlink(missing_ok=True)
        began = time.monotonic()
        run = subprocess.run([*ZBSOLVE, *args, *placed, "--time-limit", str(limit), *(["-q"] * bool(placed)), "-o",
                              out], capture_output=True, text=True)
        walls.append(time.monotonic() - began)
        check = subprocess.run([*ZBSOLVE, "check", out, "-q"], capture_output=True, text=True) if out.exists() else run
        valid.append(out.exists() and check.returncode == 0)
        if not valid[-1]:
            failed.append((check.stderr.strip().splitlines() or [f"exit {check.returncode}"])[-1][:100])
        if out.exists():
            doc = json.loads(out.read_text())
            kept = doc["name"] if command == "solve" else doc["plan"]["source"]
            says = (f"{doc['solver']['status']}, {doc['solver']['value']:g}" if command == "solve"
                    else f"{doc['plan']['placement']} x{doc['plan']['chunks']}, p={doc['num_devices']} "
                         f"m={doc['num_microbatches']}, step {doc['plan']['step_time']:g}")
    met = all(valid) and max(walls) <= target
    return {"command": command, "placement": placement, "p": p, "m": m, "limit s": f"{limit:g}",
            "wall s": f"{statistics.median(walls):.1f}", "max s": f"{max(walls):.1f}", "target s": f"{target:g}",
            "valid": f"{sum(valid)}/{repeats}",
            "kept": kept, "result": says, "failed": "; ".join(failed) or "-",
            "load": " ".join(f"{x:.1f}" for x in os.getloadavg()),
            "target met": "met" if met else "MISSED"}


def plan_row(row: str, name: str, p: int, m: int, gib: int, target: str, largest_gap: float, beat: bool,
             time_limit: float) -> dict:
    """One plan of ``PLANS``: its step, bound, gap, the phase kept, the best baseline that fits, the target."""
    if name == "70b":
        model = estimate(ROOT / "problems" / "models" / "configs" / "llama3-70b.json", gpu="h100", seq_len=8192,
                         microbatch_size=1, tp=4)
        extra = dict(chunks="auto", baseline_layout=LAYOUT_70B)
    else:
        model, extra = Model.load(ROOT / "problems" / "models" / f"{name}.yaml"), {}
    began = time.monotonic()
    result = plan(model, num_devices=p, num_microbatches=m, device_memory=gib * GIB, recompute="auto", target=target,
                  time_limit=time_limit, **extra)
    wall = time.monotonic() - began
    fitting = [b for b in result.baselines if b.fits and b.step_time is not None]
    best = min(fitting, key=lambda b: b.step_time, default=None)
    gap = result.gap
    met = gap is not None and gap <= largest_gap and bool(result.lower_bound)
    if beat:
        met = met and best is not None and result.step_time < best.step_time
    return {"plan": row, "p": p, "m": m, "kept": f"{result.source} ({result.timeline.schedule.name}'s): {result.placement} x{result.chunks}, "
            f"recompute {result.recompute}", "step s": f"{result.step_time:.4f}",
            "bound s": "unknown" if result.lower_bound is None else f"{result.lower_bound:.4f}",
            "gap": "unknown" if gap is None else f"{gap:.1%}",
            "best baseline": "-" if best is None else f"{best.schedule} {best.split} {best.recompute}: "
                                                       f"{best.step_time:.4f}",
            "target": f"gap <= {largest_gap:.0%}" + (", faster than every baseline" if beat else ""),
            "wall s": f"{wall:.0f}", "load": " ".join(f"{x:.1f}" for x in os.getloadavg()),
            "target met": "met" if met else "MISSED"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--section", choices=("plans", "limits"), default=None, help="One section (default both).")
    parser.add_argument("--only", default=None, help="Only the rows whose name (a limits row's: command placement) holds this text.")
    parser.add_argument("--time-limit", type=float, default=300.0, help="Seconds of each plan.")
    parser.add_argument("--repeats", type=int, default=3, help="Runs per limits row (the median and the largest).")
    args = parser.parse_args()
    console = Console(width=200)
    if args.section in (None, "plans"):
        rows = []
        for case in PLANS:
            if args.only is None or args.only in case[0]:
                rows.append(plan_row(*case, args.time_limit))
                console.print(rows[-1])
        console.print(records_table(rows, f"plans at {args.time_limit:g} s: the gap to the bound"))
    if args.section in (None, "limits"):
        with tempfile.TemporaryDirectory() as folder:
            rows = []
            for case in LIMITS:
                if args.only is not None and args.only not in f"{case[0]} {case[1]}":
                    continue
                rows.append(limits_row(Path(folder), *case, args.repeats))
                console.print(rows[-1])
            console.print(records_table(rows, "limits: zbsolve solve -o (unit profile), plan -o and configure -o, wall seconds"))


if __name__ == "__main__":
    main()
