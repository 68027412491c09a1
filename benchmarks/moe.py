"""Mixture-of-experts pipelines, their targets:

1. DeepSeek-V3 (61 blocks + 1 MTP layer; problems/models/deepseek-v3.yaml: TP2, EP64, seq 4096, microbatch 1, H100)
   on p=16, m=64 at 80 GiB, planned with ``--chunks auto --recompute auto``, against the published PP16 layout
   ``[E+4t] + 14x[4t] + [t+m+L]`` (Megatron's string ``Et*4|(t*4|)*14,tmL``) with the best torch built-in that
   fits on it (Megatron's 1F1B, with and without its best ``--recompute-num-layers``).
2. A profile of chunks with F = B = W = 1 whose F and B are 30% and 50% all-to-all: DualPipeV below ZB-V by what the
   overlap rule predicts (``core.overlap``; the closed form of tests/test_overlap.py), and a V-shape solve at
   DualPipeV's memory no worse than the better of the two.
   At p=4, m=8 besides p=8, m=32.
3. The same on problems/moe/deepseek-v3-stage.yaml (four DeepSeek-V3 expert blocks a stage, 53% all-to-all).

Run: .venv/bin/python benchmarks/moe.py [--time-limit 300] [--solve-time-limit 60] [--skip-plan]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

import zbsolve
from zbsolve.core.profile import Profile
from zbsolve.core.simulator import simulate
from zbsolve.core.transforms import with_limit
from zbsolve.planning.planner import plan
from zbsolve.problem.costs import memory_figures
from zbsolve.costmodel.model import Model
from zbsolve.schedulers.families import make_schedule
from zbsolve.core.schedule import pair_count

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "problems" / "models" / "deepseek-v3.yaml"
STAGE = ROOT / "problems" / "moe" / "deepseek-v3-stage.yaml"
PUBLISHED = "Et*4|(t*4|)*14,tmL"
"""DeepSeek-V3's PP16 layout ``[E+4t] + 14x[4t] + [t+m+L]`` in Megatron's grammar."""
P, M = 8, 32
"""Devices and microbatches of sections 2 and 3."""
SMALL = (4, 8)
"""A smaller pipeline of section 2, where the searched schedule overlaps some pairs and not others."""


def plan_row(time_limit: float) -> dict:
    """Section 1."""
    began = time.monotonic()
    result = plan(Model.load(MODEL), num_devices=16, num_microbatches=64, device_memory="80GiB", chunks="auto",
                  recompute="auto", time_limit=time_limit, baseline_layout=PUBLISHED)
    spent = time.monotonic() - began
    fitting = [b for b in result.baselines if b.split == "layout" and b.fits and b.step_time is not None]
    layout = min(fitting, key=lambda b: b.step_time, default=None)
    others = [b for b in result.baselines if b.fits and b.step_time is not None]
    top = min(others, key=lambda b: b.step_time, default=None)
    return {"plan": f"{result.placement} x{result.chunks}, recompute {result.recompute} ({result.source})",
            "step_s": result.step_time, "gap": result.gap, "bound_s": result.lower_bound,
            "layout": f"{layout.schedule} (layout, recompute {layout.recompute})" if layout else "none fits",
            "layout_s": layout.step_time if layout else None,
            "best": f"{top.schedule} ({top.split}, recompute {top.recompute})" if top else "none fits",
            "best_s": top.step_time if top else None,
            "most_gib": max(memory_figures(result.costs, result.timeline)["memory_gib"]),
            "met": layout is not None and result.step_time <= layout.step_time * (1 + 1e-9), "plan_s": spent}


def moe(share: float) -> Profile:
    """Stages of F = B = W = 2 (chunks of 1) whose F and B are ``share`` all-to-all."""
    return Profile(t_f=2, t_b=2, t_w=2, comm_f=2 * share, comm_b=2 * share, mem_f=1, mem_b=-0.5, mem_w=-0.5)


def predicted(share: float, slowdown: float, p: int, m: int) -> float:
    """ZB-V's makespan less DualPipeV's on ``moe(share)`` by the overlap rule (tests/test_overlap.py derives it)."""
    pair = max(2 * share, 3 - 2 * share + slowdown * 2 * share)
    return (2 * m - 2 * p - 1) * (3 - pair) - (p - 1) * (pair - 2)


def profile_row(name: str, profile: Profile, time_limit: float, share: float | None, p: int = P, m: int = M) -> dict:
    """Sections 2 and 3: ZB-V, DualPipeV and a V-shape solve at DualPipeV's memory."""
    dpv = simulate(make_schedule("dualpipev", profile, p, m))
    zbv = simulate(with_limit(make_schedule("zb-v", profile, p, m), dpv.peak))
    began = time.monotonic()
    result = zbsolve.solve(profile, dpv.peak, num_microbatches=m, num_devices=p, placement="vshape",
                           time_limit=time_limit)
    spent = time.monotonic() - began
    searched = simulate(result.schedule)
    difference = zbv.makespan - dpv.makespan
    expected = predicted(share, profile.overlap_slowdown, p, m) if share is not None else None
    pairs = pair_count(searched.schedule)
    return {"profile": name, "pm": f"{p}, {m}", "memory": dpv.peak, "zbv": zbv.makespan, "dualpipev": dpv.makespan,
            "difference": difference, "predicted": expected, "searched": searched.makespan,
            "source": f"{searched.schedule.name}, {pairs} pairs", "bound": result.lower_bound,
            "met": (expected is None or abs(difference - expected) <= 1e-9 * zbv.makespan)
            and difference > 0 and searched.makespan <= min(zbv.makespan, dpv.makespan) * (1 + 1e-9)
            and searched.peak <= dpv.peak * (1 + 1e-9), "solve_s": spent}


