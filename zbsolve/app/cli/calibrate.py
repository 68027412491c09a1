"""zbsolve calibrate: the cost model's multipliers fitted to measured runs, written for --calibration."""

from __future__ import annotations

import datetime
import json
import shlex
from pathlib import Path
from typing import Optional

import typer
import yaml

from zbsolve.app.cli.common import JSON, QUIET, app, cli_errors, err, interruptible, out, output_option
from zbsolve.base.files import check_output
from zbsolve.base.interrupt import deferred, exit_code
from zbsolve.present.tables import text_table


@app.command()
@cli_errors
def calibrate(
    runs: list[Path] = typer.Argument(..., metavar="RUN.yaml...",
                                      help="Measured runs in problems/calibration/'s schema (its README)."),
    output: Path = output_option(..., "The calibration file to write (YAML), for --calibration.", metavar="CAL.yaml"),
    terms: Optional[str] = typer.Option(None, "--terms", metavar="T,T", help="The terms fitted, comma-separated "
                                        "(default: every term of costmodel/calibration.py's TERMS)."),
    as_json: bool = JSON, quiet: bool = QUIET,
) -> None:
    """Fit the cost model's multipliers (docs/cost-model.md, "Calibration") to measured runs by least squares on log
    step time (and log peak memory where measured), one line per evaluation on stderr, and write them for
    --calibration. Runs marked held back or not scored are not fitted.

    Ctrl-C (or SIGTERM) stops the fit, writes the best multipliers evaluated so far (stopped_early: true) and exits
    130 (143).

    Example: zbsolve calibrate problems/calibration/llama3-70b-h100-64-fp8-gbs128.yaml
    problems/calibration/llama3.1-405b-h100-1024-fp8-gbs512.yaml -o my-cluster.yaml
    """
    from zbsolve.configure.calibrate import document, fit
    from zbsolve.configure.measured_runs import read_run

    check_output(output, "--output", runs)
    chosen = None if terms is None else [t.strip() for t in terms.split(",") if t.strip()]
    read = [read_run(path) for path in runs]
    for run in read:
        if run.held_back or not run.scored:
            err.print(f"note: {run.name} is {'held back' if run.held_back else 'not scored'}: not fitted",
                      highlight=False, markup=False, soft_wrap=True)
    silent = quiet or as_json
    with interruptible("before the first evaluation", "nothing written"):
        result = fit(read, chosen, progress=None if silent else lambda line: err.print(
            line, highlight=False, markup=False, soft_wrap=True))
    command = shlex.join(["zbsolve", "calibrate", *map(str, runs), "-o", str(output),
                          *(["--terms", terms] if terms else [])])
    data = document(result, command, _version(), datetime.date.today().isoformat())
    with deferred() as late:
        output.write_text(yaml.safe_dump(data, sort_keys=False, width=120))
    if result.stopped_early or late:
        err.print(f"interrupted: the best multipliers evaluated so far are in {output} ({result.evaluations} "
                  "evaluations)", highlight=False, markup=False, soft_wrap=True)
    if as_json:
        print(json.dumps(data, indent=1))
    elif not quiet:
        rows = [(r["name"], f"{r['measured_step_s']:.4g}", f"{r['predicted_step_s']:.4g}",
                 f"{r['log_step_residual']:+.3f}") for r in data["runs"]]
        out.print(text_table(("run", "measured s", "fitted s", "log residual"), rows,
                             "calibrate: " + ", ".join(f"{n} x{m:.3f}" for n, m in data["multipliers"].items())),
                  highlight=False)
        out.print(f"wrote {output}", highlight=False, markup=False)
    if result.stopped_early or late:
        raise typer.Exit(exit_code())



def _version() -> str:
    """zbsolve's version as installed ("unknown" where it is run from a checkout that is not)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("zbsolve")
    except PackageNotFoundError:
        return "unknown"
