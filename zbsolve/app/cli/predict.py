"""zbsolve predict: one training configuration's step time, throughput, memory and where its step goes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from zbsolve.app.cli.common import DISPATCHER, JSON, RESERVE, TP_COMM_OVERLAP, app, cli_errors, out
from zbsolve.base.errors import InputError
from zbsolve.base.units import parse_bytes
from zbsolve.present.tables import text_table


@app.command()
@cli_errors
def predict(
    config: Path = typer.Argument(..., help="Hugging Face config.json of the model."),
    gpu: str = typer.Option("h100", "--gpu", metavar="GPU", help="GPU preset: h100, h200, a100 or b200."),
    dtype: str = typer.Option("bf16", "--dtype", metavar="DTYPE", help="Type of the matrix products."),
    seq_len: int = typer.Option(..., "--seq-len", min=1, metavar="N", help="Tokens per sequence."),
    microbatch_size: int = typer.Option(..., "--microbatch-size", "-b", min=1, metavar="N",
                                       help="Sequences per microbatch."),
    global_batch: int = typer.Option(..., "--global-batch", min=1, metavar="N", help="Sequences per step."),
    gpus: int = typer.Option(..., "--gpus", min=1, metavar="N", help="GPUs of the run."),
    tp: int = typer.Option(1, "--tp", min=1, metavar="N", help="Tensor-parallel degree (sequence parallel)."),
    pp: int = typer.Option(1, "--pp", min=1, metavar="N", help="Pipeline ranks."),
    vp: int = typer.Option(1, "--vp", min=1, metavar="N", help="Virtual stages per pipeline rank."),
    cp: int = typer.Option(1, "--cp", min=1, metavar="N", help="Context-parallel degree."),
    ep: int = typer.Option(1, "--ep", min=1, metavar="N", help="Expert-parallel degree."),
    zero: int = typer.Option(1, "--zero", metavar="N",
                             help="0: DDP; 1: the distributed optimizer (ZeRO-1); 3: FSDP."),
    layout: Optional[str] = typer.Option(None, "--layout", metavar="STR",
                                         help="Megatron's --pipeline-model-parallel-layout."),
    partition: Optional[str] = typer.Option(None, "--partition", metavar="SPLIT",
                                            help="uniform (default), balanced, torchtitan, or layer counts per stage."),
    schedule: Optional[str] = typer.Option(None, "--schedule", metavar="NAME",
                                           help="A torch built-in or Combined1F1B (default: Megatron's order: "
                                                "1F1B, or Interleaved1F1B with --vp > 1)."),
    recompute: str = typer.Option("none", "--recompute", metavar="CHOICE",
                                  help="none, full, uniform:N, per-stage:..., selective or modules:M,..."),
    device_memory: Optional[str] = typer.Option(None, "--device-memory", show_default=False,
                                                help="Memory per device, e.g. 80GiB (default: the GPU's)."),
    reserve: str = RESERVE,
    overlap_grad_reduce: bool = typer.Option(True, "--overlap-grad-reduce/--no-overlap-grad-reduce",
                                             help="Gradients reduced during the backward, bucket by bucket."),
    overlap_param_gather: bool = typer.Option(True, "--overlap-param-gather/--no-overlap-param-gather",
                                              help="Parameters all-gathered during the next forward."),
    tp_comm_overlap: bool = TP_COMM_OVERLAP,
    dispatcher: str = DISPATCHER,
    as_json: bool = JSON,
) -> None:
    """Predict one configuration's step: the model estimated for its GPUs and parallelism, run in one order on the
    simulator, its step ended with the data-parallel synchronisation and the optimizer step (docs/predict.md).

    Example: zbsolve predict problems/models/configs/llama3-70b.json --gpu h100 --dtype bf16 --seq-len 8192
    --microbatch-size 1 --global-batch 128 --gpus 64 --tp 4 --pp 8 --vp 5
    """
    from zbsolve.configure.predict import BREAKDOWN_NOTE, Configuration, predict as run

    if layout is not None and partition is not None:
        raise InputError("--layout and --partition: give one")
    if zero not in (0, 1, 3):
        raise InputError(f"--zero = {zero}: should be 0, 1 or 3")
    c = Configuration(config, gpu, dtype, seq_len, microbatch_size, global_batch, gpus, tp, pp, vp, cp, ep, zero,
                      layout, partition or "uniform", schedule, recompute,
                      None if device_memory is None else parse_bytes(device_memory, "device_memory"),
                      parse_bytes(reserve, "reserve", zero=True), overlap_grad_reduce, overlap_param_gather,
                      tp_comm_overlap, dispatcher)
    p = run(c)
    if as_json:
        print(json.dumps(p.figures(), indent=1))
        return
    title = (f"{escape(config.stem)}: {gpus} x {gpu}, {dtype}, tp {tp} pp {pp} vp {vp} dp {p.dp} ep {ep} zero {zero}, "
             f"seq {seq_len}, microbatch {microbatch_size}, global batch {global_batch} (m = {p.num_microbatches}), "
             f"{p.schedule}")
    rows = [("step time", f"{p.step_time_s:.4f} s"), ("tokens/s/GPU", f"{p.tokens_per_s_per_gpu:,.0f}"),
            ("model TFLOP/s/GPU", f"{p.model_tflops_per_gpu:.1f}"),
            ("MFU", f"{100 * p.mfu:.1f}% of {p.peak_flops / 1e12:.0f} TFLOP/s"),
            ("fits", f"{'yes' if p.fits else 'no'} ({p.device_memory_gib:.2f} GiB a device)")]
    out.print(text_table(("figure", "value"), rows, title), highlight=False)
    out.print(text_table([f"device {d}" for d in range(len(p.peak_memory_gib))],
                         [[f"{x:.2f}" for x in p.peak_memory_gib]], "peak memory, GiB (static + activations)"),
              highlight=False)
    out.print(text_table(("part", "seconds", "share"), [(name, f"{t:.4f}", f"{100 * t / p.step_time_s:.1f}%")
                                                        for name, t in p.breakdown.items()], "breakdown"),
              highlight=False)
    out.print(f"partition (layers per stage): {','.join(map(str, p.counts))}; {BREAKDOWN_NOTE}", highlight=False,
              markup=False, soft_wrap=True)
