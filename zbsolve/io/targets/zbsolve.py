"""The zbsolve target: its row of the target table, and its export, torch's CSV, which zbsolve's own executor
(``zbsolve run``, ``zbsolve.execute``) and any torch runtime run (docs/torch.md)."""

from __future__ import annotations

from pathlib import Path

from zbsolve.io.targets.export import Export, Request
from zbsolve.io.targets.plan import Plan
from zbsolve.io.targets.target import Target
from zbsolve.io.torch_csv import export_schedule

ZBSOLVE = Target(
    name="zbsolve", label="zbsolve's executor (zbsolve run)",
    placements={"sequential": None, "interleaved": None, "vshape": None, "bidirectional": None},
    order="planned", own_schedule=None, recompute=("none", "full", "uniform", "per-stage"), selective=True,
    selective_experts=True, auto_recompute=("none", "full", "per-stage", "selective", "selective+per-stage"),
    pairs=True, mtp=True, grouped_microbatches=False, layout_only=False, source="zbsolve/execute/executor.py")
"""zbsolve's own executor runs the schedule document as it is: any placement, order, recomputation and pair."""


def write_csv(request: Request) -> tuple[list[Path], str]:
    """The request's schedule alone (its costs, if any, are not read) as torch's CSV at its output; returns the
    file and the CSV."""
    output = request.destination()
    return [Path(output)], export_schedule(request.schedule(), output)


def takes(plan: Plan) -> object:
    """The row's refusals of ``plan`` (``Plan.check``): the executor runs the document as it is."""
    return plan.check(ZBSOLVE)


EXPORT = Export(target=ZBSOLVE, format="torch-csv", rank=0, write=write_csv, takes=takes)
"""The zbsolve target in the registry: torch's CSV, any torch runtime's."""
