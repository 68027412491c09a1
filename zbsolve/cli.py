"""The ``zbsolve`` command line. Exit codes: 0 ok, 1 infeasible or failed check, 2 bad input."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

import typer
from rich.console import Console
from rich.table import Table

from zbsolve.document import planned_drift, read_document, write_document
from zbsolve.errors import InfeasibleError, InputError, ScheduleError, ZbsolveError
from zbsolve.families import FAMILIES, make_schedule
from zbsolve.profile import UNIT, Profile
from zbsolve.simulator import Timeline, simulate

if TYPE_CHECKING:
    from zbsolve.frontier import Frontier

app = typer.Typer(help="Find and check pipeline-parallel training schedules (zero bubble).",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
out = Console()
err = Console(stderr=True)
wide = Console(width=max(out.width, 180))
"""For tables with many columns, which a narrow or non-terminal output would squeeze."""

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
    placement: Optional[str] = typer.Option(None, "--placement", help="sequential, interleaved or vshape "
                                            "(default: the problem's)."),
    chunks: int = typer.Option(2, "--chunks", help="Stages per device of interleaved and vshape."),
) -> None:
    """Solve a problem for the best schedule under its memory limit.

    Example: zbsolve solve problems/iclr/1.5b-p8-m24.yaml --mem-factor 2 --time-limit 30 -o best.json
    """
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from zbsolve.frontier import stage_profile
    from zbsolve.problem import Problem, resolve_limit
    from zbsolve.solve import solve as run_solve

    prob = Problem.load(problem)
    reference = stage_profile(prob.profile, prob.num_devices, chunks)
    given = (mem_limit, mem_factor) if mem_limit is not None or mem_factor is not None else \
        (prob.mem_limit, prob.mem_factor)
    limit = resolve_limit(reference, prob.num_devices, prob.num_microbatches, *given)
    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), TextColumn("{task.fields[line]}"))
    with Progress(*columns, console=err, transient=True, disable=quiet or as_json) as bar:
        task = bar.add_task(f"{prob.name}: {solver}, limit {time_limit:g}s", total=None, line="")
        result = run_solve(prob.profile, limit, num_microbatches=prob.num_microbatches, num_devices=prob.num_devices,
                           placement=placement or prob.placement, solver=solver, time_limit=time_limit,
                           objective=objective, workers=workers, seed=seed, chunks=chunks,
                           progress=lambda line: bar.update(task, line=line[:100]))
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


@app.command()
@cli_errors
def export(
    file: Path = typer.Argument(..., help="Schedule document (JSON)."),
    fmt: str = typer.Option("torch-csv", "--format", "-f", help="Export format: torch-csv."),
    output: Path = typer.Option(..., "--output", "-o", help="Output file."),
    quiet: bool = QUIET,
) -> None:
    """Export a schedule for torch.distributed.pipelining's runtime (and torchtitan).

    Example: zbsolve export zb-h1.json --format torch-csv -o zb-h1.csv
    """
    from zbsolve.export import export_command

    export_command(file, fmt, output)
    if not quiet:
        out.print(f"wrote {output}")


MODEL = typer.Option("gpt", "--model", help="gpt (the built-in small GPT) or module:function returning stages.")
LAYERS = typer.Option(None, "--layers", help="GPT layers (default: one per stage).")
HIDDEN = typer.Option(32, "--hidden", help="GPT hidden size.")
HEADS = typer.Option(2, "--heads", help="GPT attention heads.")
VOCAB = typer.Option(64, "--vocab", help="GPT vocabulary size.")
SEQ_LEN = typer.Option(16, "--seq-len", help="Sequence length.")
MODEL_SEED = typer.Option(0, "--seed", help="Model and data seed.")


@app.command()
@cli_errors
def run(
    file: Path = typer.Argument(..., help="Schedule document (JSON)."),
    model: str = MODEL,
    steps: int = typer.Option(2, "--steps", min=1, help="Training steps (the first is not timed)."),
    device: str = typer.Option("cpu", "--device", help="cpu (gloo) or cuda (NCCL)."),
    check: bool = typer.Option(False, "--check", help="Compare every gradient with a single-process reference."),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", help="Batch size (default: m)."),
    layers: Optional[int] = LAYERS, hidden: int = HIDDEN, heads: int = HEADS, vocab: int = VOCAB,
    seq_len: int = SEQ_LEN, seed: int = MODEL_SEED,
    timeout: float = typer.Option(60.0, "--timeout", help="Seconds before a silent peer is an error."),
    as_json: bool = JSON, quiet: bool = QUIET,
) -> None:
    """Run a schedule on torch.distributed (one process per device, or under torchrun) and print the
    measured compute times, bubble and memory beside the simulator's prediction.

    Example: zbsolve run zb-h1.json --model gpt --steps 3 --check
    """
    from zbsolve.runtime.executor import REPORT_COLUMNS, report_table, run_command
    from zbsolve.runtime.launch import torchrun_rank

    rows = run_command(file, model, steps, device, check, batch_size=batch_size, layers=layers, hidden=hidden,
                       heads=heads, vocab=vocab, seq_len=seq_len, seed=seed, timeout_s=timeout)
    place = torchrun_rank()
    if quiet or (place is not None and place.rank != 0):
        return
    if as_json:
        print(json.dumps(rows, indent=1, default=str))
        return
    table = Table(title=f"{file}: measured vs simulated")
    for col in REPORT_COLUMNS:
        table.add_column(col, justify="right")
    for row in report_table(rows):
        table.add_row(*row)
    wide.print(table)


@app.command()
@cli_errors
def profile(
    model: str = MODEL,
    stages: int = STAGES,
    microbatch_size: int = typer.Option(1, "--microbatch-size", "-b", min=1, help="Microbatch size."),
    output: Path = typer.Option(..., "--output", "-o", help="Profile file to write (.yaml or .json)."),
    repeats: int = typer.Option(10, "--repeats", min=1, help="Measurements per figure (medians are kept)."),
    warmup: int = typer.Option(2, "--warmup", min=0, help="Untimed runs first."),
    latency: bool = typer.Option(True, "--latency/--no-latency", help="Measure point-to-point latency (t_comm)."),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda."),
    threads: int = typer.Option(1, "--threads", min=1, help="CPU threads (1 matches each rank of zbsolve run)."),
    layers: Optional[int] = LAYERS, hidden: int = HIDDEN, heads: int = HEADS, vocab: int = VOCAB,
    seq_len: int = SEQ_LEN, seed: int = MODEL_SEED,
    quiet: bool = QUIET,
) -> None:
    """Measure each stage's F, B, W times and memory and the communication latency; write a Profile.

    Example: zbsolve profile --model gpt --stages 4 --microbatch-size 4 -o profile.yaml
    """
    from zbsolve.runtime.profiler import profile_command

    profile_command(model, stages, microbatch_size, output, repeats=repeats, warmup=warmup, latency=latency,
                    device=device, threads=threads, layers=layers, hidden=hidden, heads=heads, vocab=vocab,
                    seq_len=seq_len, seed=seed, quiet=quiet)


@app.command()
@cli_errors
def grid(
    file: Path = typer.Argument(..., help="Grid YAML (e.g. problems/grids/smoke.yaml)."),
    jobs: int = typer.Option(1, "--jobs", "-j", min=1, help="Parallel solver processes (one thread each)."),
    output: Path = typer.Option(..., "--output", "-o", help="Results file (JSONL); a rerun resumes from it."),
    executor: Optional[str] = typer.Option(None, "--executor", help="dask://HOST:PORT to run on a Dask cluster."),
    schedules: Optional[Path] = typer.Option(None, "--schedules", help="Folder for each job's schedule document."),
    summary: Optional[Path] = typer.Option(None, "--summary", help="Also write a flat CSV table of all results."),
    quiet: bool = QUIET,
) -> None:
    """Solve every job of a config grid in parallel, appending each result to a JSONL file at once.

    Running the same command again skips the jobs already in the file. Ctrl-C keeps every finished result.

    Example: zbsolve grid problems/grids/smoke.yaml --jobs 2 -o results.jsonl --summary results.csv
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
        TimeRemainingColumn

    from zbsolve.grid import Grid, expand, pending, read_results, solve_grid, write_summary

    spec = Grid.load(file)
    job_list = expand(spec)
    total, done = pending(job_list, output)
    failures = 0
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[fail]}"),
               TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
    with Progress(*columns, console=err, disable=quiet) as progress:
        task = progress.add_task(spec.name, total=total, completed=done, fail="0 failed")
        try:
            for record in solve_grid(job_list, jobs=jobs, executor=executor, output=output, schedules_dir=schedules):
                failures += record["status"] == "error"
                progress.update(task, advance=1, fail=f"{failures} failed")
        except KeyboardInterrupt:
            progress.stop()
            err.print(f"interrupted: finished results are kept in {output}; rerun the command to resume")
            raise typer.Exit(130) from None
    if summary:
        write_summary(read_results(output), summary)
    if not quiet:
        out.print(f"{total} jobs: {done} already done, {total - done} run, {failures} failed; results in {output}")
    if failures:
        raise typer.Exit(1)


