"""The ``zbsolve`` command line. Exit codes: 0 ok, 1 infeasible or failed check, 2 bad input."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Optional

import typer
from rich.console import Console
from rich.markup import escape

from zbsolve.io.document import drift_matters, from_document, planned_drift, read_json, write_document
from zbsolve.base.errors import InfeasibleError, InputError, ScheduleError, ZbsolveError
from zbsolve.schedulers.families import FAMILIES, make_schedule
from zbsolve.base.files import check_output
from zbsolve.planning.frontier import DEFAULT_PLACEMENTS, DEFAULT_TIME_LIMIT
from zbsolve.core.placement import CHUNKS
from zbsolve.core.profile import UNIT, Profile
from zbsolve.base.checks import check_size
from zbsolve.problem.costs import Costs
from zbsolve.present.tables import (
    LAYER_LABELS,
    PER_DEVICE,
    device_memory_table,
    figures_table,
    fmt,
    frontier_table,
    records_table,
    text_table,
)
from zbsolve.core.simulator import simulate
from zbsolve.optimize.result import status_text
from zbsolve.problem.request import SOLVERS, TIME_LIMIT
from zbsolve.core.spec import SUPPORTED_PLACEMENTS
from zbsolve.core.timing import OBJECTIVES

app = typer.Typer(help="Find and check pipeline-parallel training schedules (zero bubble).",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
out = Console()
err = Console(stderr=True)
wide = Console(width=max(out.width, 180))
"""For tables with many columns, which a narrow or non-terminal output would squeeze."""

DEVICES = typer.Option(None, "--devices", "-p", min=1, show_default=False,
                       help="Number of pipeline devices p (required).")
DEVICES_ALIAS = typer.Option(None, "--stages", min=1, hidden=True, help="Another name of --devices.")
MICROBATCHES = typer.Option(..., "--microbatches", "-m", min=1, help="Number of microbatches m.")
PROFILE = typer.Option(None, "--profile", help="Profile YAML/JSON (default: unit times, no communication, M_B=1).")
JSON = typer.Option(False, "--json", help="Print machine-readable JSON instead of a table.")
QUIET = typer.Option(False, "--quiet", "-q", help="Print nothing but errors.")


def cli_errors(fn: Callable) -> Callable:
    """Turn zbsolve's errors into one line on stderr (never wrapped, markup in it shown as is) and the documented
    exit code: 2 for bad input, 1 for an invalid schedule, an infeasible problem or another failure."""
    def fail(label: str, exc: Exception, code: int) -> typer.Exit:
        err.print(f"[red]{label}:[/red] {escape(' '.join(str(exc).split()))}", highlight=False, soft_wrap=True)
        return typer.Exit(code)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except InputError as exc:
            raise fail("error", exc, 2) from None
        except (ScheduleError, InfeasibleError) as exc:
            raise fail("invalid", exc, 1) from None
        except ZbsolveError as exc:
            raise fail("error", exc, 1) from None
    return wrapper


def _profile(path: Optional[Path]) -> Profile:
    return UNIT if path is None else Profile.load(path)


def _devices(devices: Optional[int], stages: Optional[int]) -> int:
    """The device count from ``--devices`` or its hidden other name ``--stages``."""
    if devices is None and stages is None:
        raise InputError("missing option --devices / -p: give the number of pipeline devices")
    if devices is not None and stages is not None and devices != stages:
        raise InputError(f"--devices {devices} and --stages {stages} differ: give --devices only")
    return devices if devices is not None else stages


def _numbers(text: str, option: str) -> list[float]:
    """A comma-separated list of numbers."""
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"{option} = {text!r} must be comma-separated numbers") from None


@app.command()
@cli_errors
def schedule(
    family: str = typer.Argument(..., help=f"Family: {', '.join(FAMILIES)}."),
    devices: Optional[int] = DEVICES, microbatches: int = MICROBATCHES, profile: Optional[Path] = PROFILE,
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write the schedule document (JSON)."),
    chart: Optional[Path] = typer.Option(None, "--chart", help="Write a Gantt chart (.png or .svg)."),
    as_json: bool = JSON, quiet: bool = QUIET, stages: Optional[int] = DEVICES_ALIAS,
) -> None:
    """Build a handcrafted schedule and print its figures.

    Example: zbsolve schedule zb-h1 --devices 8 --microbatches 24 -o zb-h1.json
    """
    p = _devices(devices, stages)
    if output:
        check_output(output, "--output", [profile])
    if chart:
        from zbsolve.present.plot import check_chart_path
        check_chart_path(chart, "--chart", [profile])
    timeline = simulate(make_schedule(family, _profile(profile), p, microbatches))
    if output:
        write_document(timeline, output)
    if chart:
        from zbsolve.present.plot import save_chart
        save_chart(timeline, chart, memory=True)
    if as_json and not quiet:
        print(json.dumps({family: timeline.figures()}, indent=1))
    elif not quiet:
        out.print(figures_table(timeline.figures(), f"{family}: p={p}, m={microbatches}"))


@app.command()
@cli_errors
def check(file: Path = typer.Argument(..., help="Schedule document (JSON)."), as_json: bool = JSON,
          quiet: bool = QUIET) -> None:
    """Validate a schedule document and print its figures (exit 1 if invalid).

    A document with a "partition" section is also checked to sum its layers into its profile, and one with a
    "device_memory" to fit every device's static bytes, peak activations and reserve in it.

    Example: zbsolve check zb-h1.json
    """
    from zbsolve.problem.costs import check_fits, document_costs, memory_figures

    data = read_json(file)
    sched, planned = from_document(data, str(file))
    timeline = simulate(sched)
    costs = document_costs(data, sched, str(file))
    if costs is not None:
        check_fits(costs, timeline)
    drift = planned_drift(timeline, planned)
    if quiet:
        return
    figures = {**timeline.figures(), **(memory_figures(costs, timeline) if costs is not None else {})}
    if as_json:
        print(json.dumps({"valid": True, "name": sched.name, **figures, "planned_drift": drift}, indent=1))
        return
    _print_result({"name": escape(sched.name), **figures}, {}, costs, f"{escape(str(file))}: valid")
    if drift_matters(drift, timeline):
        out.print(f"note: planned times differ from the as-soon-as-possible timing by up to {drift:g}")


@app.command()
@cli_errors
def compare(devices: Optional[int] = DEVICES, microbatches: int = MICROBATCHES, profile: Optional[Path] = PROFILE,
            as_json: bool = JSON, quiet: bool = QUIET, stages: Optional[int] = DEVICES_ALIAS) -> None:
    """Print one row of figures per handcrafted family (families that cannot run say why).

    Example: zbsolve compare --devices 8 --microbatches 24
    """
    p = _devices(devices, stages)
    check_size(p, microbatches)  # too big with one stage per device is refused; more stages only skip a family
    prof = _profile(profile)
    figures, skipped = {}, {}
    for name in FAMILIES:
        try:
            figures[name] = simulate(make_schedule(name, prof, p, microbatches)).figures()
        except InputError as exc:
            skipped[name] = str(exc)
    if as_json and not quiet:
        print(json.dumps({"figures": figures, "skipped": skipped}, indent=1))
        return
    if not quiet:
        out.print(records_table([{"schedule": name, **f} for name, f in figures.items()],
                                f"families: p={p}, m={microbatches}",
                                ("schedule", "makespan", "bubble_rate", "paper_bubble", "peak_memory")))
        for name, why in skipped.items():
            out.print(f"{name}: skipped ({why})", highlight=False, markup=False)


@app.command()
@cli_errors
def plot(file: Path = typer.Argument(..., help="Schedule document (JSON)."),
         output: Path = typer.Option(..., "--output", "-o", help="Chart file (.png or .svg)."),
         memory: bool = typer.Option(False, "--memory", help="Add a panel of memory over time per device."),
         quiet: bool = QUIET) -> None:
    """Draw a schedule document as a Gantt chart.

    Example: zbsolve plot zb-h1.json -o zb-h1.png --memory
    """
    from zbsolve.problem.costs import document_costs
    from zbsolve.present.plot import check_chart_path, save_chart
    check_chart_path(output, "--output", [file])
    data = read_json(file)
    sched, _ = from_document(data, str(file))
    save_chart(simulate(sched), output, memory=memory, costs=document_costs(data, sched, str(file)))
    if not quiet:
        out.print(f"wrote {output}", markup=False)


def main() -> None:
    """Entry point for ``python -m zbsolve``."""
    app()


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
    reserve: str = typer.Option("4GiB", "--reserve", help="Memory per device kept free of stages and activations."),
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
) -> None:
    """Solve a problem, a model or a per-stage profile for the best schedule that fits the memory.

    Ctrl-C (or SIGTERM) stops the solve, writes the best schedule found so far and exits 130 (143).

    Example: zbsolve solve problems/models/llama3-8b.yaml --devices 8 --microbatches 32 --device-memory 80GiB

    Example: zbsolve solve problems/iclr/1.5b-p8-m24.yaml --mem-factor 2 --time-limit 30 -o best.json
    """
    import time

    from rich.progress import Progress

    from zbsolve.base.interrupt import deferred, exit_code
    from zbsolve.problem.memory_factor import resolve_limit
    from zbsolve.problem.model import Model
    from zbsolve.problem.problem_file import Problem, load_input
    from zbsolve.optimize.solve import solve as run_solve

    began = time.monotonic()
    if output:
        check_output(output, "--output", [problem])
    if chart:
        from zbsolve.present.plot import check_chart_path, save_chart
        check_chart_path(chart, "--chart", [problem])
    with _interruptible("before the first schedule was built"):
        given = load_input(problem)
        published: dict[str, float] = {}
        if isinstance(given, Problem):
            costs: Profile | Model = given.profile
            name, published = given.name, given.published
            p, m = devices or given.num_devices, microbatches or given.num_microbatches
            given_limit = mem_limit is not None or mem_factor is not None or device_memory is not None
            own = (mem_limit, mem_factor) if given_limit else (given.mem_limit, given.mem_factor)
            limit = resolve_limit(given.profile, p, m, *own, chunks)
            placement = placement or given.placement
        else:
            if devices is None or microbatches is None:
                raise InputError(f"{problem}: give --devices and --microbatches to solve a "
                                 f"{'model' if isinstance(given, Model) else 'profile'}")
            costs, name, p, m = given, problem.stem, devices, microbatches
            if isinstance(given, Model):
                if mem_factor is not None:
                    raise InputError("--mem-factor applies to a problem or a profile; give --device-memory for a model")
                limit = mem_limit
            else:
                limit = resolve_limit(given, p, m, mem_limit, mem_factor, chunks)
        # loading the problem counts against the time limit (a limit that is no positive number goes to solve as
        # given)
        left = max(0.01, time_limit - (time.monotonic() - began)) if time_limit > 0 else time_limit
        with Progress(*_spinner(), console=err, transient=True, disable=quiet or as_json) as bar:
            task = bar.add_task(f"{name}: {solver}, limit {time_limit:g}s", total=None, line="")
            result = run_solve(costs, limit, num_microbatches=m, num_devices=p, placement=placement or "sequential",
                               solver=solver, time_limit=left, objective=objective, workers=workers, seed=seed,
                               chunks=chunks, progress=lambda line: bar.update(task, line=line[:100]),
                               device_memory=device_memory, reserve=reserve, partition=partition)
    with deferred() as late:  # the result is final: an interrupt now is answered once it is written whole
        if output:
            result.to_json(output)
        if chart:
            save_chart(result.timeline, chart, memory=True, costs=result.costs,
                       title=f"{name}: {solver}, {result.status_text}; the schedule is {result.schedule.name}'s")
    interrupted = result.interrupted or bool(late)
    if interrupted:
        written = [str(path) for path in (output, chart) if path]
        err.print(f"interrupted: the best schedule found so far{' is in ' + ', '.join(written) if written else ''}",
                  highlight=False, markup=False, soft_wrap=True)
    if not quiet:
        summary = {"problem": name, **_costs_figures(result.costs, limit), **result.summary()}
        if as_json:
            print(json.dumps(summary, indent=1, default=str))
        else:
            _print_result(summary, published, result.costs, f"{name}: {solver}")
    if interrupted:
        raise typer.Exit(exit_code())


@contextmanager
def _interruptible(before: str) -> Iterator[None]:
    """SIGINT and SIGTERM stop the work inside as Ctrl-C does (the work keeps what it finished); an interrupt that
    escapes it came ``before`` any result existed: one line says so and the command exits 130 (143)."""
    from zbsolve.base.interrupt import exit_code, signals_as_interrupt

    with signals_as_interrupt():
        try:
            yield
        except KeyboardInterrupt:
            err.print(f"interrupted {before}: nothing written", highlight=False, markup=False, soft_wrap=True)
            raise typer.Exit(exit_code()) from None


def _spinner() -> tuple:
    """Progress columns of a long solve or plan: a spinner, what runs, the time so far and its last log line."""
    from rich.progress import SpinnerColumn, TextColumn, TimeElapsedColumn

    return SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), TextColumn("{task.fields[line]}")


SECONDS = ("value", "lower_bound", "step_time", "step_time_no_barrier", "makespan")
"""Figures in the profile's time unit, which is seconds for a model."""
RAW_MEMORY = ("peak_memory", "peak_memory_per_device")
"""Figures in the profile's memory unit, which the table of memory per device shows in GiB when it is bytes."""


