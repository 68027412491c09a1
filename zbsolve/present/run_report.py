"""What ``zbsolve run`` prints: each rank's measured times, bubble and memory beside the simulator's, as tables that
fit 100 columns (the times, the step, the memory apart), or whole in one table (``--wide``).

The rows are ``runtime.executor.run_schedule``'s. Measured: pass times (ms), the bubble, the step (ms), the peak of
saved tensors (MiB). Simulated: with the plan's own times ("sim"; its step in ms where its times are a model's
seconds) and with the measured times ("sim ... (measured t)"); the plan's peak in MiB where its memory is bytes, else
in the profile's unit (``present.figures.Units``).
"""

from __future__ import annotations

from collections.abc import Sequence

from zbsolve.core.schedule import BW, B, F, W
from zbsolve.present.figures import Units
from zbsolve.present.tables import fmt

REPORT_COLUMNS = ("rank", "stages", "F ms", "B ms", "W ms", "BW ms", "bubble", "sim bubble", "sim bubble (measured t)",
                  "makespan ms", "sim makespan ms", "plan makespan ms", "peak MiB", "sim peak MiB (measured)",
                  "plan peak", "grad check")
"""Columns of ``report_table``, the whole report in one table."""
TIME_COLUMNS = ("rank", "stages", "F ms", "B ms", "W ms", "BW ms", "bubble", "sim bubble", "sim bubble (measured t)",
                "grad check")
"""Columns of ``time_table``: the passes' times, the bubbles and the gradient check per rank."""
MEMORY_COLUMNS = ("rank", "stages", "peak MiB", "sim peak MiB (measured)", "plan peak")
"""Columns of ``memory_table``: each rank's peak, measured and simulated."""


def report_note(rows: list[dict]) -> str | None:
    """The line under the memory figures when blocks recompute: which, and what the measured and the plan's peaks
    count; None when none does."""
    names, selective = ([name for row in rows for name in row.get(key, ())] for key in ("recomputed", "selective"))
    if not names and not selective:
        return None
    return (f"recomputed: {', '.join(names) or '-'}; selective: {', '.join(selective) or '-'}. peak MiB counts their "
            "inputs from F and their recomputed activations from the backward that recomputes them (B; W on the first "
            "stage) to W's end; plan peak is the plan's, which holds those from B's end on every stage and counts a "
            "recomputing B's input twice (mem_r)")


def _ms(row: dict, kind: str) -> str:
    return f"{row['pass_ms'][kind]:.2f}" if kind in row["pass_ms"] else "-"


def _plan_peak(row: dict, units: Units | None) -> str:
    """The plan's peak of the rank's device with its unit: MiB where the plan's memory is bytes."""
    if row["plan_peak_mib"] is not None:
        return f"{row['plan_peak_mib']:.3f} MiB"
    return f"{fmt(float(row['sim_peak']))} ({(units or Units()).memory})"


def report_table(rows: list[dict], units: Units | None = None) -> list[list[str]]:
    """``run_schedule``'s rows as strings under ``REPORT_COLUMNS``: measured beside simulated."""
    def plan(row: dict) -> str:
        return "-" if row["plan_makespan_ms"] is None else f"{row['plan_makespan_ms']:.1f}"

    return [[str(r["rank"]), ",".join(map(str, r["stages"])), _ms(r, F), _ms(r, B), _ms(r, W), _ms(r, BW),
             f"{r['bubble']:.3f}", f"{r['sim_bubble']:.3f}", f"{r['sim_bubble_measured']:.3f}",
             f"{r['makespan_ms']:.1f}", f"{r['sim_makespan_ms']:.1f}", plan(r), f"{r['peak_saved_mib']:.3f}",
             f"{r['sim_peak_mib']:.3f}", _plan_peak(r, units), r["grad_check"]] for r in rows]


def time_table(rows: list[dict]) -> tuple[Sequence[str], list[list[str]]]:
    """The columns and rows of the times per rank (``TIME_COLUMNS``; BW ms only where a rank runs a BW)."""
    fused = any(BW in r["pass_ms"] for r in rows)
    columns = [c for c in TIME_COLUMNS if fused or c != "BW ms"]
    table = [[str(r["rank"]), ",".join(map(str, r["stages"])), _ms(r, F), _ms(r, B), _ms(r, W),
              *([_ms(r, BW)] if fused else []), f"{r['bubble']:.3f}", f"{r['sim_bubble']:.3f}",
              f"{r['sim_bubble_measured']:.3f}", r["grad_check"]] for r in rows]
    return columns, table


def step_line(rows: list[dict]) -> str:
    """The step, the same on every rank: measured, simulated with the measured times, and the plan's where its times
    are seconds."""
    first = rows[0]
    plan = "" if first["plan_makespan_ms"] is None else f"; the plan's {first['plan_makespan_ms']:.1f} ms"
    return (f"step (makespan): measured {first['makespan_ms']:.1f} ms; simulated with the measured times "
            f"{first['sim_makespan_ms']:.1f} ms{plan}")


def memory_table(rows: list[dict], units: Units | None = None) -> list[list[str]]:
    """The rows of the peak memory per rank under ``MEMORY_COLUMNS``."""
    return [[str(r["rank"]), ",".join(map(str, r["stages"])), f"{r['peak_saved_mib']:.3f}", f"{r['sim_peak_mib']:.3f}",
             _plan_peak(r, units)] for r in rows]
