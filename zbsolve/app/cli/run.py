"""zbsolve run and zbsolve profile: schedules executed and stages measured on torch.distributed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer
from rich.markup import escape

from zbsolve.app.cli.common import JSON, QUIET, WIDE, app, cli_errors, err, out, output_option, wide
from zbsolve.base.errors import InputError
from zbsolve.base.files import check_output
from zbsolve.io.document import load_document
from zbsolve.present.tables import text_table

if TYPE_CHECKING:
    from zbsolve.execute.modules import ModelSpec
    from zbsolve.execute.profiler import ProfileOptions

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
    as_json: bool = JSON, quiet: bool = QUIET, whole: bool = WIDE,
) -> None:
    """Run a schedule on torch.distributed (one process per device, or under torchrun) and print the
    measured compute times, bubble and memory beside the simulator's prediction. A document with a "partition"
    section (solved from a model) cuts the GPT into the stages it names and checkpoints the blocks it recomputes.

    Example: zbsolve run zb-h1.json --model gpt --steps 3 --check
    """
    from zbsolve.execute.executor import RunOptions, oversubscription, run_schedule
    from zbsolve.execute.launch import torchrun_rank
    from zbsolve.execute.modules import ModelSpec
    from zbsolve.present.figures import Units
    from zbsolve.present.run_report import (
        MEMORY_COLUMNS,
        REPORT_COLUMNS,
        memory_table,
        report_note,
        report_table,
        step_line,
        time_table,
    )

    loaded = load_document(file, "zbsolve run")
    sched = loaded.schedule
    spec = ModelSpec(name=model, layers=layers, hidden=hidden, heads=heads, vocab=vocab, seq_len=seq_len, seed=seed)
    options = RunOptions(model=spec, steps=steps, device=device, check=check, batch_size=batch_size,
                         timeout_s=timeout, seed=seed, costs=loaded.costs)
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
    note, units, name = report_note(rows), Units.of(loaded.costs), escape(str(file))
    if whole:
        wide.print(text_table(REPORT_COLUMNS, report_table(rows, units), f"{name}: measured vs simulated",
                              None if note is None else escape(note)))
        return
    columns, times = time_table(rows)
    out.print(text_table(columns, times, f"{name}: measured vs simulated, per rank", escape(step_line(rows))))
    out.print(text_table(MEMORY_COLUMNS, memory_table(rows, units), f"{name}: peak memory per rank",
                         None if note is None else escape(note)))


@app.command()
@cli_errors
def profile(
    model: str = MODEL,
    stages: Optional[int] = typer.Option(None, "--stages", "-p", min=1,
                                         help="Number of pipeline stages, one per device (not with --per-layer)."),
    per_layer: bool = typer.Option(False, "--per-layer", help="Measure each layer; write a model description "
                                                              "(problems/models/) instead of a per-stage Profile."),
    microbatch_size: int = typer.Option(1, "--microbatch-size", "-b", min=1, help="Microbatch size."),
    output: Path = output_option(..., "Profile (--per-layer: model description) to write (.yaml or .json)."),
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
    from zbsolve.execute.modules import ModelSpec, load_model
    from zbsolve.execute.profiler import (
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
        _profile_layers(spec, options, output, header, quiet)
        return
    measurement = measure(load_model(spec, stages), options)
    write_profile(measurement, output, header)
    if quiet:
        return
    out.print(text_table(NOISE_COLUMNS, noise_table(measurement), header, latency_line(measurement)))


def _profile_layers(spec: ModelSpec, options: ProfileOptions, output: Path, header: str, quiet: bool) -> None:
    """``zbsolve profile --per-layer``: each layer of ``spec`` measured with ``options``, written to ``output`` as a
    model description whose source is the command that made it, and shown under ``header`` unless ``quiet``."""
    from zbsolve.execute.layer_profiler import profile_layers
    from zbsolve.execute.modules import load_layers
    from zbsolve.present.layers import LAYER_HEADERS, layer_rows

    gpt = (f" --layers {spec.layers or 1} --hidden {spec.hidden} --heads {spec.heads} --vocab {spec.vocab} "
           f"--seq-len {spec.seq_len}" if spec.name == "gpt" else "")
    o = options
    command = (f"zbsolve profile --model {spec.name} --per-layer --microbatch-size {o.microbatch_size} --repeats "
               f"{o.repeats} --warmup {o.warmup} --{'' if o.latency else 'no-'}latency --device {o.device} --threads "
               f"{o.threads} --memory-model {o.memory_model}{gpt} --seed {spec.seed} -o {output}")
    described = profile_layers(load_layers(spec), options, name=spec.name, source=command,
                               seq_len=spec.seq_len if spec.name == "gpt" else None)
    described.save(output)
    if not quiet:
        out.print(text_table(LAYER_HEADERS, layer_rows(described), header), highlight=False)
