"""The ``zbsolve`` command line. Exit codes: 0 ok, 1 infeasible or failed check, 2 bad input."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Callable, Optional

import typer
from rich.console import Console
from rich.table import Table

from zbsolve.document import planned_drift, read_document, write_document
from zbsolve.errors import InfeasibleError, InputError, ScheduleError, ZbsolveError
from zbsolve.families import FAMILIES, make_schedule
from zbsolve.profile import UNIT, Profile
from zbsolve.simulator import Timeline, simulate

app = typer.Typer(help="Find and check pipeline-parallel training schedules (zero bubble).",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
out = Console()
err = Console(stderr=True)

STAGES = typer.Option(..., "--stages", "-p", min=1, help="Number of pipeline devices p.")
MICROBATCHES = typer.Option(..., "--microbatches", "-m", min=1, help="Number of microbatches m.")
PROFILE = typer.Option(None, "--profile", help="Profile YAML/JSON (default: unit times, no communication, M_B=1).")
JSON = typer.Option(False, "--json", help="Print machine-readable JSON instead of a table.")
QUIET = typer.Option(False, "--quiet", "-q", help="Print nothing but errors.")


def cli_errors(fn: Callable) -> Callable:
    """Turn zbsolve's errors into one line on stderr and the documented exit code."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except InputError as exc:
            err.print(f"[red]error:[/red] {exc}", highlight=False)
            raise typer.Exit(2) from None
        except (ScheduleError, InfeasibleError) as exc:
            err.print(f"[red]invalid:[/red] {exc}", highlight=False)
            raise typer.Exit(1) from None
        except ZbsolveError as exc:
            err.print(f"[red]error:[/red] {exc}", highlight=False)
            raise typer.Exit(1) from None
    return wrapper


def _profile(path: Optional[Path]) -> Profile:
    return UNIT if path is None else Profile.load(path)


def _figures_table(rows: list[tuple[str, Timeline]], title: str) -> Table:
    table = Table(title=title)
    table.add_column("schedule")
    for col in ("makespan", "bubble_rate", "paper_bubble", "peak memory"):
        table.add_column(col, justify="right")
    for name, t in rows:
        table.add_row(name, f"{t.makespan:g}", f"{t.bubble_rate:.4f}", f"{t.paper_bubble:.4f}", f"{t.peak:g}")
    return table


def _print_timeline(name: str, timeline: Timeline, title: str) -> None:
    out.print(_figures_table([(name, timeline)], title))
    out.print("peak memory per device: " + " ".join(f"{x:g}" for x in timeline.peak_memory), highlight=False)


@app.command()
@cli_errors
def schedule(
    family: str = typer.Argument(..., help=f"Family: {', '.join(FAMILIES)}."),
    stages: int = STAGES, microbatches: int = MICROBATCHES, profile: Optional[Path] = PROFILE,
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write the schedule document (JSON)."),
    chart: Optional[Path] = typer.Option(None, "--chart", help="Write a Gantt chart (.png or .svg)."),
    as_json: bool = JSON, quiet: bool = QUIET,
) -> None:
    """Build a handcrafted schedule and print its figures.

    Example: zbsolve schedule zb-h1 --stages 8 --microbatches 24 -o zb-h1.json
    """
    timeline = simulate(make_schedule(family, _profile(profile), stages, microbatches))
    if output:
        write_document(timeline, output)
    if chart:
        from zbsolve.plot import save_chart
        save_chart(timeline, chart, memory=True)
    if as_json and not quiet:
        print(json.dumps({family: timeline.figures()}, indent=1))
    elif not quiet:
        _print_timeline(family, timeline, f"{family}: p={stages}, m={microbatches}")


@app.command()
@cli_errors
def check(file: Path = typer.Argument(..., help="Schedule document (JSON)."), as_json: bool = JSON,
          quiet: bool = QUIET) -> None:
    """Validate a schedule document and print its figures (exit 1 if invalid).

    Example: zbsolve check zb-h1.json
    """
    sched, planned = read_document(file)
    timeline = simulate(sched)
    drift = planned_drift(timeline, planned)
    if quiet:
        return
    if as_json:
        print(json.dumps({"valid": True, "name": sched.name, **timeline.figures(), "planned_drift": drift}, indent=1))
        return
    _print_timeline(sched.name, timeline, f"{file}: valid")
    if drift > 1e-6 * max(1.0, timeline.makespan):
        out.print(f"note: planned times differ from the as-soon-as-possible timing by up to {drift:g}")


