"""zbsolve grid and zbsolve summarize: many solves, their results kept as they finish."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from zbsolve.app.cli.common import (
    QUIET,
    app,
    cli_errors,
    err,
    executor_option,
    interruptible,
    jobs_option,
    out,
    output_option,
)
from zbsolve.app.cli.groups import grouped
from zbsolve.base.errors import InputError
from zbsolve.base.files import check_output

if TYPE_CHECKING:
    from zbsolve.app.grid.jobs import Job, PlanJob


@dataclass(frozen=True)
class GridRun:
    """How ``zbsolve grid`` runs its jobs, and where it keeps their results."""

    jobs: Annotated[int, jobs_option(1, "Parallel solver processes (one thread each).", min=1)]
    output: Annotated[Path, output_option(..., "Results file (JSONL); a rerun resumes from it.")]
    executor: Annotated[Optional[str], executor_option(None, "dask://HOST:PORT to run on a Dask cluster.")]
    schedules: Annotated[Optional[Path], typer.Option(None, "--schedules",
                                                      help="Folder for each job's schedule document.")]
    summary: Annotated[Optional[Path], typer.Option(None, "--summary",
                                                    help="Also write a flat CSV table of all results.")]
    retry_failed: Annotated[bool, typer.Option(False, "--retry-failed",
                                               help="Also run again the jobs recorded as failed.")]


@app.command()
@cli_errors
@grouped
def grid(file: Path = typer.Argument(..., help="Grid YAML (e.g. problems/grids/smoke.yaml)."), *, run: GridRun,
         quiet: bool = QUIET) -> None:
    """Solve every job of a config grid in parallel, appending each result to a JSONL file at once.

    Every job is checked before the first one runs. Running the same command again skips the jobs already in the
    file (--retry-failed runs the failed ones again). Ctrl-C or SIGTERM keeps every finished result and still
    writes --summary. Exits 1 when the latest result of any of the grid's jobs is a failure.

    Example: zbsolve grid problems/grids/smoke.yaml --jobs 2 -o results.jsonl --summary results.csv
    """
    import signal

    from zbsolve.base.interrupt import exit_code

    with interruptible("before any job ran"):  # reading the grid, its models and the results to resume from
        from zbsolve.app.grid import Grid, expand, failed, pending, read_results, write_summary

        spec = Grid.load(file, "zbsolve grid")
        inputs: list[str | Path] = [file, *spec.problems, *spec.models]
        check_output(run.output, "--output", inputs)
        if run.summary is not None:
            check_output(run.summary, "--summary", [*inputs, run.output])  # the results file is read to resume
        job_list = expand(spec)
        keys = {job.key for job in job_list}
        total, done = pending(job_list, run.output, run.retry_failed)
        failures = 0 if run.retry_failed else sum(failed(r) for r in read_results(run.output) if r["hash"] in keys)
    ran, interrupted = _solve(spec.name, job_list, run, (total, done, failures), quiet)
    records = read_results(run.output)
    if run.summary is not None:
        write_summary(records, run.summary)
    if interrupted:
        kept = run.output if run.summary is None else f"{run.output} (summary: {run.summary})"
        err.print(f"interrupted by {signal.Signals(exit_code() - 128).name}: finished results are kept in {kept}; "
                  "rerun the command to resume", highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(exit_code())
    failures = sum(failed(r) for r in records if r["hash"] in keys)
    line = (f"{total} jobs: {done} already done, {ran} run, {failures} failed; results in {run.output}"
            + ("" if run.summary is None else f", summary in {run.summary}"))
    if failures:
        err.print(f"{line}; --retry-failed runs the failed jobs again", highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(1)
    if not quiet:
        out.print(line, highlight=False, markup=False, soft_wrap=True)


def _solve(name: str, job_list: Sequence[Job | PlanJob], run: GridRun, counts: tuple[int, int, int],
           quiet: bool) -> tuple[int, bool]:
    """The jobs of grid ``name`` not yet done solved as ``run`` says, each result appended as it comes, under a bar
    of the jobs done and failed (``counts``: jobs, those done and those failed before); the jobs run and whether an
    interrupt (SIGINT or SIGTERM) stopped them."""
    from contextlib import closing

    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from zbsolve.app.grid import failed, solve_grid
    from zbsolve.base.interrupt import signals_as_interrupt

    total, done, failures = counts
    ran = 0
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[fail]}"),
               TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
    with signals_as_interrupt():
        try:
            with Progress(*columns, console=err, disable=quiet) as progress:
                task = progress.add_task(name, total=total, completed=done, fail=f"{failures} failed")
                with closing(solve_grid(job_list, jobs=run.jobs, executor=run.executor, output=run.output,
                                        schedules_dir=run.schedules, retry_failed=run.retry_failed)) as stream:
                    for record in stream:
                        ran += 1
                        failures += failed(record)
                        progress.update(task, advance=1, fail=f"{failures} failed")
        except KeyboardInterrupt:
            return ran, True
    return ran, False


@app.command()
@cli_errors
def summarize(
    file: Path = typer.Argument(..., help="Results file (JSONL) from zbsolve grid."),
    output: Path = output_option(..., "CSV table to write."),
    quiet: bool = QUIET,
) -> None:
    """Write a grid's results as a flat CSV table (pandas.read_csv reads it directly).

    Example: zbsolve summarize results.jsonl -o results.csv
    """
    from zbsolve.app.grid import read_results, write_summary

    if not file.exists():
        raise InputError(f"cannot read {file}: no such file")
    check_output(output, "--output", [file])
    records = read_results(file)
    write_summary(records, output)
    if not quiet:
        out.print(f"wrote {len(records)} rows to {output}")