def _costs_figures(costs: Optional[Costs], limit: object) -> dict[str, object]:
    """What the problem's costs are: the partition's layers per stage for a model, else the memory limit."""
    if costs is not None and costs.model is not None:
        return {"partition": [b - a for a, b in costs.stages]}
    return {} if costs is not None and costs.device_memory is not None else {"mem_limit": limit}


def _print_result(summary: dict[str, object], published: dict[str, float], costs: Optional[Costs],
                  title: str) -> None:
    """The figures table (times in seconds for a model, the status as ``status_text`` reads it), then memory per
    device in GiB with the layers each device holds when it is in bytes."""
    in_bytes = costs is not None and costs.in_bytes
    seconds = costs is not None and costs.model is not None
    shown = {(f"{key} (s)" if seconds and key in SECONDS else key): value for key, value in summary.items()
             if key != "bound_met" and not (in_bytes and key in (*PER_DEVICE, *LAYER_LABELS, *RAW_MEMORY))}
    if "bound_met" in summary:
        shown["status"] = status_text(str(summary["status"]), bool(summary["bound_met"]))
    out.print(figures_table({**shown, **{f"published {key}": value for key, value in published.items()}}, title))
    if in_bytes:
        wide.print(device_memory_table(summary, "memory per device"))


@app.command()
@cli_errors
def export(
    file: Path = typer.Argument(..., help="Schedule document (JSON)."),
    fmt: str = typer.Option("torch-csv", "--format", "-f", help="Export format: torch-csv, torchtitan (the CSV and "
                            "torchtitan's pipeline settings) or megatron (the --pipeline-model-parallel-layout)."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", show_default=False,
                                          help="Output file; a folder for torchtitan; megatron prints without it."),
    microbatch_size: Optional[int] = typer.Option(None, "--microbatch-size", min=1, show_default=False,
                                                  help="torchtitan: sequences per microbatch (default 1)."),
    rename: Optional[list[str]] = typer.Option(None, "--rename", metavar="OLD=NEW", show_default=False,
                                               help="torchtitan: a layer's module FQN, repeatable (output=lm_head "
                                                    "unless renamed, for torchtitan 0.3.0)."),
    quiet: bool = QUIET,
) -> None:
    """Export a schedule for torch.distributed.pipelining's runtime, torchtitan or Megatron (docs/torch.md).

    Example: zbsolve export zb-h1.json --format torch-csv -o zb-h1.csv
    """
    from zbsolve.io.configs import export_document

    if output is not None and fmt != "torchtitan":  # a file; torchtitan's folder is checked by its export
        check_output(output, "--output", [file])
    def note(line: str) -> None:
        if not quiet:
            err.print(f"note: {line}", markup=False, highlight=False, soft_wrap=True)

    written, text = export_document(file, fmt, output, microbatch_size=microbatch_size, renames=rename or (),
                                    note=note)
    if not written:
        out.print(text, markup=False, highlight=False, soft_wrap=True)
    elif not quiet:
        out.print(f"wrote {', '.join(map(str, written))}", markup=False, soft_wrap=True)


