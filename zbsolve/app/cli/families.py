"""zbsolve schedule and zbsolve compare: the handcrafted families."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from zbsolve.app.cli.common import (
    DEVICES,
    DEVICES_ALIAS,
    GANTT_CHART,
    JSON,
    MICROBATCHES,
    PROFILE,
    QUIET,
    SCHEDULE_OUTPUT,
    app,
    cli_errors,
    device_count,
    file_units,
    out,
    read_profile,
)
from zbsolve.base.checks import check_size
from zbsolve.base.errors import InputError
from zbsolve.base.files import check_output
from zbsolve.core.measures import BUBBLES_NOTE
from zbsolve.core.simulator import simulate
from zbsolve.io.document import write_document
from zbsolve.present.figures import shown
from zbsolve.present.tables import figures_table, records_table
from zbsolve.schedulers.families import FAMILIES, make_schedule


@app.command()
@cli_errors
def schedule(
    family: str = typer.Argument(..., help=f"Family: {', '.join(FAMILIES)}."),
    devices: Optional[int] = DEVICES, microbatches: int = MICROBATCHES, profile: Optional[Path] = PROFILE,
    output: Optional[Path] = SCHEDULE_OUTPUT, chart: Optional[Path] = GANTT_CHART,
    as_json: bool = JSON, quiet: bool = QUIET, stages: Optional[int] = DEVICES_ALIAS,
) -> None:
    """Build a handcrafted schedule and print its figures.

    Example: zbsolve schedule zb-h1 --devices 8 --microbatches 24 -o zb-h1.json
    """
    p = device_count(devices, stages)
    if output:
        check_output(output, "--output", [profile])
    if chart:
        from zbsolve.present.plot import check_chart_path
        check_chart_path(chart, "--chart", [profile])
    timeline = simulate(make_schedule(family, read_profile(profile), p, microbatches))
    if output:
        write_document(timeline, output)
    if chart:
        from zbsolve.present.plot import save_chart
        save_chart(timeline, chart, memory=True)
    if as_json and not quiet:
        print(json.dumps({family: timeline.figures()}, indent=1))
    elif not quiet:
        out.print(figures_table(shown(timeline.figures(), file_units(profile)), f"{family}: p={p}, m={microbatches}",
                                BUBBLES_NOTE))



@app.command()
@cli_errors
def compare(devices: Optional[int] = DEVICES, microbatches: int = MICROBATCHES, profile: Optional[Path] = PROFILE,
            as_json: bool = JSON, quiet: bool = QUIET, stages: Optional[int] = DEVICES_ALIAS) -> None:
    """Print one row of figures per handcrafted family (families that cannot run say why).

    Example: zbsolve compare --devices 8 --microbatches 24
    """
    p = device_count(devices, stages)
    check_size(p, microbatches)  # too big with one stage per device is refused; more stages only skip a family
    prof = read_profile(profile)
    figures, skipped = {}, {}
    for name in FAMILIES:
        try:
            figures[name] = simulate(make_schedule(name, prof, p, microbatches)).figures()
        except InputError as exc:
            skipped[name] = str(exc)
    units = file_units(profile)
    if as_json and not quiet:
        print(json.dumps({"figures": figures, "skipped": skipped,
                          "units": {"time": units.time, "memory": units.memory}}, indent=1))
        return
    if not quiet:
        out.print(records_table([{"schedule": name, **f} for name, f in figures.items()],
                                f"families: p={p}, m={microbatches}",
                                ("schedule", "makespan", "bubble_rate", "paper_bubble", "peak_memory"), units,
                                BUBBLES_NOTE))
        for name, why in skipped.items():
            out.print(f"{name}: skipped ({why})", highlight=False, markup=False)

