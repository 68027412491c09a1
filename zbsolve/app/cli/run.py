"""zbsolve run and zbsolve profile: schedules executed and stages measured on torch.distributed."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer
from rich.markup import escape

from zbsolve.app.cli.common import JSON, QUIET, WIDE, app, cli_errors, document_units, err, out, output_option, wide
from zbsolve.app.cli.groups import grouped
from zbsolve.base.errors import InputError
from zbsolve.base.files import check_output
from zbsolve.io.document import load_document
from zbsolve.present.figures import Units
from zbsolve.present.tables import text_table

if TYPE_CHECKING:
    from zbsolve.execute.executor import RunOptions
    from zbsolve.execute.modules import ModelSpec
    from zbsolve.execute.profiler import ProfileOptions
    from zbsolve.problem.costs import Costs

MODEL = typer.Option("gpt", "--model", help="gpt (the built-in small GPT) or module:function returning stages.")


@dataclass(frozen=True)
class GptShape:
    """The built-in GPT's sizes and seed, as ``zbsolve run`` and ``zbsolve profile`` take them."""

    hidden: Annotated[int, typer.Option(32, "--hidden", help="GPT hidden size.")]
    heads: Annotated[int, typer.Option(2, "--heads", help="GPT attention heads.")]
    vocab: Annotated[int, typer.Option(64, "--vocab", help="GPT vocabulary size.")]
    seq_len: Annotated[int, typer.Option(16, "--seq-len", help="Sequence length.")]
    seed: Annotated[int, typer.Option(0, "--seed", help="Model and data seed.")]

    def spec(self, model: str, layers: Optional[int]) -> ModelSpec:
        """The model ``model`` (with ``layers`` GPT blocks) of this shape."""
        from zbsolve.execute.modules import ModelSpec

        return ModelSpec(name=model, layers=layers, **asdict(self))


@dataclass(frozen=True)
class RunArgs:
    """What ``zbsolve run`` runs, and how."""

    model: Annotated[str, MODEL]
    steps: Annotated[int, typer.Option(2, "--steps", min=1, help="Training steps (the first is not timed).")]
    device: Annotated[str, typer.Option("cpu", "--device", help="cpu (gloo) or cuda (NCCL).")]
    check: Annotated[bool, typer.Option(False, "--check",
                                        help="Compare every gradient with a single-process reference.")]
    batch_size: Annotated[Optional[int], typer.Option(None, "--batch-size", help="Batch size (default: m).")]
    layers: Annotated[Optional[int], typer.Option(None, "--layers", help="GPT blocks (default: the document's "
                                                                         "partition's, else one per stage).")]
    gpt: GptShape
    timeout: Annotated[float, typer.Option(60.0, "--timeout", help="Seconds before a silent peer is an error.")]

    def options(self, costs: Optional[Costs]) -> RunOptions:
        """The executor's options, with the document's ``costs``."""
        from zbsolve.execute.executor import RunOptions

        return RunOptions(model=self.gpt.spec(self.model, self.layers), steps=self.steps, device=self.device,
                          check=self.check, batch_size=self.batch_size, timeout_s=self.timeout, seed=self.gpt.seed,
                          costs=costs)


@app.command()
@cli_errors
@grouped
def run(file: Path = typer.Argument(..., help="Schedule document (JSON)."), *, args: RunArgs,
        as_json: bool = JSON, quiet: bool = QUIET, whole: bool = WIDE) -> None:
    """Run a schedule on torch.distributed (one process per device, or under torchrun) and print the
    measured compute times, bubble and memory beside the simulator's prediction. A document with a "partition"
    section (solved from a model) cuts the GPT into the stages it names and checkpoints the blocks it recomputes.

    Example: zbsolve run zb-h1.json --model gpt --steps 3 --check
    """
    from zbsolve.execute.executor import run_schedule
    from zbsolve.execute.launch import torchrun_rank

    loaded = load_document(file, "zbsolve run")
    sched = loaded.schedule
    options = args.options(loaded.costs)
    place = torchrun_rank()
    lead = place is None or place.rank == 0

    def warn(warning: str) -> None:
        if lead:
            err.print(f"[yellow]warning:[/yellow] {escape(warning)}", highlight=False, soft_wrap=True)

    rows = run_schedule(sched, options, warn)
    if not quiet and lead:
        _print_run(rows, file, document_units(loaded), as_json, whole)