MODEL = typer.Option("gpt", "--model", help="gpt (the built-in small GPT) or module:function returning stages.")
LAYERS = typer.Option(None, "--layers", help="GPT blocks (default: the document's partition's, else one per "
                                              "stage).")
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
    measured compute times, bubble and memory beside the simulator's prediction. A document with a "partition"
    section (solved from a model) cuts the GPT into the stages it names.

    Example: zbsolve run zb-h1.json --model gpt --steps 3 --check
    """
    from dataclasses import replace

    from zbsolve.problem.costs import document_costs
    from zbsolve.runtime.executor import REPORT_COLUMNS, RunOptions, oversubscription, report_table, run_schedule
    from zbsolve.runtime.launch import torchrun_rank
    from zbsolve.runtime.model import ModelSpec

    spec = ModelSpec(name=model, layers=layers, hidden=hidden, heads=heads, vocab=vocab, seq_len=seq_len, seed=seed)
    options = RunOptions(model=spec, steps=steps, device=device, check=check, batch_size=batch_size,
                         timeout_s=timeout, seed=seed)
    data = read_json(file)
    sched = from_document(data, str(file))[0]
    options = replace(options, costs=document_costs(data, sched, str(file)))
    place = torchrun_rank()
    lead = place is None or place.rank == 0
    warning = oversubscription(sched.num_devices, device)
    if warning and lead:
        err.print(f"[yellow]warning:[/yellow] {escape(warning)}", highlight=False, soft_wrap=True)
    rows = run_schedule(sched, options)
    if quiet or not lead:
        return
    if as_json:
        print(json.dumps(rows, indent=1, default=str))
        return
    wide.print(text_table(REPORT_COLUMNS, report_table(rows), f"{escape(str(file))}: measured vs simulated"))


@app.command()
@cli_errors
def profile(
    model: str = MODEL,
    stages: Optional[int] = typer.Option(None, "--stages", "-p", min=1,
                                         help="Number of pipeline stages, one per device (not with --per-layer)."),
    per_layer: bool = typer.Option(False, "--per-layer", help="Measure each layer; write a model description "
                                                              "(problems/models/) instead of a per-stage Profile."),
    microbatch_size: int = typer.Option(1, "--microbatch-size", "-b", min=1, help="Microbatch size."),
    output: Path = typer.Option(..., "--output", "-o", help="Profile (--per-layer: model description) to write "
                                                            "(.yaml or .json)."),
    repeats: int = typer.Option(10, "--repeats", min=1, help="Measurements per figure (medians are kept)."),
    warmup: int = typer.Option(2, "--warmup", min=0, help="Untimed runs first."),
    latency: bool = typer.Option(True, "--latency/--no-latency", help="Measure point-to-point latency (t_comm)."),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda."),
    threads: int = typer.Option(1, "--threads", min=1, help="CPU threads (1 matches each rank of zbsolve run)."),
    memory_model: str = typer.Option("torch", "--memory-model", help="What B frees: torch (almost nothing, as "
                                     "torch's split backward) or paper (every saved activation W does not read)."),
    layers: Optional[int] = typer.Option(None, "--layers", help="GPT layers (default: one per stage; 1 with "
                                                                "--per-layer)."),
    hidden: int = HIDDEN, heads: int = HEADS, vocab: int = VOCAB, seq_len: int = SEQ_LEN, seed: int = MODEL_SEED,
    quiet: bool = QUIET,
) -> None:
    """Measure each stage's F, B, W times and memory and the communication latency; write a Profile. With
    --per-layer, measure each layer and write a model description, which zbsolve solve cuts into stages.

    Example: zbsolve profile --model gpt --stages 4 --microbatch-size 4 -o profile.yaml

    Example: zbsolve profile --model gpt --layers 8 --per-layer -o gpt.yaml
    """
    check_output(output, "--output")
    if stages is None and not per_layer:
        raise InputError("--stages is missing: give the number of pipeline stages, or --per-layer")
    if stages is not None and per_layer:
        raise InputError(f"--stages {stages} with --per-layer: a per-layer profile has no stages; leave --stages out")
    from zbsolve.runtime.model import ModelSpec, load_layers, load_model
    from zbsolve.runtime.profiler import (
        NOISE_COLUMNS,
        ProfileOptions,
        latency_line,
        measure,
        noise_table,
        profile_header,
        write_profile,
    )

    spec = ModelSpec(name=model, layers=layers, hidden=hidden, heads=heads, vocab=vocab, seq_len=seq_len, seed=seed)
    options = ProfileOptions(microbatch_size=microbatch_size, repeats=repeats, warmup=warmup, latency=latency,
                             device=device, threads=threads, seed=seed, memory_model=memory_model)
    header = profile_header(spec, stages, options)
    if per_layer:
        from zbsolve.problem.model import LAYER_COLUMNS, layer_rows
        from zbsolve.runtime.layer_profiler import profile_layers

        gpt = (f" --layers {layers or 1} --hidden {hidden} --heads {heads} --vocab {vocab} --seq-len {seq_len}"
               if model == "gpt" else "")
        command = (f"zbsolve profile --model {model} --per-layer --microbatch-size {microbatch_size} --repeats "
                   f"{repeats} --warmup {warmup} --{'' if latency else 'no-'}latency --device {device} --threads "
                   f"{threads} --memory-model {memory_model}{gpt} --seed {seed} -o {output}")
        described = profile_layers(load_layers(spec), options, name=model, source=command,
                                   seq_len=seq_len if model == "gpt" else None)
        described.save(output)
        if not quiet:
            wide.print(text_table(LAYER_COLUMNS, layer_rows(described), header), highlight=False)
        return
    measurement = measure(load_model(spec, stages), options)
    write_profile(measurement, output, header)
    if quiet:
        return
    out.print(text_table(NOISE_COLUMNS, noise_table(measurement), header, latency_line(measurement)))


@app.command()
@cli_errors
def plan(
    model: Path = typer.Argument(..., help="Model description (YAML/JSON), e.g. problems/models/llama3-8b.yaml."),
    devices: int = typer.Option(..., "--devices", "-p", min=1, help="Pipeline devices p."),
    microbatches: int = typer.Option(..., "--microbatches", "-m", min=1, help="Microbatches m."),
    device_memory: Optional[str] = typer.Option(None, "--device-memory", show_default=False,
                                                help="Memory per device, e.g. 80GiB (default: the model's GPU's)."),
    placement: str = typer.Option("auto", "--placement",
                                  help="auto (the best of the others), sequential, interleaved or vshape."),
    chunks: Optional[int] = typer.Option(None, "--chunks", min=1, show_default=False,
                                         help="Stages per device of interleaved and vshape (default 2)."),
    time_limit: float = typer.Option(120.0, "--time-limit", help="Seconds the whole plan may take."),
    reserve: str = typer.Option("4GiB", "--reserve", help="Memory per device kept free of stages and activations."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", min=1, help="Processes timing candidates (default: "
                                                                          "all cores)."),
    executor: Optional[str] = typer.Option(None, "--executor", help="dask://HOST:PORT to time candidates on Dask."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write the plan (a schedule document)."),
    chart: Optional[Path] = typer.Option(None, "--chart", help="Write the plan's Gantt chart beside the baselines' "
                                                               "step times (.png or .svg)."),
    as_json: bool = JSON, quiet: bool = QUIET,
) -> None:
    """Choose the split of layers into stages, the placement and the schedule for the shortest step that fits.

    Ctrl-C (or SIGTERM) stops the search and plans with the best partition found so far.

    Example: zbsolve plan problems/models/llama3-8b.yaml --devices 8 --microbatches 32 --device-memory 80GiB
    """
    from rich.progress import Progress

    from zbsolve.base.interrupt import deferred, exit_code
    from zbsolve.problem.model import Model
    from zbsolve.planning.planner import plan as run_plan

    if output:
        check_output(output, "--output", [model])
    if chart:
        from zbsolve.present.plot import check_chart_path, save_plan_chart
        check_chart_path(chart, "--chart", [model])
    with _interruptible("before the first plan was found"):
        loaded = Model.load(model)
        with Progress(*_spinner(), console=err, transient=True, disable=quiet or as_json) as bar:
            task = bar.add_task(f"{loaded.name}: plan, limit {time_limit:g}s", total=None, line="")
            result = run_plan(loaded, num_devices=devices, num_microbatches=microbatches,
                              device_memory=device_memory, placement=placement, chunks=chunks,
                              time_limit=time_limit, reserve=reserve, jobs=jobs, executor=executor,
                              progress=lambda line: bar.update(task, line=line[:100]))
    with deferred() as late:  # the plan is final: an interrupt now is answered once it is written whole
        if output:
            result.to_json(output)
        if chart:
            save_plan_chart(result, chart)
    if not quiet:
        summary = {"model": loaded.name, **result.summary()}
        if as_json:
            print(json.dumps({**summary, "baselines": [b.row() for b in result.baselines]}, indent=1, default=str))
        else:
            _print_result(summary, {}, result.costs, f"{loaded.name}: plan")
            wide.print(records_table([b.row() for b in result.baselines], "baselines on the same costs"))
    if result.interrupted or late:
        raise typer.Exit(exit_code())


@app.command()
@cli_errors
def estimate(
    config: Path = typer.Argument(..., help="Hugging Face config.json of a dense decoder (Llama, Mistral, Qwen2, "
                                            "GPT-2, GPT-NeoX)."),
    gpu: str = typer.Option("h100", "--gpu", help="GPU preset: h100, h200, a100 or b200."),
    seq_len: int = typer.Option(..., "--seq-len", min=1, help="Tokens per sequence."),
    microbatch_size: int = typer.Option(..., "--microbatch-size", "-b", min=1, help="Sequences per microbatch."),
    tp: int = typer.Option(1, "--tp", min=1, help="Tensor-parallel degree (with sequence parallelism)."),
    dp: int = typer.Option(1, "--dp", min=1, help="Data-parallel degree (shards the optimizer under --zero 1)."),
    zero: int = typer.Option(0, "--zero", min=0, max=1, help="ZeRO stage: 1 shards the optimizer states over --dp."),
    dtype: str = typer.Option("bf16", "--dtype", help="bf16 or fp16."),
    efficiency: float = typer.Option(0.4, "--efficiency", help="Fraction of the GPU's peak a pass reaches."),
    flash_attention: bool = typer.Option(True, "--flash-attention/--no-flash-attention",
                                         help="Flash attention keeps no s x s attention probabilities."),
    link: str = typer.Option("nvlink", "--link", help="Link between stages: nvlink or network."),
    method: str = typer.Option("formula", "--method", help="FLOPs and activation bytes from the closed form "
                                                           "(formula: fused kernels), or counted by torch on "
                                                           "transformers' eager modules (count: an upper bound)."),
    name: Optional[str] = typer.Option(None, "--name", help="Model name (default: the config file's name)."),
    output: Path = typer.Option(..., "--output", "-o", help="Model description to write (.yaml or .json)."),
    as_json: bool = JSON, quiet: bool = QUIET,
) -> None:
    """Estimate a model's per-layer costs from its config (docs/cost-model.md) and write the model description;
    FLOPs and activation bytes from the closed form, or with --method count counted by torch on the transformers model.

    Example: zbsolve estimate problems/models/configs/llama3-8b.json --gpu h100 --seq-len 8192 -b 1 -o llama3-8b.yaml
    """
    from zbsolve.problem.estimate.formula import estimate as estimate_model
    from zbsolve.problem.estimate.formula import flops_note, method_note
    from zbsolve.problem.model import LAYER_COLUMNS, layer_rows

    check_output(output, "--output", [config])
    command = (f"zbsolve estimate {config} --gpu {gpu} --seq-len {seq_len} --microbatch-size {microbatch_size} "
               f"--tp {tp} --dp {dp} --zero {zero} --dtype {dtype} --efficiency {efficiency:g} "
               f"--{'' if flash_attention else 'no-'}flash-attention --link {link} --method {method}"
               + (f" --name {name}" if name else "") + f" -o {output}")
    model = estimate_model(config, gpu=gpu, seq_len=seq_len, microbatch_size=microbatch_size, tp=tp, dp=dp,
                           zero=zero, dtype=dtype, efficiency=efficiency, flash_attention=flash_attention, link=link,
                           name=name, source=command, method=method)
    model.save(output)
    note = flops_note(model, config, flash_attention)
    if quiet:
        return
    if as_json:
        print(json.dumps({"model": model.model_dump(exclude_none=True), "flops_per_token": model.flops_per_token(),
                          "method": method, "note": note}, indent=1))
        return
    s = model.setting
    title = (f"{escape(model.name)}: {s.gpu}, seq_len {s.seq_len}, microbatch {s.microbatch_size}, tp {s.tp}, "
             f"dp {s.dp}, zero {s.zero}, {s.dtype}, efficiency {s.efficiency:g}; per device, one microbatch")
    block = next(layer for layer in model.layers if layer.block)
    comm = (f"t_comm after a block: {1e3 * model.link.time(block.out_bytes):.3f} ms ({block.out_bytes / 2**20:.1f} "
            f"MiB over {model.link.name})")
    wide.print(text_table(LAYER_COLUMNS, layer_rows(model), title), highlight=False)
    for line in (method_note(method), comm, note, f"wrote {output}"):
        out.print(line, highlight=False, markup=False, soft_wrap=True)


@app.command()
@cli_errors
def grid(
    file: Path = typer.Argument(..., help="Grid YAML (e.g. problems/grids/smoke.yaml)."),
    jobs: int = typer.Option(1, "--jobs", "-j", min=1, help="Parallel solver processes (one thread each)."),
    output: Path = typer.Option(..., "--output", "-o", help="Results file (JSONL); a rerun resumes from it."),
    executor: Optional[str] = typer.Option(None, "--executor", help="dask://HOST:PORT to run on a Dask cluster."),
    schedules: Optional[Path] = typer.Option(None, "--schedules", help="Folder for each job's schedule document."),
    summary: Optional[Path] = typer.Option(None, "--summary", help="Also write a flat CSV table of all results."),
    retry_failed: bool = typer.Option(False, "--retry-failed", help="Also run again the jobs recorded as failed."),
    quiet: bool = QUIET,
) -> None:
    """Solve every job of a config grid in parallel, appending each result to a JSONL file at once.

    Every job is checked before the first one runs. Running the same command again skips the jobs already in the
    file (--retry-failed runs the failed ones again). Ctrl-C or SIGTERM keeps every finished result and still
    writes --summary. Exits 1 when the latest result of any of the grid's jobs is a failure.

    Example: zbsolve grid problems/grids/smoke.yaml --jobs 2 -o results.jsonl --summary results.csv
    """
    import signal
    from contextlib import closing

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
        TimeRemainingColumn

    from zbsolve.app.grid import Grid, expand, failed, pending, read_results, solve_grid, write_summary
    from zbsolve.base.interrupt import exit_code, signals_as_interrupt

    spec = Grid.load(file)
    inputs = [file, *spec.problems, *spec.models]
    check_output(output, "--output", inputs)
    if summary is not None:
        check_output(summary, "--summary", [*inputs, output])  # the results file is read to resume
    job_list = expand(spec)
    keys = {job.key for job in job_list}
    total, done = pending(job_list, output, retry_failed)
    failures = 0 if retry_failed else sum(failed(r) for r in read_results(output) if r["hash"] in keys)
    ran = 0
    interrupted = False
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[fail]}"),
               TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
    with signals_as_interrupt():
        try:
            with Progress(*columns, console=err, disable=quiet) as progress:
                task = progress.add_task(spec.name, total=total, completed=done, fail=f"{failures} failed")
                with closing(solve_grid(job_list, jobs=jobs, executor=executor, output=output,
                                        schedules_dir=schedules, retry_failed=retry_failed)) as stream:
                    for record in stream:
                        ran += 1
                        failures += failed(record)
                        progress.update(task, advance=1, fail=f"{failures} failed")
        except KeyboardInterrupt:
            interrupted = True
    records = read_results(output)
    if summary is not None:
        write_summary(records, summary)
    if interrupted:
        kept = output if summary is None else f"{output} (summary: {summary})"
        err.print(f"interrupted by {signal.Signals(exit_code() - 128).name}: finished results are kept in {kept}; "
                  "rerun the command to resume", highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(exit_code())
    failures = sum(failed(r) for r in records if r["hash"] in keys)
    line = f"{total} jobs: {done} already done, {ran} run, {failures} failed; results in {output}"
    if failures:
        err.print(f"{line}; --retry-failed runs the failed jobs again", highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(1)
    if not quiet:
        out.print(line, highlight=False, markup=False, soft_wrap=True)


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
    from zbsolve.app.grid import read_results, write_summary

    if not file.exists():
        raise InputError(f"cannot read {file}: no such file")
    check_output(output, "--output", [file])
    records = read_results(file)
    write_summary(records, output)
    if not quiet:
        out.print(f"wrote {len(records)} rows to {output}")


@app.command()
@cli_errors
def frontier(
    problem: Path = typer.Argument(..., help="Problem YAML (profile, num_devices, num_microbatches)."),
    factors: str = typer.Option("0.33,0.5,0.75,1,1.5,2", "--factors", help="Memory limits as K x 1F1B's peak."),
    placements: str = typer.Option(",".join(DEFAULT_PLACEMENTS), "--placements",
                                   help=f"Comma-separated placements from {', '.join(SUPPORTED_PLACEMENTS)}."),
    time_limit: float = typer.Option(DEFAULT_TIME_LIMIT, "--time-limit", help="Time limit of each solve in seconds."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", help="Parallel solver processes (default: all cores)."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write rows and family points (JSON)."),
    chart: Optional[Path] = typer.Option(None, "--chart", help="Write the frontier plot (.png, .svg or .pdf)."),
    as_json: bool = JSON, quiet: bool = QUIET,
) -> None:
    """The best paper bubble at each memory limit, per placement, beside the handcrafted families.

    Ctrl-C (or SIGTERM) stops the solves still running, prints and writes the finished ones, and exits 130 (143).

    Example: zbsolve frontier problems/vshape/p16-m48.yaml --factors 0.33,0.5,1 --time-limit 60 --chart f.png
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from zbsolve.base.files import write_atomic
    from zbsolve.planning.frontier import check_chart
    from zbsolve.planning.frontier import frontier as run_frontier
    from zbsolve.base.interrupt import deferred, exit_code
    from zbsolve.problem.problem_file import Problem

    if output:
        check_output(output, "--output", [problem])
    if chart:
        check_chart(chart, "--chart", [problem])
    prob = Problem.load(problem)
    values = _numbers(factors, "--factors")
    names = tuple(x.strip() for x in placements.split(",") if x.strip())
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with _interruptible("before any solve finished"):
        with Progress(*columns, console=err, transient=True, disable=quiet or as_json) as bar:
            task = bar.add_task(f"{prob.name}: solves", total=None)
            result = run_frontier(prob.profile, factors=values, num_microbatches=prob.num_microbatches,
                                  num_devices=prob.num_devices, placements=names, time_limit=time_limit,
                                  jobs=jobs, progress=lambda done, total: bar.update(task, completed=done,
                                                                                      total=total))
    with deferred() as late:  # the rows are final: an interrupt now is answered once they are written whole
        doc = {"problem": prob.name, **result.to_json()}
        if output:
            write_atomic(output, json.dumps(doc, indent=1) + "\n")
        if chart:
            result.save_chart(chart, f"{prob.name}: memory-bubble frontier")
    if result.interrupted or late:
        err.print("interrupted: the rows below are the solves that finished")
    if as_json:
        print(json.dumps(doc, indent=1))
    elif not quiet:
        wide.print(frontier_table(result, f"{prob.name}: memory-bubble frontier "
                                          f"(1F1B peak {fmt(result.reference_peak)})"))
    if result.interrupted or late:
        raise typer.Exit(exit_code())
