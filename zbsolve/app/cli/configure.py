"""zbsolve configure: a model, a cluster and a global batch in; the fastest parallel configurations out, the best
planned and exported for its runtime."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.markup import escape

from zbsolve.app.cli.common import (
    CONFIG,
    JSON,
    app,
    chart_option,
    cli_errors,
    err,
    executor_option,
    interruptible,
    jobs_option,
    out,
    output_option,
    progress,
    target_option,
    time_limit_option,
)
from zbsolve.app.cli.groups import grouped
from zbsolve.app.cli.options import setup_options
from zbsolve.base.clock import command_began
from zbsolve.base.errors import InputError
from zbsolve.base.files import check_output
from zbsolve.base.interrupt import deferred, exit_code
from zbsolve.configure.predict import Configuration
from zbsolve.configure.result import ConfigureResult
from zbsolve.present.configure_table import configure_table, lines

FIELDS = ("gpus", "global_batch", "seq_len", "gpu", "dtype", "device_memory", "reserve", "tp_comm_overlap",
          "dispatcher", "calibration")
"""The setup's fields ``zbsolve configure`` takes as options (the rest it searches)."""


@dataclass(frozen=True)
class Search:
    """How ``zbsolve configure`` searches: for which runtime, how many configurations ranked and planned, in what
    time and where."""

    target: Annotated[str, target_option("megatron", "The runtime: megatron, torchtitan or zbsolve; only what it runs "
                                         "is searched.", metavar="NAME")]
    top: Annotated[int, typer.Option(10, "--top", min=1, metavar="K",
                                     help="Configurations ranked (and searched for).")]
    refine: Annotated[int, typer.Option(3, "--refine", min=0, metavar="N",
                                        help="Best configurations planned (zbsolve plan).")]
    time_limit: Annotated[float, time_limit_option(600.0, "Seconds the whole search may take, refining included.",
                                                   metavar="SECONDS")]
    jobs: Annotated[Optional[int], jobs_option(None, "Processes timing configurations (default: all cores).", min=1,
                                               metavar="N")]
    executor: Annotated[Optional[str], executor_option(None, "dask://HOST:PORT to time configurations on a Dask "
                                                       "cluster.", metavar="URL")]


@app.command()
@cli_errors
@setup_options(Configuration, FIELDS)
@grouped
def configure(
    config: Path = CONFIG, *,
    search: Search,
    output: Optional[Path] = output_option(None, "Write the chosen configuration's plan (a schedule document)."),
    export: Optional[Path] = typer.Option(None, "--export", metavar="PATH",
                                          help="Write the target's export of the plan: Megatron's arguments (a "
                                               "file), torchtitan's folder, or zbsolve's schedule document."),
    chart: Optional[Path] = chart_option(None, "Write the chart of every configuration timed: tokens/s/GPU against "
                                         "peak memory per device, the chosen one marked (.png or .svg).",
                                         metavar="FILE"),
    as_json: bool = JSON,
    knobs: dict[str, Any] = {},  # noqa: B006 (set by setup_options)
) -> None:
    """Search every parallel configuration (tp, pp, vp, cp, ep, dp, micro-batch size, ZeRO, recomputation) the
    target runs: pruned by memory and by a bound on the step, timed with predict's model, the best planned
    (docs/configure.md). Ctrl-C (or SIGTERM) ranks what was timed so far and exits 130 (143). Timed under zbsolve's
    shipped calibration of the GPU and runtime by default (--calibration none: the model as stated).

    Example: zbsolve configure problems/models/configs/llama3-70b.json --gpus 64 --global-batch 128 --seq-len 8192
    --dtype fp8 --time-limit 120
    """
    began = command_began()  # loading counts against the limit
    from zbsolve.configure.choose import configure as run

    _check_paths(config, search.target, output, export, chart)
    gpu = knobs.get("gpu", Configuration.model_fields["gpu"].default)
    with interruptible("before any configuration that fits was timed", "nothing ranked, nothing written"):
        with progress(f"{escape(config.stem)}: configure on {knobs['gpus']} x {gpu}, limit {search.time_limit:g}s",
                      as_json) as update:
            result = run(config, **knobs, target=search.target, top=search.top, refine=search.refine,
                         time_limit=search.time_limit, jobs=search.jobs, executor=search.executor, progress=update,
                         began=began)
    with deferred() as late:  # the result is final: an interrupt now is answered once the files are whole
        if output is not None and result.plan is not None:
            result.plan.to_json(output)
        if export is not None and result.plan is not None:
            result.export(export)
        if chart is not None:
            result.plot(chart)
    if as_json:
        print(json.dumps(result.summary(), indent=1, default=str))
    else:
        _print(result)
    why = result.unplanned()
    if why is not None and (output or export):
        unwritten = f"{'--output' if output else '--export'}: nothing written: {why}"
        if not (result.interrupted or late):
            raise InputError(unwritten)
        err.print(f"note: {unwritten}", highlight=False, markup=False)
    if result.interrupted or late:
        err.print("interrupted: the best configurations found so far", highlight=False, markup=False)
        raise typer.Exit(exit_code())


def _check_paths(config: Path, target: str, output: Optional[Path], export: Optional[Path],
                 chart: Optional[Path]) -> None:
    """The files to write checked before the search: each writable and none of them the config (torchtitan's
    export, a folder, apart)."""
    from zbsolve.present.plot import check_chart_path

    for path, option in ((output, "--output"), (export, "--export")):
        if path is not None and (option == "--output" or target != "torchtitan"):
            check_output(path, option, [config])
    if chart is not None:
        check_chart_path(chart, "--chart", [config, output, export])


def _print(result: ConfigureResult) -> None:
    """The ranked table, the counts, the chosen configuration's predict line, its launch command (Megatron's or
    torchtitan's) and the notes, each line whole (to copy)."""
    out.print(configure_table(result), highlight=False)
    shown = lines(result)
    command = result.command()
    if command is not None:
        shown.insert(2, f"{'Megatron' if result.target == 'megatron' else result.target}: {command}")
    for line in shown:
        out.print(line, highlight=False, markup=False, soft_wrap=True)
