"""zbsolve solve: the best schedule of a problem, a model or a profile."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from zbsolve.app.cli.common import (
    GANTT_CHART,
    JSON,
    QUIET,
    SCHEDULE_OUTPUT,
    app,
    cli_errors,
    devices_option,
    err,
    file_units,
    interruptible,
    microbatches_option,
    print_result,
    progress,
    time_limit_option,
    unit_keys,
)
from zbsolve.app.cli.groups import grouped
from zbsolve.app.cli.options import setup_options
from zbsolve.base.clock import command_began
from zbsolve.base.errors import InputError
from zbsolve.base.files import check_output
from zbsolve.base.interrupt import deferred, exit_code
from zbsolve.core.objective import OBJECTIVES
from zbsolve.core.placement import CHUNKS, SUPPORTED_PLACEMENTS
from zbsolve.core.profile import Profile
from zbsolve.costmodel.model import Model
from zbsolve.costmodel.setup import Setup
from zbsolve.optimize.result import SolveResult
from zbsolve.present.figures import Units, published_rows
from zbsolve.problem.costs import Costs
from zbsolve.problem.problem_file import Problem, completed, load_input
from zbsolve.problem.request import SOLVERS, TIME_LIMIT, Request

PARTITION = typer.Option("uniform", "--partition",
                         help="A model's layers per stage: uniform, or counts such as 5,4,4,4,4,4,4,6.")
OBJECTIVE = typer.Option(OBJECTIVES[0], "--objective",
                         help=f"One of {', '.join(OBJECTIVES)}: makespan is the step time with an optimizer barrier, "
                              "span the paper's objective (a runtime without one).")
PLACEMENT = typer.Option(None, "--placement", help=f"One of {', '.join(SUPPORTED_PLACEMENTS)} (default: the "
                         "problem's, else sequential).")
RECOMPUTE = typer.Option("none", "--recompute", help="A model's blocks that run their forward again inside their B: "
                         "none, full (every block), uniform:N (the first N of every stage), per-stage:N,N,... (the "
                         "first N_s of stage s), per-stage (the counts chosen for the shortest step), selective "
                         "(every block's norms and MLP activation function; 'selective+' before uniform or per-stage: "
                         "the blocks not recomputed whole), modules:M,M,... (Megatron's) or op (torchtitan's per-op "
                         "policy).")


@dataclass(frozen=True)
class SolveArgs:
    """What ``zbsolve solve`` is asked, in its help's order: the request's fields under their names (``Request``),
    and where and how it shows the schedule."""

    num_devices: Annotated[Optional[int], devices_option(None, "Pipeline devices p (required for a model or a "
                                                         "profile).", show_default=False)]
    num_microbatches: Annotated[Optional[int], microbatches_option(None, "Microbatches m (required for a model or a "
                                                                   "profile).", show_default=False)]
    partition: Annotated[str, PARTITION]
    mem_limit: Annotated[Optional[float], typer.Option(None, "--mem-limit",
                                                       help="Memory limit in the profile's unit.")]
    mem_factor: Annotated[Optional[float], typer.Option(None, "--mem-factor",
                                                        help="Memory limit as K x 1F1B's peak.")]
    solver: Annotated[str, typer.Option(SOLVERS[0], "--solver", help=f"One of {', '.join(SOLVERS)}.")]
    time_limit: Annotated[float, time_limit_option(TIME_LIMIT, "Solver time limit in seconds.")]
    objective: Annotated[str, OBJECTIVE]
    workers: Annotated[Optional[int], typer.Option(None, "--workers", help="Solver threads (default: all cores).")]
    seed: Annotated[int, typer.Option(0, "--seed", help="Solver random seed.")]
    output: Annotated[Optional[Path], SCHEDULE_OUTPUT]
    chart: Annotated[Optional[Path], GANTT_CHART]
    as_json: Annotated[bool, JSON]
    quiet: Annotated[bool, QUIET]
    placement: Annotated[Optional[str], PLACEMENT]
    chunks: Annotated[int, typer.Option(CHUNKS, "--chunks", help="Stages per device of interleaved and vshape.")]
    recompute: Annotated[str, RECOMPUTE]

    def wanted(self) -> dict[str, Any]:
        """The request's fields as given (a problem file completes them: ``_load``)."""
        return {name: getattr(self, name) for name in Request.model_fields if hasattr(self, name)}


