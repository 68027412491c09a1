"""zbsolve schedule and zbsolve compare: the handcrafted families."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional

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
    file_units,
    out,
    read_profile,
    unit_keys,
)
from zbsolve.app.cli.groups import grouped
from zbsolve.base.checks import check_size
from zbsolve.base.errors import InputError
from zbsolve.base.files import check_output
from zbsolve.core.measures import BUBBLES_NOTE
from zbsolve.core.simulator import simulate
from zbsolve.io.document import write_document
from zbsolve.present.figures import shown
from zbsolve.present.tables import figures_table, records_table
from zbsolve.schedulers.families import FAMILIES, make_schedule


@dataclass(frozen=True)
class Pipeline:
    """The pipeline a family is built for: p devices (``--devices``, or its hidden other name ``--stages``), m
    microbatches and the profile's times."""

    devices: Annotated[Optional[int], DEVICES]
    stages: Annotated[Optional[int], DEVICES_ALIAS]
    microbatches: Annotated[int, MICROBATCHES]
    profile: Annotated[Optional[Path], PROFILE]

    @property
    def num_devices(self) -> int:
        """p, from ``--devices`` or ``--stages``."""
        if self.devices is not None:
            if self.stages is not None and self.stages != self.devices:
                raise InputError(f"--devices {self.devices} and --stages {self.stages} differ: give --devices only")
            return self.devices
        if self.stages is None:
            raise InputError("missing option --devices / -p: give the number of pipeline devices")
        return self.stages


@app.command()
@cli_errors
@grouped
def schedule(family: str = typer.Argument(..., help=f"Family: {', '.join(FAMILIES)}."), *, pipeline: Pipeline,
             output: Optional[Path] = SCHEDULE_OUTPUT, chart: Optional[Path] = GANTT_CHART, as_json: bool = JSON,
             quiet: bool = QUIET) -> None:
    """Build a handcrafted schedule and print its figures.

    Example: zbsolve schedule zb-h1 --devices 8 --microbatches 24 -o zb-h1.json
    """
    p, m, profile = pipeline.num_devices, pipeline.microbatches, pipeline.profile
    if output:
        check_output(output, "--output", [profile])
    if chart:
        from zbsolve.present.plot import check_chart_path
        check_chart_path(chart, "--chart", [profile])
    timeline, units = simulate(make_schedule(family, read_profile(profile), p, m)), file_units(profile)
    if output:
        write_document(timeline, output, **unit_keys(units))
    if chart:
        from zbsolve.present.plot import save_chart
        save_chart(timeline, chart, memory=True, units=units)
    if as_json and not quiet:
        print(json.dumps({family: timeline.figures()}, indent=1))
    elif not quiet:
        out.print(figures_table(shown(timeline.figures(), units), f"{family}: p={p}, m={m}",
                                BUBBLES_NOTE))


@app.command()
@cli_errors
@grouped
def compare(*, pipeline: Pipeline, as_json: bool = JSON, quiet: bool = QUIET) -> None:
    """Print one row of figures per handcrafted family (families that cannot run say why).

    Example: zbsolve compare --devices 8 --microbatches 24
    """
    p, m, profile = pipeline.num_devices, pipeline.microbatches, pipeline.profile
    check_size(p, m)  # too big with one stage per device is refused; more stages only skip a family
    prof = read_profile(profile)
    figures, skipped = {}, {}
    for name in FAMILIES:
        try:
            figures[name] = simulate(make_schedule(name, prof, p, m)).figures()
        except InputError as exc:
            skipped[name] = str(exc)
    units = file_units(profile)
    if as_json and not quiet:
        print(json.dumps({"figures": figures, "skipped": skipped,
                          "units": {"time": units.time, "memory": units.memory}}, indent=1))
        return
    if not quiet:
        out.print(records_table([{"schedule": name, **f} for name, f in figures.items()],
                                f"families: p={p}, m={m}",
                                ("schedule", "makespan", "bubble_rate", "paper_bubble", "peak_memory"), units,
                                BUBBLES_NOTE))
        for name, why in skipped.items():
            out.print(f"{name}: skipped ({why})", highlight=False, markup=False)