@app.command()
@cli_errors
def compare(stages: int = STAGES, microbatches: int = MICROBATCHES, profile: Optional[Path] = PROFILE,
            as_json: bool = JSON, quiet: bool = QUIET) -> None:
    """Print one row of figures per handcrafted family (families that cannot run say why).

    Example: zbsolve compare --stages 8 --microbatches 24
    """
    prof = _profile(profile)
    rows, skipped = [], {}
    for name in FAMILIES:
        try:
            rows.append((name, simulate(make_schedule(name, prof, stages, microbatches))))
        except InputError as exc:
            skipped[name] = str(exc)
    if as_json and not quiet:
        print(json.dumps({"figures": {n: t.figures() for n, t in rows}, "skipped": skipped}, indent=1))
        return
    if not quiet:
        out.print(_figures_table(rows, f"families: p={stages}, m={microbatches}"))
        for name, why in skipped.items():
            out.print(f"{name}: skipped ({why})", highlight=False)


@app.command()
@cli_errors
def plot(file: Path = typer.Argument(..., help="Schedule document (JSON)."),
         output: Path = typer.Option(..., "--output", "-o", help="Chart file (.png or .svg)."),
         memory: bool = typer.Option(False, "--memory", help="Add a panel of memory over time per device."),
         quiet: bool = QUIET) -> None:
    """Draw a schedule document as a Gantt chart.

    Example: zbsolve plot zb-h1.json -o zb-h1.png --memory
    """
    from zbsolve.plot import save_chart
    sched, _ = read_document(file)
    save_chart(simulate(sched), output, memory=memory)
    if not quiet:
        out.print(f"wrote {output}")


def main() -> None:
    """Entry point for ``python -m zbsolve``."""
    app()


def reference_peak(profile: Profile, num_devices: int, num_microbatches: int) -> float:
    """1F1B's peak activation memory for this problem: the unit of ``--mem-factor``."""
    return simulate(make_schedule("1f1b", profile, num_devices, num_microbatches)).peak


@app.command()
@cli_errors
def solve(
    problem: Path = typer.Argument(..., help="Problem YAML (e.g. problems/iclr/1.5b-p8-m24.yaml)."),
    mem_limit: Optional[float] = typer.Option(None, "--mem-limit", help="Memory limit in the profile's unit."),
    mem_factor: Optional[float] = typer.Option(None, "--mem-factor", help="Memory limit as K x 1F1B's peak."),
    solver: str = typer.Option("cpsat", "--solver", help="cpsat, cbc or heuristic."),
    time_limit: float = typer.Option(60.0, "--time-limit", help="Solver time limit in seconds."),
    objective: str = typer.Option("span", "--objective", help="span (the paper's) or makespan."),
    workers: Optional[int] = typer.Option(None, "--workers", help="Solver threads (default: all cores)."),
    seed: int = typer.Option(0, "--seed", help="Solver random seed."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write the schedule document (JSON)."),
    chart: Optional[Path] = typer.Option(None, "--chart", help="Write a Gantt chart (.png or .svg)."),
    as_json: bool = JSON, quiet: bool = QUIET,
) -> None:
    """Solve a problem for the best schedule under its memory limit.

    Example: zbsolve solve problems/iclr/1.5b-p8-m24.yaml --mem-factor 2 --time-limit 30 -o best.json
    """
    from zbsolve.problem import Problem
    from zbsolve.solve import solve as run_solve

    prob = Problem.load(problem)
    if mem_limit is not None and mem_factor is not None:
        raise InputError("give --mem-limit or --mem-factor, not both")
    if mem_factor is not None and mem_factor <= 0:
        raise InputError(f"--mem-factor = {mem_factor} must be > 0")
    limit = mem_limit if mem_limit is not None else prob.mem_limit
    factor = mem_factor if mem_factor is not None else (prob.mem_factor if mem_limit is None else None)
    if factor is not None:
        limit = factor * reference_peak(prob.profile, prob.num_devices, prob.num_microbatches)
    result = run_solve(prob.profile, limit, num_microbatches=prob.num_microbatches, num_devices=prob.num_devices,
                       placement=prob.placement, solver=solver, time_limit=time_limit, objective=objective,
                       workers=workers, seed=seed)
    if output:
        result.to_json(output)
    if chart:
        from zbsolve.plot import save_chart
        save_chart(result.timeline, chart, memory=True)
    if quiet:
        return
    summary = {"problem": prob.name, "mem_limit": limit, **result.summary()}
    if as_json:
        print(json.dumps(summary, indent=1, default=str))
        return
    table = Table(title=f"{prob.name}: {solver}, mem_limit={limit:g}" if limit is not None else prob.name)
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key, value in summary.items():
        table.add_row(key, f"{value:.4f}" if isinstance(value, float) else str(value))
    for key, value in prob.published.items():
        table.add_row(f"published {key}", f"{value:.4f}")
    out.print(table)