@app.command()
@cli_errors
@setup_options(Setup, ("device_memory", "reserve"), read=False)
@grouped
def solve(
    problem: Path = typer.Argument(..., metavar="PROBLEM",
                                   help="Problem, model or per-stage profile file (YAML/JSON)."),
    *, args: SolveArgs,
    knobs: dict[str, Any] = {},  # noqa: B006 (set by setup_options)
) -> None:
    """Solve a problem, a model or a per-stage profile for the best schedule that fits the memory.

    Ctrl-C (or SIGTERM) stops the solve, writes the best schedule found so far and exits 130 (143).

    Example: zbsolve solve problems/models/llama3-8b.yaml --devices 8 --microbatches 32 --device-memory 80GiB

    Example: zbsolve solve problems/iclr/1.5b-p8-m24.yaml --mem-factor 2 --time-limit 30 -o best.json
    """
    from zbsolve.optimize.solve import solve_request  # looked up when run: a test wraps it
    from zbsolve.present.plot import check_chart_path

    began = command_began()  # loading counts against the limit
    if args.output:
        check_output(args.output, "--output", [problem])
    if args.chart:
        check_chart_path(args.chart, "--chart", [problem])
    with interruptible("before the first schedule was built"):
        costs, name, published, table, keywords = _load(problem, {**args.wanted(), **knobs})
        request = Request(**keywords)
        with progress(f"{name}: {args.solver}, limit {args.time_limit:g}s", args.quiet or args.as_json) as update:
            result = solve_request(costs, request, update, began, check=True)  # loading counts against the limit
    stated = file_units(problem)
    units = Units.of(result.costs, stated.time, stated.memory)
    interrupted = _write(result, result.title(name), units, args.output, args.chart)
    if not args.quiet:
        solved = (result.schedule.num_devices, result.schedule.num_microbatches)
        rows = published_rows(published, table, solved, args.objective)
        _print(result, name, f"{name}: {args.solver}", units, args.as_json, rows)
    if interrupted:
        raise typer.Exit(exit_code())


def _load(problem: Path, wanted: dict[str, Any]) -> tuple[Profile | Model, str, dict[str, float], tuple[int, int],
                                                          dict[str, Any]]:
    """The costs in the file at ``problem``, its name, the figures it publishes and the (p, m) of their table, and
    the request's fields ``wanted`` completed by what a problem file states (its p and m, its memory limit and its
    placement where the command line gives none)."""
    given = load_input(problem, "zbsolve solve")
    fields = dict(wanted)
    if isinstance(given, Problem):
        return (given.profile, given.name, given.published, (given.num_devices, given.num_microbatches),
                completed(given, fields))
    if fields["num_devices"] is None or fields["num_microbatches"] is None:
        raise InputError(f"{problem}: give --devices and --microbatches to solve a "
                         f"{'model' if isinstance(given, Model) else 'profile'}")
    if isinstance(given, Model) and fields["mem_factor"] is not None:
        raise InputError("--mem-factor applies to a problem or a profile; give --device-memory for a model")
    fields["placement"] = fields["placement"] or "sequential"
    return given, problem.stem, {}, (0, 0), fields


def _write(result: SolveResult, title: str, units: Units, output: Optional[Path], chart: Optional[Path]) -> bool:
    """The schedule written to ``output`` and charted to ``chart`` whole, even when interrupted meanwhile; whether
    the solve or the writing was interrupted (one line on stderr says what was written)."""
    from zbsolve.present.plot import save_chart

    with deferred() as late:  # the result is final: an interrupt now is answered once it is written whole
        if output:
            result.to_json(output, **unit_keys(units))
        if chart:
            save_chart(result.timeline, chart, memory=True, costs=result.costs, title=title, units=units)
    interrupted = result.interrupted or bool(late)
    if interrupted:
        written = [str(path) for path in (output, chart) if path]
        err.print(f"interrupted: the best schedule found so far{' is in ' + ', '.join(written) if written else ''}",
                  highlight=False, markup=False, soft_wrap=True)
    return interrupted


def _print(result: SolveResult, name: str, title: str, units: Units, as_json: bool,
           rows: tuple[dict[str, float], Optional[str]]) -> None:
    """The solve's figures as a table under ``title`` (with the figures its problem publishes, ``rows``, and their
    note) or as JSON."""
    summary = {"problem": name, **_costs_figures(result.costs, result.schedule.mem_limit), **result.summary()}
    if as_json:
        print(json.dumps({**summary, "units": {"time": units.time, "memory": units.memory}}, indent=1, default=str))
    else:
        print_result(summary, result.costs, title, units=units, extra=rows[0], note=rows[1])


def _costs_figures(costs: Optional[Costs], limit: object) -> dict[str, object]:
    """What the problem's costs are: the partition's layers per stage for a model, else the memory limit (none where
    the device memory bounds it)."""
    if costs is not None and costs.model is not None:
        return {"partition": [b - a for a, b in costs.ranges]}
    return {} if costs is not None and costs.device_memory is not None else {"mem_limit": limit}
