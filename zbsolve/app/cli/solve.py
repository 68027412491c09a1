"""zbsolve solve: the best schedule of a problem, a model or a profile."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from zbsolve.app.cli.common import (
    JSON,
    QUIET,
    RESERVE,
    app,
    cli_errors,
    command_began,
    err,
    file_units,
    interruptible,
    print_result,
    progress,
)
from zbsolve.base.errors import InputError
from zbsolve.base.files import check_output
from zbsolve.base.interrupt import deferred, exit_code
from zbsolve.core.placement import CHUNKS, SUPPORTED_PLACEMENTS
from zbsolve.core.profile import Profile
from zbsolve.core.objective import OBJECTIVES
from zbsolve.optimize.solve import solve_request
from zbsolve.present.figures import Units, published_rows
from zbsolve.present.plot import check_chart_path, save_chart
from zbsolve.problem.costs import Costs
from zbsolve.costmodel.model import Model
from zbsolve.problem.problem_file import Problem, load_input
from zbsolve.problem.request import SOLVERS, TIME_LIMIT, Request


@app.command()
@cli_errors
def solve(
    problem: Path = typer.Argument(..., help="Problem, model or per-stage profile file (YAML/JSON)."),
    devices: Optional[int] = typer.Option(None, "--devices", "-p", min=1, show_default=False,
                                          help="Pipeline devices p (required for a model or a profile)."),
    microbatches: Optional[int] = typer.Option(None, "--microbatches", "-m", min=1, show_default=False,
                                               help="Microbatches m (required for a model or a profile)."),
    device_memory: Optional[str] = typer.Option(None, "--device-memory", show_default=False,
                                                help="Memory per device, e.g. 80GiB, 80GB or bytes (default for a "
                                                     "model: its GPU's)."),
    reserve: str = RESERVE,
    partition: str = typer.Option("uniform", "--partition",
                                  help="A model's layers per stage: uniform, or counts such as 5,4,4,4,4,4,4,6."),
    mem_limit: Optional[float] = typer.Option(None, "--mem-limit", help="Memory limit in the profile's unit."),
    mem_factor: Optional[float] = typer.Option(None, "--mem-factor", help="Memory limit as K x 1F1B's peak."),
    solver: str = typer.Option(SOLVERS[0], "--solver", help=f"One of {', '.join(SOLVERS)}."),
    time_limit: float = typer.Option(TIME_LIMIT, "--time-limit", help="Solver time limit in seconds."),
    objective: str = typer.Option(OBJECTIVES[0], "--objective",
                                  help=f"One of {', '.join(OBJECTIVES)}: makespan is the step time with an optimizer "
                                       "barrier, span the paper's objective (a runtime without one)."),
    workers: Optional[int] = typer.Option(None, "--workers", help="Solver threads (default: all cores)."),
    seed: int = typer.Option(0, "--seed", help="Solver random seed."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write the schedule document (JSON)."),
    chart: Optional[Path] = typer.Option(None, "--chart", help="Write a Gantt chart (.png or .svg)."),
    as_json: bool = JSON, quiet: bool = QUIET,
    placement: Optional[str] = typer.Option(None, "--placement", help=f"One of {', '.join(SUPPORTED_PLACEMENTS)} "
                                            "(default: the problem's, else sequential)."),
    chunks: int = typer.Option(CHUNKS, "--chunks", help="Stages per device of interleaved and vshape."),
    recompute: str = typer.Option("none", "--recompute", help="A model's blocks that run their forward again inside "
                                  "their B: none, full (every block), uniform:N (the first N of every stage), "
                                  "per-stage:N,N,... (the first N_s of stage s), per-stage (the counts chosen for the "
                                  "shortest step), selective (every block's norms and MLP activation function; "
                                  "'selective+' before uniform or per-stage: the blocks not recomputed whole)."),
) -> None:
    """Solve a problem, a model or a per-stage profile for the best schedule that fits the memory.

    Ctrl-C (or SIGTERM) stops the solve, writes the best schedule found so far and exits 130 (143).

    Example: zbsolve solve problems/models/llama3-8b.yaml --devices 8 --microbatches 32 --device-memory 80GiB

    Example: zbsolve solve problems/iclr/1.5b-p8-m24.yaml --mem-factor 2 --time-limit 30 -o best.json
    """
    began = command_began()  # loading counts against the limit
    if output:
        check_output(output, "--output", [problem])
    if chart:
        check_chart_path(chart, "--chart", [problem])
    with interruptible("before the first schedule was built"):
        given = load_input(problem, "zbsolve solve")
        published: dict[str, float] = {}
        table = (0, 0)  # the (p, m) of the paper's table, for a problem that holds its figures
        if isinstance(given, Problem):
            costs: Profile | Model = given.profile
            name, published = given.name, given.published
            table = (given.num_devices, given.num_microbatches)
            p, m = devices or given.num_devices, microbatches or given.num_microbatches
            if mem_limit is None and mem_factor is None and device_memory is None:
                mem_limit, mem_factor = given.mem_limit, given.mem_factor
            placement = placement or given.placement
        else:
            if devices is None or microbatches is None:
                raise InputError(f"{problem}: give --devices and --microbatches to solve a "
                                 f"{'model' if isinstance(given, Model) else 'profile'}")
            if isinstance(given, Model) and mem_factor is not None:
                raise InputError("--mem-factor applies to a problem or a profile; give --device-memory for a model")
            costs, name, p, m = given, problem.stem, devices, microbatches
        request = Request(num_microbatches=m, num_devices=p, placement=placement or "sequential", chunks=chunks,
                          mem_limit=mem_limit, mem_factor=mem_factor, device_memory=device_memory, reserve=reserve,
                          partition=partition, objective=objective, solver=solver, time_limit=time_limit,
                          workers=workers, seed=seed, recompute=recompute)
        with progress(f"{name}: {solver}, limit {time_limit:g}s", quiet or as_json) as update:
            result = solve_request(costs, request, update, began, check=True)  # loading counts against the limit
    stated = file_units(problem)
    units = Units.of(result.costs, stated.time, stated.memory)
    with deferred() as late:  # the result is final: an interrupt now is answered once it is written whole
        if output:
            result.to_json(output)
        if chart:
            save_chart(result.timeline, chart, memory=True, costs=result.costs, title=result.title(name), units=units)
    interrupted = result.interrupted or bool(late)
    if interrupted:
        written = [str(path) for path in (output, chart) if path]
        err.print(f"interrupted: the best schedule found so far{' is in ' + ', '.join(written) if written else ''}",
                  highlight=False, markup=False, soft_wrap=True)
    if not quiet:
        summary = {"problem": name, **_costs_figures(result.costs, result.schedule.mem_limit), **result.summary()}
        if as_json:
            print(json.dumps({**summary, "units": {"time": units.time, "memory": units.memory}}, indent=1,
                             default=str))
        else:
            rows, note = published_rows(published, table, (p, m), objective)
            print_result(summary, result.costs, f"{name}: {solver}", units=units, extra=rows, note=note)
    if interrupted:
        raise typer.Exit(exit_code())


def _costs_figures(costs: Costs, limit: object) -> dict[str, object]:
    """What the problem's costs are: the partition's layers per stage for a model, else the memory limit."""
    if costs.model is not None:
        return {"partition": [b - a for a, b in costs.ranges]}
    return {} if costs.device_memory is not None else {"mem_limit": limit}
