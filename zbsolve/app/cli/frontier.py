"""zbsolve frontier: the best bubble at each memory limit, per placement, beside the families."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional

import typer

from zbsolve.app.cli.common import (
    JSON,
    QUIET,
    app,
    chart_option,
    cli_errors,
    err,
    interruptible,
    jobs_option,
    numbers,
    out,
    output_option,
    progress,
    time_limit_option,
)
from zbsolve.app.cli.groups import grouped
from zbsolve.base.files import check_output, write_atomic
from zbsolve.base.interrupt import deferred, exit_code
from zbsolve.core.placement import SUPPORTED_PLACEMENTS
from zbsolve.present.figures import Units
from zbsolve.present.tables import fmt, frontier_table
from zbsolve.problem.problem_file import Problem
from zbsolve.problem.request import DEFAULT_PLACEMENTS, FRONTIER_TIME_LIMIT


@dataclass(frozen=True)
class Sweep:
    """What ``zbsolve frontier`` solves: each placement at each memory limit, and how."""

    factors: Annotated[str, typer.Option("0.33,0.5,0.75,1,1.5,2", "--factors",
                                         help="Memory limits as K x 1F1B's peak.")]
    placements: Annotated[str, typer.Option(",".join(DEFAULT_PLACEMENTS), "--placements", help="Comma-separated "
                                            f"placements from {', '.join(SUPPORTED_PLACEMENTS)}.")]
    time_limit: Annotated[float, time_limit_option(FRONTIER_TIME_LIMIT, "Time limit of each solve in seconds.")]
    jobs: Annotated[Optional[int], jobs_option(None, "Parallel solver processes (default: all cores).")]

    def limits(self) -> list[float]:
        """The memory limits, as factors of 1F1B's peak."""
        return numbers(self.factors, "--factors")

    def names(self) -> tuple[str, ...]:
        """The placements."""
        return tuple(x.strip() for x in self.placements.split(",") if x.strip())


@app.command()
@cli_errors
@grouped
def frontier(
    problem: Path = typer.Argument(..., help="Problem YAML (profile, num_devices, num_microbatches)."), *,
    sweep: Sweep,
    output: Optional[Path] = output_option(None, "Write rows and family points (JSON)."),
    chart: Optional[Path] = chart_option(None, "Write the frontier plot (.png, .svg or .pdf)."),
    as_json: bool = JSON, quiet: bool = QUIET,
) -> None:
    """The best paper bubble at each memory limit, per placement, beside the handcrafted families.

    Ctrl-C (or SIGTERM) stops the solves still running, prints and writes the finished ones, and exits 130 (143).

    Example: zbsolve frontier problems/vshape/p16-m48.yaml --factors 0.33,0.5,1 --time-limit 60 --chart f.png
    """
    from zbsolve.optimize.frontier import frontier as run_frontier  # looked up when run: a test wraps it
    from zbsolve.present.frontier_chart import check_chart, save_frontier_chart

    if output:
        check_output(output, "--output", [problem])
    if chart:
        check_chart(chart, "--chart", [problem])
    prob = Problem.load(problem, "zbsolve frontier")
    values, names = sweep.limits(), sweep.names()
    with interruptible("before any solve finished"):
        with progress(f"{prob.name}: solves", quiet or as_json, counted=True) as update:
            result = run_frontier(prob.profile, factors=values, num_microbatches=prob.num_microbatches,
                                  num_devices=prob.num_devices, placements=names, time_limit=sweep.time_limit,
                                  jobs=sweep.jobs, progress=update)
    with deferred() as late:  # the rows are final: an interrupt now is answered once they are written whole
        doc = {"problem": prob.name, **result.to_json()}
        if output:
            write_atomic(output, json.dumps(doc, indent=1) + "\n")
        if chart:
            save_frontier_chart(result, chart, f"{prob.name}: memory-bubble frontier")
    if result.interrupted or late:
        err.print("interrupted: the rows below are the solves that finished")
    if as_json:
        print(json.dumps(doc, indent=1))
    elif not quiet:
        units = Units.of(None, prob.time_unit, prob.memory_unit)
        out.print(frontier_table(result, f"{prob.name}: memory-bubble frontier (1F1B peak "
                                         f"{fmt(result.reference_peak)} {units.memory})", units))
    if result.interrupted or late:
        raise typer.Exit(exit_code())