@app.command()
@cli_errors
def summarize(
    file: Path = typer.Argument(..., help="Results file (JSONL) from zbsolve grid."),
    output: Path = typer.Option(..., "--output", "-o", help="CSV table to write."),
    quiet: bool = QUIET,
) -> None:
    """Write a grid's results as a flat CSV table (pandas.read_csv reads it directly).

    Example: zbsolve summarize results.jsonl -o results.csv
    """
    from zbsolve.grid import read_results, write_summary

    if not file.exists():
        raise InputError(f"cannot read {file}: no such file")
    records = read_results(file)
    write_summary(records, output)
    if not quiet:
        out.print(f"wrote {len(records)} rows to {output}")


@app.command()
@cli_errors
def frontier(
    problem: Path = typer.Argument(..., help="Problem YAML (profile, num_devices, num_microbatches)."),
    factors: str = typer.Option("0.33,0.5,0.75,1,1.5,2", "--factors", help="Memory limits as K x 1F1B's peak."),
    placements: str = typer.Option("sequential,vshape", "--placements", help="Comma-separated placements."),
    time_limit: float = typer.Option(30.0, "--time-limit", help="Time limit of each solve in seconds."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", help="Parallel solver processes (default: all cores)."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write rows and family points (JSON)."),
    chart: Optional[Path] = typer.Option(None, "--chart", help="Write the frontier plot (.png or .svg)."),
    as_json: bool = JSON, quiet: bool = QUIET,
) -> None:
    """The best paper bubble at each memory limit, per placement, beside the handcrafted families.

    Ctrl-C stops the solves still running and prints (and writes) the finished ones.

    Example: zbsolve frontier problems/vshape/p16-m48.yaml --factors 0.33,0.5,1 --time-limit 60 --chart f.png
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from zbsolve.frontier import frontier as run_frontier
    from zbsolve.frontier import stage_profile
    from zbsolve.problem import Problem, reference_peak

    prob = Problem.load(problem)
    try:
        values = [float(x) for x in factors.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"--factors = {factors!r} must be comma-separated numbers") from None
    for x in values:
        if not x > 0:
            raise InputError(f"--factors: memory factor {x:g} must be > 0")
    peak = reference_peak(stage_profile(prob.profile, prob.num_devices), prob.num_devices, prob.num_microbatches)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err, disable=quiet or as_json) as bar:
        task = bar.add_task(f"{prob.name}: solves", total=None)
        result = run_frontier(prob.profile, [x * peak for x in values], num_microbatches=prob.num_microbatches,
                              num_devices=prob.num_devices, placements=tuple(x.strip() for x in placements.split(",")),
                              time_limit=time_limit, jobs=jobs,
                              progress=lambda done, total: bar.update(task, completed=done, total=total))
    doc = {"problem": prob.name, **result.to_json()}
    if output:
        output.write_text(json.dumps(doc, indent=1) + "\n")
    if chart:
        result.save_chart(chart, f"{prob.name}: memory-bubble frontier")
    if result.interrupted:
        err.print("interrupted: the rows below are the solves that finished")
    if as_json:
        print(json.dumps(doc, indent=1))
    elif not quiet:
        _frontier_table(prob.name, peak, result)
    if result.interrupted:
        raise typer.Exit(130)


def _frontier_table(name: str, peak: float, result: Frontier) -> None:
    """Print the frontier's rows and family points."""
    table = Table(title=f"{name}: memory-bubble frontier (1F1B peak {peak:g})")
    for col in ("placement", "factor", "mem_limit", "paper_bubble", "bubble_rate", "status", "gap"):
        table.add_column(col, justify="left" if col in ("placement", "status") else "right")
    for r in result.rows:
        table.add_row(r.placement, f"{r.factor:.3g}", f"{r.mem_limit:g}", _opt(r.paper_bubble), _opt(r.bubble_rate),
                      r.status, _opt(r.gap))
    for f in result.families:
        table.add_row(f"{f.name} ({f.placement})", f"{f.factor:.3g}", f"{f.peak_memory:g}", _opt(f.paper_bubble),
                      "", "family", "")
    wide.print(table)


def _opt(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.4f}"
