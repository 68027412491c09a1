"""What every command shares: the app, its consoles and options, the errors' exit codes, the interrupt and progress
helpers, and the figures table."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from zbsolve.base.errors import InfeasibleError, InputError, ScheduleError, ZbsolveError
from zbsolve.base.interrupt import exit_code, signals_as_interrupt
from zbsolve.base.units import GIB
from zbsolve.core.profile import UNIT, Profile
from zbsolve.optimize.result import status_text
from zbsolve.present.tables import LAYER_LABELS, PER_DEVICE, device_memory_table, figures_table
from zbsolve.problem.costs import DEFAULT_RESERVE, Costs

app = typer.Typer(help="Find and check pipeline-parallel training schedules (zero bubble).",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
out = Console()
err = Console(stderr=True)
wide = Console(width=max(out.width, 180))
"""For tables with many columns, which a narrow or non-terminal output would squeeze."""

DEVICES = typer.Option(None, "--devices", "-p", min=1, show_default=False,
                       help="Number of pipeline devices p (required).")
DEVICES_ALIAS = typer.Option(None, "--stages", min=1, hidden=True, help="Another name of --devices.")
MICROBATCHES = typer.Option(..., "--microbatches", "-m", min=1, help="Number of microbatches m.")
PROFILE = typer.Option(None, "--profile", help="Profile YAML/JSON (default: unit times, no communication, M_B=1).")
JSON = typer.Option(False, "--json", help="Print machine-readable JSON instead of a table.")
QUIET = typer.Option(False, "--quiet", "-q", help="Print nothing but errors.")
RESERVE = typer.Option(f"{DEFAULT_RESERVE / GIB:g}GiB", "--reserve",
                       help="Memory per device kept free of stages and activations.")


def cli_errors(fn: Callable) -> Callable:
    """Turn zbsolve's errors into one line on stderr (never wrapped, markup in it shown as is) and the documented
    exit code: 2 for bad input, 1 for an invalid schedule, an infeasible problem or another failure; and an interrupt
    that no ``interruptible`` block answered (one while the command checks its options and inputs, say) into one line
    and 130 (143 after SIGTERM), never a traceback."""
    def fail(label: str, exc: Exception, code: int) -> typer.Exit:
        err.print(f"[red]{label}:[/red] {escape(' '.join(str(exc).split()))}", highlight=False, soft_wrap=True)
        return typer.Exit(code)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except InputError as exc:
            raise fail("error", exc, 2) from None
        except (ScheduleError, InfeasibleError) as exc:
            raise fail("invalid", exc, 1) from None
        except ZbsolveError as exc:
            raise fail("error", exc, 1) from None
        except KeyboardInterrupt:
            err.print(f"interrupted: zbsolve {fn.__name__} stopped before it finished", highlight=False, markup=False,
                      soft_wrap=True)
            raise typer.Exit(exit_code()) from None
    return wrapper


def read_profile(path: Optional[Path]) -> Profile:
    """The profile in ``path``, or unit times when none is given."""
    return UNIT if path is None else Profile.load(path, "--profile")


def device_count(devices: Optional[int], stages: Optional[int]) -> int:
    """The device count from ``--devices`` or its hidden other name ``--stages``."""
    if devices is None and stages is None:
        raise InputError("missing option --devices / -p: give the number of pipeline devices")
    if devices is not None and stages is not None and devices != stages:
        raise InputError(f"--devices {devices} and --stages {stages} differ: give --devices only")
    return devices if devices is not None else stages


def numbers(text: str, option: str) -> list[float]:
    """A comma-separated list of numbers."""
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"{option} = {text!r} must be comma-separated numbers") from None


@contextmanager
def interruptible(before: str, left: str = "nothing written") -> Iterator[None]:
    """SIGINT and SIGTERM stop the work inside as Ctrl-C does (the work keeps what it finished); an interrupt that
    escapes it came ``before`` any result existed: one line says so and what is ``left`` (``interrupted BEFORE:
    LEFT``), and the command exits 130 (143)."""
    with signals_as_interrupt():
        try:
            yield
        except KeyboardInterrupt:
            err.print(f"interrupted {before}: {left}", highlight=False, markup=False, soft_wrap=True)
            raise typer.Exit(exit_code()) from None


@contextmanager
def progress(description: str, quiet: bool, counted: bool = False) -> Iterator[Callable[..., None]]:
    """A transient progress line on stderr (none when ``quiet``, or when stderr is no terminal: a log file gets no
    stray empty line), and the callback that updates it: with a spinner and the work's last log line
    (``update(line)``), or ``counted``, a bar of the jobs done (``update(done, total)``)."""
    columns = ((TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()) if counted
               else (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                     TextColumn("{task.fields[line]}")))
    with Progress(*columns, console=err, transient=True, disable=quiet or not err.is_terminal) as bar:
        task = bar.add_task(description, total=None, line="")
        if counted:
            yield lambda done, total: bar.update(task, completed=done, total=total)
        else:
            yield lambda line: bar.update(task, line=line[:100])


SECONDS = ("value", "lower_bound", "step_time", "step_time_no_barrier", "makespan")
"""Figures in the profile's time unit, which is seconds for a model."""
RAW_MEMORY = ("peak_memory", "peak_memory_per_device")
"""Figures in the profile's memory unit, which the table of memory per device shows in GiB when it is bytes."""


def print_result(summary: dict[str, object], published: dict[str, float], costs: Optional[Costs],
                 title: str) -> None:
    """The figures table (times in seconds for a model, the status as ``status_text`` reads it), then memory per
    device in GiB with the layers each device holds when it is in bytes."""
    in_bytes = costs is not None and costs.in_bytes
    seconds = costs is not None and costs.model is not None
    shown = {(f"{key} (s)" if seconds and key in SECONDS else key): value for key, value in summary.items()
             if key != "bound_met" and not (in_bytes and key in (*PER_DEVICE, *LAYER_LABELS, *RAW_MEMORY))}
    if "bound_met" in summary:
        shown["status"] = status_text(str(summary["status"]), bool(summary["bound_met"]))
    out.print(figures_table({**shown, **{f"published {key}": value for key, value in published.items()}}, title))
    if in_bytes:
        wide.print(device_memory_table(summary, "memory per device"))