def fmt(value: object) -> str:
    return "-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=300.0, help="seconds of the DeepSeek-V3 plan")
    parser.add_argument("--solve-time-limit", type=float, default=60.0, help="seconds per solve of sections 2, 3")
    parser.add_argument("--skip-plan", action="store_true", help="leave out section 1")
    parser.add_argument("--json", type=Path, default=None, help="write the rows as JSON here")
    args = parser.parse_args()
    console = Console(width=240)
    row = None if args.skip_plan else plan_row(args.time_limit)
    table = Table(title=f"DeepSeek-V3 TP2 EP64, p=16, m=64, 80 GiB (plan --chunks auto --recompute auto, "
                        f"--time-limit {args.time_limit:g})")
    for column in ("plan", "step s", "bound s", "gap", "published layout's best", "its step s", "ratio",
                   "best baseline", "its step s", "most GiB", "target", "met", "plan s"):
        table.add_column(column)
    if row is not None:
        ratio = row["step_s"] / row["layout_s"] if row["layout_s"] else None
        table.add_row(row["plan"], fmt(row["step_s"]), fmt(row["bound_s"]), fmt(row["gap"]), row["layout"],
                      fmt(row["layout_s"]), fmt(ratio), row["best"], fmt(row["best_s"]), fmt(row["most_gib"]),
                      "<= published layout", "met" if row["met"] else "MISSED", f"{row['plan_s']:.0f}")
        console.print(table)
    rows = [profile_row(f"F, B {share:.0%} all-to-all", moe(share), args.solve_time_limit, share, *pm)
            for pm in (SMALL, (P, M)) for share in (0.3, 0.5)]
    rows.append(profile_row("deepseek-v3-stage", Profile.load(STAGE), args.solve_time_limit, None))
    table = Table(title=f"ZB-V, DualPipeV and the V-shape solve at DualPipeV's memory "
                        f"(--time-limit {args.solve_time_limit:g})")
    for column in ("profile", "p, m", "memory", "ZB-V", "DualPipeV", "ZB-V - DualPipeV", "the rule predicts",
                   "searched", "searched is", "bound", "target", "met", "solve s"):
        table.add_column(column)
    for r in rows:
        figures = ("memory", "zbv", "dualpipev", "difference", "predicted", "searched")
        table.add_row(r["profile"], r["pm"], *(fmt(r[k]) for k in figures), r["source"], fmt(r["bound"]),
                      "difference as predicted, searched <= both", "met" if r["met"] else "MISSED",
                      f"{r['solve_s']:.0f}")
    console.print(table)
    if args.json:
        args.json.write_text(json.dumps({"plan": row, "profiles": rows}, indent=1, default=str))


if __name__ == "__main__":
    main()
