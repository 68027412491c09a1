"""zbsolve configure: a model, a cluster and a global batch in; the fastest parallel configurations out, the best
planned and exported for its runtime."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from zbsolve.app.cli.common import (DISPATCHER, JSON, RESERVE, TP_COMM_OVERLAP, app, cli_errors,
                                    command_began, err, interruptible, out, progress)
from zbsolve.base.errors import InputError
from zbsolve.base.files import check_output
from zbsolve.base.interrupt import deferred, exit_code
from zbsolve.base.units import parse_bytes
from zbsolve.configure.result import ConfigureResult
from zbsolve.present.configure_table import configure_table, lines
from zbsolve.present.plot import check_chart_path


@app.command()
@cli_errors
def configure(
    config: Path = typer.Argument(..., help="Hugging Face config.json of the model."),
    gpus: int = typer.Option(..., "--gpus", min=1, metavar="N", help="GPUs of the run."),
    global_batch: int = typer.Option(..., "--global-batch", min=1, metavar="N", help="Sequences per step."),
    seq_len: int = typer.Option(..., "--seq-len", min=1, metavar="N", help="Tokens per sequence."),
    gpu: str = typer.Option("h100", "--gpu", metavar="GPU", help="GPU preset: h100, h200, a100 or b200."),
    dtype: str = typer.Option("bf16", "--dtype", metavar="DTYPE", help="Type of the matrix products."),
    target: str = typer.Option("megatron", "--target", metavar="NAME",
                               help="The runtime: megatron, torchtitan or zbsolve; only what it runs is searched."),
    top: int = typer.Option(10, "--top", min=1, metavar="K", help="Configurations ranked (and searched for)."),
    refine: int = typer.Option(3, "--refine", min=0, metavar="N", help="Best configurations planned (zbsolve plan)."),
    time_limit: float = typer.Option(600.0, "--time-limit", metavar="SECONDS",
                                     help="Seconds the whole search may take, refining included."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", min=1, metavar="N",
                                       help="Processes timing configurations (default: all cores)."),
    executor: Optional[str] = typer.Option(None, "--executor", metavar="URL",
                                           help="dask://HOST:PORT to time configurations on a Dask cluster."),
    device_memory: Optional[str] = typer.Option(None, "--device-memory", show_default=False,
                                                help="Memory per device, e.g. 80GiB (default: the GPU's)."),
    reserve: str = RESERVE,
    tp_comm_overlap: bool = TP_COMM_OVERLAP,
    dispatcher: str = DISPATCHER,
    output: Optional[Path] = typer.Option(None, "--output", "-o",
                                          help="Write the chosen configuration's plan (a schedule document)."),
    export: Optional[Path] = typer.Option(None, "--export", metavar="PATH",
                                          help="Write the target's export of the plan: Megatron's arguments (a "
                                               "file), torchtitan's folder, or zbsolve's schedule document."),
    chart: Optional[Path] = typer.Option(None, "--chart", metavar="FILE",
                                         help="Write the chart of every configuration timed: tokens/s/GPU against "
                                              "peak memory per device, the chosen one marked (.png or .svg)."),
    as_json: bool = JSON,
) -> None:
    """Search every parallel configuration (tp, pp, vp, cp, ep, dp, micro-batch size, ZeRO, recomputation) the
    target runs: pruned by memory and by a bound on the step, timed with predict's model, the best planned
    (docs/configure.md). Ctrl-C (or SIGTERM) ranks what was timed so far and exits 130 (143).

    Example: zbsolve configure problems/models/configs/llama3-70b.json --gpus 64 --global-batch 128 --seq-len 8192
    --dtype fp8 --time-limit 120
    """
    began = command_began()  # loading counts against the limit
    from zbsolve.configure.choose import configure as run

    memory = None if device_memory is None else parse_bytes(device_memory, "--device-memory")
    spare = parse_bytes(reserve, "--reserve", zero=True)
    for path, option in ((output, "--output"), (export, "--export")):
        if path is not None and (option == "--output" or target != "torchtitan"):
            check_output(path, option, [config])
    if chart is not None:
        check_chart_path(chart, "--chart", [config, output, export])
    with interruptible("before any configuration that fits was timed", "nothing ranked, nothing written"):
        with progress(f"{escape(config.stem)}: configure on {gpus} x {gpu}, limit {time_limit:g}s", as_json) as update:
            result = run(config, gpus=gpus, global_batch=global_batch, seq_len=seq_len, gpu=gpu, dtype=dtype,
                         target=target, top=top, refine=refine, time_limit=time_limit, jobs=jobs, executor=executor,
                         progress=update, tp_comm_overlap=tp_comm_overlap, dispatcher=dispatcher,
                         device_memory=memory, reserve=spare, began=began)
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
        raise InputError(f"{'--output' if output else '--export'}: nothing written: {why}")
    if result.interrupted or late:
        err.print("interrupted: the best configurations found so far", highlight=False, markup=False)
        raise typer.Exit(exit_code())


def _print(result: ConfigureResult) -> None:
    """The ranked table, the counts, the chosen configuration's predict line, its Megatron arguments and the notes,
    each line whole (to copy)."""
    out.print(configure_table(result), highlight=False)
    shown = lines(result)
    if result.plan is not None and result.target == "megatron":
        shown.insert(2, f"Megatron: {result.export()}")
    for line in shown:
        out.print(line, highlight=False, markup=False, soft_wrap=True)
