"""zbsolve predict: one training configuration's step time, throughput, memory and where its step goes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from zbsolve.app.cli.common import CONFIG, JSON, app, cli_errors, err, out
from zbsolve.app.cli.options import setup_options
from zbsolve.base.errors import InputError
from zbsolve.configure.predict import Configuration, Prediction
from zbsolve.present.tables import plain_table


@app.command()
@cli_errors
@setup_options(Configuration, Configuration.OPTIONS)
def predict(
    config: Path = CONFIG,
    as_json: bool = JSON,
    knobs: dict[str, Any] = {},  # noqa: B006 (set by setup_options)
) -> None:
    """Predict one configuration's step: the model estimated for its GPUs and parallelism, run in one order on the
    simulator, its step ended with the data-parallel synchronisation and the optimizer step (docs/predict.md).
    Under zbsolve's shipped calibration of the GPU and runtime by default (--calibration none: the model as stated).

    Example: zbsolve predict problems/models/configs/llama3-70b.json --gpu h100 --dtype bf16 --seq-len 8192
    --microbatch-size 1 --global-batch 128 --gpus 64 --tp 4 --pp 8 --vp 5
    """
    from zbsolve.configure.predict import predict as run

    if "layout" in knobs and "partition" in knobs:
        raise InputError("--layout and --partition: give one")
    c = Configuration(config=config, **knobs)
    p = run(c)
    for warning in p.warnings:
        err.print(f"warning: {warning}", highlight=False, markup=False, soft_wrap=True)
    if as_json:
        print(json.dumps(p.figures(), indent=1))
    else:
        show(c, p, config)
    if not p.fits:
        raise typer.Exit(1)


def show(c: Configuration, p: Prediction, config: Path) -> None:
    """Print ``p``'s figures, each device's memory by part and the step's breakdown: each table under a line that
    names it, narrow enough for 80 columns."""
    from zbsolve.configure.predict import BREAKDOWN_NOTE

    title = (f"{escape(config.stem)}: {c.gpus} x {c.gpu}, {c.dtype}, tp {c.tp} pp {c.pp} vp {c.vp} dp {p.dp} "
             f"ep {c.ep} zero {c.zero}, seq {c.seq_len}, microbatch {c.microbatch_size}, global batch "
             f"{c.global_batch} (m = {p.num_microbatches}), {p.schedule}")
    rows = [("step time", f"{p.step_time_s:.4f} s"), ("tokens/s/GPU", f"{p.tokens_per_s_per_gpu:,.0f}"),
            ("model TFLOP/s/GPU", f"{p.model_tflops_per_gpu:.1f}"),
            ("MFU", f"{100 * p.mfu:.1f}% of {p.peak_flops / 1e12:.0f} TFLOP/s"), ("fits", fit_line(p))]
    parts = [(name, f"{t:.4f}", f"{100 * t / p.step_time_s:.1f}%") for name, t in p.breakdown.items()]
    for line, table in ((title, plain_table(("figure", "value"), rows)),
                        ("memory per device, GiB", plain_table(MEMORY_COLUMNS, memory_rows(p))),
                        ("breakdown of the step", plain_table(("part", "seconds", "share"), parts))):
        out.print(line if line == title else f"\n{line}", highlight=False)
        out.print(table, highlight=False)
    out.print(f"partition (layers per stage): {','.join(map(str, p.counts))}; {BREAKDOWN_NOTE}", highlight=False,
              markup=False)
    out.print(p.calibration, highlight=False, markup=False)


def fit_line(p: Prediction) -> str:
    """Whether ``p`` fits, with its busiest device's memory (every part, the reserve included: the figure
    ``configure``'s table prints), the device memory and that device: "yes: 70.7 of 79.65 GiB (device 0)", or
    "no: 101.4 of 79.65 GiB (device 1), 21.8 GiB short"."""
    device, need = p.busiest()
    short = "" if p.fits else f", {max(p.shortfall_gib, default=need - p.device_memory_gib):.1f} GiB short"
    return f"{'yes' if p.fits else 'no'}: {need:.1f} of {p.device_memory_gib:.2f} GiB (device {device}){short}"


MEMORY_COLUMNS = ("dev", "weights", "grads", "optim", "activ", "recomp", "logits", "buffers", "reserve", "total",
                  "short")
"""The memory table's columns: a device, its parts (``memory_parts.PARTS``), their sum and the GiB it lacks."""


def memory_rows(p: Prediction) -> list[list[str]]:
    """One row per device of ``p``: its memory's parts, total and shortfall, GiB."""
    return [[str(d), *(f"{x:.1f}" for x in m.gib().values()), f"{m.total / 2**30:.1f}",
             f"{short:.1f}" if short else "-"] for d, (m, short) in enumerate(zip(p.memory, p.shortfall_gib))]