def _print_run(rows: list[dict[str, Any]], file: Path, units: Units, as_json: bool, whole: bool) -> None:
    """The run's ``rows`` as JSON, or measured beside simulated (the document's figures in its ``units``): times and
    memory per rank, or (``whole``) one table of every column."""
    from zbsolve.present.run_report import (
        MEMORY_COLUMNS,
        REPORT_COLUMNS,
        memory_table,
        report_note,
        report_table,
        step_line,
        time_table,
    )

    if as_json:
        print(json.dumps(rows, indent=1, default=str))
        return
    note, name = report_note(rows), escape(str(file))
    if whole:
        wide.print(text_table(REPORT_COLUMNS, report_table(rows, units), f"{name}: measured vs simulated",
                              None if note is None else escape(note)))
        return
    columns, times = time_table(rows)
    out.print(text_table(columns, times, f"{name}: measured vs simulated, per rank", escape(step_line(rows))))
    out.print(text_table(MEMORY_COLUMNS, memory_table(rows, units), f"{name}: peak memory per rank",
                         None if note is None else escape(note)))


@dataclass(frozen=True)
class ProfileArgs:
    """What ``zbsolve profile`` measures, how, and where it writes."""

    model: Annotated[str, MODEL]
    stages: Annotated[Optional[int], typer.Option(None, "--stages", "-p", min=1, help="Number of pipeline stages, "
                                                  "one per device (not with --per-layer).")]
    per_layer: Annotated[bool, typer.Option(False, "--per-layer", help="Measure each layer; write a model "
                                            "description (problems/models/) instead of a per-stage Profile.")]
    microbatch_size: Annotated[int, typer.Option(1, "--microbatch-size", "-b", min=1, help="Microbatch size.")]
    output: Annotated[Path, output_option(..., "Profile (--per-layer: model description) to write (.yaml or "
                                          ".json).")]
    repeats: Annotated[int, typer.Option(10, "--repeats", min=1,
                                         help="Measurements per figure (medians are kept).")]
    warmup: Annotated[int, typer.Option(2, "--warmup", min=0, help="Untimed runs first.")]
    latency: Annotated[bool, typer.Option(True, "--latency/--no-latency",
                                          help="Measure point-to-point latency (t_comm).")]
    device: Annotated[str, typer.Option("cpu", "--device", help="cpu or cuda.")]
    threads: Annotated[int, typer.Option(1, "--threads", min=1,
                                         help="CPU threads (1 matches each rank of zbsolve run).")]
    memory_model: Annotated[str, typer.Option("torch", "--memory-model", help="What B frees: torch (almost nothing, "
                                              "as torch's split backward) or paper (every saved activation W does "
                                              "not read).")]
    layers: Annotated[Optional[int], typer.Option(None, "--layers", help="GPT layers (default: one per stage; 1 "
                                                                         "with --per-layer).")]
    gpt: GptShape

    def options(self) -> ProfileOptions:
        """The profiler's options."""
        from zbsolve.execute.profiler import ProfileOptions

        return ProfileOptions(microbatch_size=self.microbatch_size, repeats=self.repeats, warmup=self.warmup,
                              latency=self.latency, device=self.device, threads=self.threads, seed=self.gpt.seed,
                              memory_model=self.memory_model)


@app.command()
@cli_errors
@grouped
def profile(*, args: ProfileArgs, quiet: bool = QUIET) -> None:
    """Measure each stage's F, B, W times and memory and the communication latency; write a Profile. With
    --per-layer, measure each layer and write a model description, which zbsolve solve cuts into stages.

    Example: zbsolve profile --model gpt --stages 4 --microbatch-size 4 -o profile.yaml

    Example: zbsolve profile --model gpt --layers 8 --per-layer -o gpt.yaml
    """
    check_output(args.output, "--output")
    if args.stages is None and not args.per_layer:
        raise InputError("--stages is missing: give the number of pipeline stages, or --per-layer")
    if args.stages is not None and args.per_layer:
        raise InputError(f"--stages {args.stages} with --per-layer: a per-layer profile has no stages; leave --stages "
                         "out")
    from zbsolve.execute.modules import load_model
    from zbsolve.execute.profiler import (
        NOISE_COLUMNS,
        latency_line,
        measure,
        noise_table,
        profile_header,
        write_profile,
    )

    spec, options = args.gpt.spec(args.model, args.layers), args.options()
    header = profile_header(spec, args.stages, options)
    if args.stages is None:
        _profile_layers(spec, options, args.output, header, quiet)
        return
    measurement = measure(load_model(spec, args.stages), options)
    write_profile(measurement, args.output, header)
    if not quiet:
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
