"""Plans where memory binds, their targets, on the costs of ``zbsolve estimate``:

1. Llama-3-70B as Megatron-Bridge's recipe shapes it (TP4, PP8, m=64, seq 8192, microbatch 1, H100), planned with
   ``--chunks auto --recompute auto`` at 80 and 64 GiB, against the uniform and torchtitan splits with every block
   recomputed and each torch built-in that fits, and against the recipe's layout with Megatron's interleaved order
   and the best single ``--recompute-num-layers`` that fits.
2. The same model at TP2: a plan that fits, or a refusal naming the device, the shortfall and a remedy.
3. Every dense model in problems/models (no layer with experts' all-to-all) at p=8, device memory stepped from
   where no baseline fits without recomputation to where every one does: the plan never worse than a baseline that
   fits, its step never rising with memory.

Run: .venv/bin/python benchmarks/recompute.py [--time-limit 300] [--sweep-time-limit 30] [--skip-sweep]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from zbsolve.base.errors import InfeasibleError
from zbsolve.base.units import GIB
from zbsolve.planning.baselines import baselines
from zbsolve.planning.planner import plan
from zbsolve.costmodel.estimate import estimate
from zbsolve.costmodel.model import Model

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "problems" / "models" / "configs" / "llama3-70b.json"
LAYOUT = "Et*2|(t*2|)*34,t*3|(t*2|)*3,tL"
"""Megatron-Bridge's Llama-3-70B layout (PP8, VP5)."""
TARGETS = {80: 0.76, 64: 0.88}
"""Plan step time / the best fitting baseline with every block recomputed, per device memory (GiB)."""
GAP_TARGET, LAYOUT_TARGET, LAYOUT_STRETCH = 0.05, 1.0, 0.95
"""The plan's gap to its bound at 80 GiB; plan / the layout's best row (target, stretch)."""
SWEEP_DEVICES, SWEEP_MICROBATCHES, SWEEP_POINTS = 8, 32, 4


def best(result, keep) -> object:
    """The fastest baseline row that fits and ``keep`` accepts."""
    rows = [b for b in result.baselines if b.fits and b.step_time is not None and keep(b)]
    return min(rows, key=lambda b: b.step_time, default=None)


def recipe_rows(time_limit: float) -> list[dict]:
    """Section 1 and 2."""
    rows = []
    model = estimate(CONFIG, gpu="h100", seq_len=8192, microbatch_size=1, tp=4)
    for gib in TARGETS:
        began = time.monotonic()
        result = plan(model, num_devices=8, num_microbatches=64, device_memory=f"{gib}GiB", chunks="auto",
                      recompute="auto", time_limit=time_limit, baseline_layout=LAYOUT)
        spent = time.monotonic() - began
        shown = f"{result.placement} x{result.chunks}, recompute {result.recompute}"
        full = best(result, lambda b: b.recompute == "full" and b.split in ("uniform", "torchtitan"))
        ratio = result.step_time / full.step_time
        rows.append({"setting": f"70B tp4, {gib} GiB", "plan": shown, "step_s": result.step_time, "gap": result.gap,
                     "against": f"{full.schedule} ({full.split}, full)", "its_s": full.step_time, "ratio": ratio,
                     "target": f"<= {TARGETS[gib]}" + (f", gap <= {GAP_TARGET}" if gib == 80 else ""),
                     "met": ratio <= TARGETS[gib] and (gib != 80 or result.gap is not None
                                                       and result.gap <= GAP_TARGET), "plan_s": spent})
        layout = best(result, lambda b: b.split == "layout")
        ratio = result.step_time / layout.step_time if layout else None
        rows.append({"setting": f"70B tp4, {gib} GiB", "plan": shown, "step_s": result.step_time, "gap": result.gap,
                     "against": f"{layout.schedule} (layout, {layout.recompute})" if layout else "no layout row fits",
                     "its_s": layout.step_time if layout else None, "ratio": ratio,
                     "target": f"<= {LAYOUT_TARGET} (stretch {LAYOUT_STRETCH})",
                     "met": ratio is not None and ratio <= LAYOUT_TARGET, "plan_s": spent,
                     "stretch": ratio is not None and ratio <= LAYOUT_STRETCH})
    began = time.monotonic()
    try:
        result = plan(estimate(CONFIG, gpu="h100", seq_len=8192, microbatch_size=1, tp=2), num_devices=8,
                      num_microbatches=64, device_memory="80GiB", chunks="auto", recompute="auto",
                      time_limit=time_limit)
        outcome, met, step = f"{result.placement} x{result.chunks}, recompute {result.recompute}", True, \
            result.step_time
    except InfeasibleError as exc:
        outcome, step = str(exc), None
        met = " does not fit: " in outcome and "what would help:" in outcome
    rows.append({"setting": "70B tp2, 80 GiB", "plan": outcome, "step_s": step, "gap": None, "against": "-",
                 "its_s": None, "ratio": None, "target": "fits, or names device, shortfall, remedy", "met": met,
                 "plan_s": time.monotonic() - began})
    return rows


