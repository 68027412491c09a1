"""zbsolve check, plot and export: what is done with a schedule document."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from zbsolve.app.cli.common import (
    JSON,
    QUIET,
    app,
    cli_errors,
    document_units,
    err,
    out,
    output_option,
    print_result,
)
from zbsolve.base.files import check_output
from zbsolve.core.simulator import simulate
from zbsolve.io.document import drift_matters, load_document, planned_drift


@app.command()
@cli_errors
def check(file: Path = typer.Argument(..., help="Schedule document (JSON)."), as_json: bool = JSON,
          quiet: bool = QUIET) -> None:
    """Validate a schedule document and print its figures (exit 1 if invalid).

    A document with a "partition" section is also checked to sum its layers into its profile, and one with a
    "device_memory" to fit every device's static bytes, peak activations and reserve in it.

    Example: zbsolve check zb-h1.json
    """
    from zbsolve.problem.costs import check_fits, memory_figures

    loaded = load_document(file, "zbsolve check")
    sched, costs = loaded.schedule, loaded.costs
    timeline = simulate(sched)
    if costs is not None:
        check_fits(costs, timeline)
    drift = planned_drift(timeline, loaded.planned)
    if quiet:
        return
    figures = {**timeline.figures(), **(memory_figures(costs, timeline) if costs is not None else {})}
    if as_json:
        print(json.dumps({"valid": True, "name": sched.name, **figures, "planned_drift": drift}, indent=1))
        return
    print_result({"name": escape(sched.name), **figures}, costs, f"{escape(str(file))}: valid",
                 units=document_units(loaded))
    if drift_matters(drift, timeline):
        out.print(f"note: planned times differ from the as-soon-as-possible timing by up to {drift:g}")


@app.command()
@cli_errors
def plot(file: Path = typer.Argument(..., help="Schedule document (JSON)."),
         output: Path = output_option(..., "Chart file (.png or .svg)."),
         memory: bool = typer.Option(False, "--memory", help="Add a panel of memory over time per device."),
         quiet: bool = QUIET) -> None:
    """Draw a schedule document as a Gantt chart.

    Example: zbsolve plot zb-h1.json -o zb-h1.png --memory
    """
    from zbsolve.present.plot import check_chart_path, save_chart

    check_chart_path(output, "--output", [file])
    loaded = load_document(file, "zbsolve plot")
    save_chart(simulate(loaded.schedule), output, memory=memory, costs=loaded.costs, units=document_units(loaded))
    if not quiet:
        out.print(f"wrote {output}", markup=False)


@app.command()
@cli_errors
def export(
    file: Path = typer.Argument(..., help="Schedule document (JSON)."),
    fmt: str = typer.Option("torch-csv", "--format", "-f", help="Export format: torch-csv, torchtitan (the CSV and "
                            "torchtitan's pipeline and activation checkpointing settings) or megatron (Megatron's "
                            "pipeline and recomputation arguments)."),
    output: Optional[Path] = output_option(None, "Output file; a folder for torchtitan; megatron prints without it.",
                                           show_default=False),
    microbatch_size: Optional[int] = typer.Option(None, "--microbatch-size", min=1, show_default=False,
                                                  help="torchtitan: sequences per microbatch (default: the "
                                                       "setting's, else 1)."),
    rename: Optional[list[str]] = typer.Option(None, "--rename", metavar="OLD=NEW", show_default=False,
                                               help="torchtitan: a layer's module FQN, repeatable (output=lm_head "
                                                    "unless renamed, for torchtitan 0.3.0)."),
    quiet: bool = QUIET,
) -> None:
    """Export a schedule for torch.distributed.pipelining's runtime, torchtitan or Megatron (docs/torch.md).

    Example: zbsolve export zb-h1.json --format torch-csv -o zb-h1.csv
    """
    from zbsolve.io.targets import EXPORTS, export_document

    if output is not None and getattr(EXPORTS.get(fmt), "output", "file") != "folder":  # a folder: its exporter's
        check_output(output, "--output", [file])
    def note(line: str) -> None:
        if not quiet:
            err.print(f"note: {line}", markup=False, highlight=False, soft_wrap=True)

    written, text = export_document(file, fmt, output, microbatch_size=microbatch_size, renames=rename or (),
                                    note=note, taker="zbsolve export")
    if not written:
        out.print(text, markup=False, highlight=False, soft_wrap=True)
    elif not quiet:
        out.print(f"wrote {', '.join(map(str, written))}", markup=False, soft_wrap=True)
