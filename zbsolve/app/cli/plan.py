"""zbsolve plan: the partition, the placement and the schedule of a model, chosen together."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from zbsolve.app.cli.common import (
    JSON,
    QUIET,
    WIDE,
    app,
    chart_option,
    cli_errors,
    devices_option,
    err,
    executor_option,
    interruptible,
    jobs_option,
    microbatches_option,
    out,
    output_option,
    print_result,
    progress,
    target_option,
    time_limit_option,
    wide,
)
from zbsolve.app.cli.groups import grouped
from zbsolve.app.cli.options import setup_options
from zbsolve.base.clock import command_began
from zbsolve.base.errors import InputError
from zbsolve.base.files import check_output
from zbsolve.base.interrupt import deferred, exit_code
from zbsolve.base.units import gib, parse_bytes
from zbsolve.costmodel.constants import DEFAULT_RESERVE
from zbsolve.costmodel.model import Model
from zbsolve.costmodel.setup import Setup
from zbsolve.planning.placement_choices import NOT_SEARCHED
from zbsolve.present.tables import baselines_table, records_table
from zbsolve.problem.request import PLAN_TIME_LIMIT

PLACEMENT = typer.Option("auto", "--placement",
                         help="auto (the best of the others), sequential, interleaved or vshape.")
CHUNKS = typer.Option(None, "--chunks", show_default=False, help="Stages per device of interleaved and vshape "
                      "(default 2), or auto: every count from 2 to 8.")
RECOMPUTE = typer.Option("none", "--recompute", help="Blocks that run their forward again inside their B: none, full, "
                         "uniform:N (the first N of every stage), per-stage:N,N,... (the first N_s of stage s), "
                         "per-stage (the counts chosen for each candidate), selective (every block's norms and MLP "
                         "activation; 'selective+' before uniform or per-stage: the blocks not recomputed whole), "
                         "modules:M,M,... (Megatron's), op (torchtitan's per-op policy), or auto (each candidate "
                         "timed with what the target runs).")
TARGET = target_option("zbsolve", "The runtime the plan is for: zbsolve (any plan), torchtitan (recompute none, "
                       "full or op) or megatron (none, full or uniform:N; no V-shape); the search keeps to what it "
                       "can run.")
BASELINE_LAYOUT = typer.Option(None, "--baseline-layout", show_default=False,
                               help="A Megatron --pipeline-model-parallel-layout string, e.g. "
                                    "'Et*2|(t*2|)*34,t*3|(t*2|)*3,tL', run as a baseline with Megatron's schedule and "
                                    "its best recomputation.")
FIRST_LAYERS = typer.Option(None, "--num-layers-in-first-pipeline-stage", min=1, show_default=False,
                            help="Megatron's blocks on the first pipeline rank: adds Megatron's uneven split to the "
                                 "baselines.")
LAST_LAYERS = typer.Option(None, "--num-layers-in-last-pipeline-stage", min=1, show_default=False,
                           help="Megatron's blocks on the last pipeline rank: adds Megatron's uneven split to the "
                                "baselines.")
FRONTIER = typer.Option(None, "--frontier", show_default=False,
                        help="Device memories, e.g. 40GiB,48GiB,64GiB,80GiB: the plan at each (the time limit "
                             "shared) beside the baselines and V-Half/V-Min; --chart draws step time against memory.")


@dataclass(frozen=True)
class PlanArgs:
    """The options of ``zbsolve plan``, in its help's order: what ``plan`` and ``plan_frontier`` take
    (``keywords``), and where and how the plan is shown."""

    num_devices: Annotated[int, devices_option(..., "Pipeline devices p.")]
    num_microbatches: Annotated[int, microbatches_option(..., "Microbatches m.")]
    placement: Annotated[str, PLACEMENT]
    chunks: Annotated[Optional[str], CHUNKS]
    """A whole number, auto, or None (the default) as given; read by ``keywords``."""
    time_limit: Annotated[float, time_limit_option(PLAN_TIME_LIMIT, "Seconds the whole plan may take.")]
    jobs: Annotated[Optional[int], jobs_option(None, "Processes timing candidates (default: all cores).", min=1)]
    executor: Annotated[Optional[str], executor_option(None, "dask://HOST:PORT to time candidates on Dask.")]
    output: Annotated[Optional[Path], output_option(None, "Write the plan (a schedule document).")]
    chart: Annotated[Optional[Path], chart_option(None, "Write the plan's Gantt chart beside the baselines' step "
                                                  "times (.png or .svg).")]
    recompute: Annotated[str, RECOMPUTE]
    target: Annotated[str, TARGET]
    baseline_layout: Annotated[Optional[str], BASELINE_LAYOUT]
    first_layers: Annotated[Optional[int], FIRST_LAYERS]
    last_layers: Annotated[Optional[int], LAST_LAYERS]
    frontier: Annotated[Optional[str], FRONTIER]
    as_json: Annotated[bool, JSON]
    quiet: Annotated[bool, QUIET]
    whole: Annotated[bool, WIDE]

    def keywords(self, reserve: str | int) -> dict[str, Any]:
        """``plan``'s keyword arguments, with ``reserve`` as given (e.g. 4GiB; ``DEFAULT_RESERVE``'s bytes where
        none is): ``--chunks`` checked and read (``_chunks``), Megatron's blocks on its first and last rank as its
        ``megatron_ends``."""
        return {"num_devices": self.num_devices, "num_microbatches": self.num_microbatches,
                "placement": self.placement, "chunks": _chunks(self.chunks), "time_limit": self.time_limit,
                "reserve": reserve, "jobs": self.jobs, "executor": self.executor, "recompute": self.recompute,
                "target": self.target, "baseline_layout": self.baseline_layout,
                "megatron_ends": (self.first_layers, self.last_layers)}


@app.command()
@cli_errors
@setup_options(Setup, ("device_memory", "reserve"), read=False)
@grouped
def plan(
    model: Path = typer.Argument(..., metavar="MODEL",
                                 help="Model description (YAML/JSON), e.g. problems/models/llama3-8b.yaml."),
    *, args: PlanArgs,
    knobs: dict[str, Any] = {},  # noqa: B006 (set by setup_options)
) -> None:
    """Choose the split of layers into stages, the placement and the schedule for the shortest step that fits.

    Ctrl-C (or SIGTERM) stops the search, plans with the best partition found so far and exits 130 (143); before
    the search has timed a partition that fits, it stops with nothing planned. A placement or stages per device
    that --placement auto or --chunks asks for and the model cannot take is named on stderr, not searched.

    Example: zbsolve plan problems/models/llama3-8b.yaml --devices 8 --microbatches 32 --device-memory 80GiB
    """
    from zbsolve.planning.memory_frontier import parse_memories  # the planner (OR-Tools) once a command runs

    device_memory, reserve = knobs.get("device_memory"), knobs.get("reserve", DEFAULT_RESERVE)
    if args.frontier is None:
        _plan(model, device_memory, reserve, args)
        return
    if args.output:
        raise InputError(f"--output = {args.output}: a frontier is many plans; give --output without --frontier")
    if device_memory is not None:
        raise InputError(f"--device-memory = {device_memory!r}: give it or --frontier, not both")
    _frontier(model, parse_memories(args.frontier), reserve, args)


def _plan(path: Path, device_memory: Optional[str], reserve: str | int, args: PlanArgs) -> None:
    """``plan`` at one device memory: the plan written, its figures and the baselines' printed (``--wide``: every
    column)."""
    from zbsolve.planning.planner import plan as run_plan  # looked up when run: a test wraps it
    from zbsolve.present.plot import check_chart_path, save_plan_chart

    output, chart = args.output, args.chart
    if output:
        check_output(output, "--output", [path])
    if chart:
        check_chart_path(chart, "--chart", [path])
    began = command_began()  # loading counts against the limit
    with interruptible("before the search timed a partition that fits", "nothing planned yet, nothing written"):
        loaded = Model.load(path, "zbsolve plan")
        with progress(f"{loaded.name}: plan, limit {args.time_limit:g}s", args.quiet or args.as_json) as update:
            result = run_plan(loaded, device_memory=device_memory, progress=_noting(update, args.quiet), began=began,
                              **args.keywords(reserve))
    with deferred() as late:  # the plan is final: an interrupt now is answered once it is written whole
        if output:
            result.to_json(output)
        if chart:
            save_plan_chart(result, chart)
    if result.interrupted or late:
        written = [str(path) for path in (output, chart) if path]
        err.print(f"interrupted: the best plan found so far{' is in ' + ', '.join(written) if written else ''} "
                  f"({len(result.candidates)} partitions timed)", highlight=False, markup=False, soft_wrap=True)
    if not args.quiet:
        summary = {"model": loaded.name, **result.summary()}
        if args.as_json:
            print(json.dumps({**summary, "baselines": [b.row() for b in result.baselines]}, indent=1, default=str))
        else:
            print_result(summary, result.costs, f"{loaded.name}: plan")
            (wide if args.whole else out).print(baselines_table([b.row() for b in result.baselines],
                                                                "baselines on the same costs", args.whole))
    if result.interrupted or late:
        raise typer.Exit(exit_code())


def _noting(update: Callable[[str], None], quiet: bool) -> Callable[[str], None]:
    """The plan's progress callback: each log line on the transient progress line, and those naming a placement not
    searched (``NOT_SEARCHED``) kept on stderr as well, unless ``quiet``."""
    def hear(line: str) -> None:
        if not quiet and f": {NOT_SEARCHED}: " in line:
            err.print(f"note: {line}", highlight=False, markup=False, soft_wrap=True)
        update(line)
    return hear


def _chunks(text: Optional[str]) -> int | str | None:
    """``--chunks``: a whole number >= 1, or auto."""
    if text is None or text == "auto":
        return text
    if not text.strip().isdigit() or int(text) < 1:
        raise InputError(f"--chunks = {text!r} must be a whole number >= 1 or auto")
    return int(text)


def _frontier(path: Path, memories: list[int], reserve: str | int, args: PlanArgs) -> None:
    """``plan --frontier``: the plan at each device memory, as a table (or JSON) and a chart; the tables fit 100
    columns unless ``--wide``."""
    from zbsolve.planning.memory_frontier import building_blocks, plan_frontier
    from zbsolve.present.frontier_chart import check_chart, save_memory_frontier_chart

    options = args.keywords(reserve)  # --chunks checked before the chart's path
    if args.chart:
        check_chart(args.chart, "--chart", [path])
    loaded = Model.load(path, "zbsolve plan")
    with interruptible("before the frontier was finished"):
        with progress(f"{loaded.name}: frontier over {len(memories)} device memories",
                      args.quiet or args.as_json) as update:
            points = plan_frontier(loaded, memories, progress=update, **options)
    spare = parse_bytes(reserve, "reserve", zero=True)
    blocks = building_blocks(loaded, args.num_devices, args.num_microbatches, spare)
    if args.chart:
        save_memory_frontier_chart(points, blocks, args.chart, f"{loaded.name}: step time against device memory")
    if args.quiet:
        return
    rows = [{"device memory": f"{gib(p.device_memory):g} GiB", "plan step (s)": p.step_time, "plan": p.plan,
             "carried from": f"{gib(p.carried):g} GiB" if p.carried else "", "best baseline (s)": p.baseline,
             "best baseline recomputing (s)": p.baseline_recomputed} for p in points]
    marks = [{"block": b.name, "recompute": b.recompute,
              "device memory needed (with the reserve)": f"{gib(b.memory):.2f} GiB",
              "step (s)": b.step_time} for b in blocks]
    if args.as_json:
        print(json.dumps({"model": loaded.name, "frontier": rows, "building blocks": marks}, indent=1, default=str))
    else:
        console = wide if args.whole else out
        console.print(records_table(rows, f"{loaded.name}: step time against device memory"))
        console.print(records_table(marks, "V-shape building blocks on the uniform split"))