def memories(model: Model) -> list[int]:
    """``SWEEP_POINTS`` device memories (GiB) from the last where no baseline fits without recomputation to the
    first where each does (160 GiB at most)."""
    def fitting(gib: int) -> list[bool]:
        rows = baselines(model, SWEEP_DEVICES, SWEEP_MICROBATCHES, gib * GIB)
        return [b.fits for b in rows if b.recompute == "none" and b.step_time is not None]

    steps = range(8, 161, 8)
    low = next((g for g in steps if any(fitting(g))), 160) - 8
    high = next((g for g in steps if all(fitting(g))), 160)
    return sorted({round(low + (high - low) * k / (SWEEP_POINTS - 1)) for k in range(SWEEP_POINTS)})


def sweep_rows(time_limit: float) -> list[dict]:
    """Section 3: one row per model."""
    rows = []
    for path in sorted((ROOT / "problems" / "models").glob("*.yaml")):
        model = Model.load(path)
        if any(layer.comm_f is not None for layer in model.layers):
            continue
        steps, worse, began = [], [], time.monotonic()
        for gib in memories(model):
            try:
                result = plan(model, num_devices=SWEEP_DEVICES, num_microbatches=SWEEP_MICROBATCHES,
                              device_memory=f"{gib}GiB", chunks="auto", recompute="auto", time_limit=time_limit)
            except InfeasibleError:
                steps.append((gib, None))
                continue
            steps.append((gib, result.step_time))
            top = best(result, lambda b: True)
            if top is not None and result.step_time > top.step_time * (1 + 1e-9):
                worse.append(f"{gib} GiB: {top.schedule} ({top.split}, {top.recompute})")
        found = [s for _, s in steps if s is not None]
        rising = [f"{a[0]}->{b[0]} GiB" for a, b in zip(steps, steps[1:])
                  if a[1] is not None and b[1] is not None and b[1] > a[1] * (1 + 1e-9)]
        rows.append({"model": model.name, "steps": ", ".join(f"{g}: {'-' if s is None else f'{s:.3f}'}"
                                                             for g, s in steps),
                     "never_worse": not worse, "worse": "; ".join(worse), "monotone": not rising,
                     "rising": "; ".join(rising), "met": bool(found) and not worse and not rising,
                     "plan_s": time.monotonic() - began})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=300.0, help="seconds per plan of sections 1 and 2")
    parser.add_argument("--sweep-time-limit", type=float, default=30.0, help="seconds per plan of the sweep")
    parser.add_argument("--skip-sweep", action="store_true", help="leave out section 3")
    parser.add_argument("--json", type=Path, default=None, help="write the rows as JSON here")
    args = parser.parse_args()
    console = Console(width=240)
    rows = recipe_rows(args.time_limit)
    table = Table(title=f"Llama-3-70B, p=8, m=64 (plan --chunks auto --recompute auto, --time-limit "
                        f"{args.time_limit:g})")
    for column in ("setting", "plan", "step s", "gap", "against", "its step s", "ratio", "target", "met", "plan s"):
        table.add_column(column)
    for r in rows:
        met = ("met" if r["met"] else "MISSED") + ("" if "stretch" not in r else
                                                    ", stretch met" if r["stretch"] else ", stretch missed")
        table.add_row(r["setting"], r["plan"], *(f"{r[k]:.3f}" if r[k] is not None else "-"
                                                 for k in ("step_s", "gap")), r["against"],
                      *(f"{r[k]:.3f}" if r[k] is not None else "-" for k in ("its_s", "ratio")), r["target"], met,
                      f"{r['plan_s']:.0f}")
    console.print(table)
    sweep = [] if args.skip_sweep else sweep_rows(args.sweep_time_limit)
    if sweep:
        table = Table(title=f"every model, p={SWEEP_DEVICES}, m={SWEEP_MICROBATCHES}, memory stepped (GiB: plan step "
                            f"s; --time-limit {args.sweep_time_limit:g})")
        for column in ("model", "plan step per device memory", "never worse than a baseline that fits",
                       "never rises with memory", "met", "plan s"):
            table.add_column(column)
        for r in sweep:
            table.add_row(r["model"], r["steps"], "yes" if r["never_worse"] else f"no: {r['worse']}",
                          "yes" if r["monotone"] else f"no: {r['rising']}", "met" if r["met"] else "MISSED",
                          f"{r['plan_s']:.0f}")
        console.print(table)
    if args.json:
        args.json.write_text(json.dumps({"recipe": rows, "sweep": sweep}, indent=1, default=str))


if __name__ == "__main__":
    main()
