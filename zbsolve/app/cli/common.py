"""What every command shares: the app, its consoles and options, the errors' exit codes, the interrupt and progress
helpers, and the figures table."""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console, ConsoleDimensions
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from zbsolve.base.errors import InfeasibleError, InputError, ScheduleError, ZbsolveError
from zbsolve.base.inputs import load_mapping
from zbsolve.base.interrupt import exit_code, signals_as_interrupt
from zbsolve.base.parallel import paused_for_pools
from zbsolve.core.measures import BUBBLES_NOTE
from zbsolve.core.profile import UNIT, Profile
from zbsolve.io.document import Loaded
from zbsolve.optimize.result import status_text
from zbsolve.present.figures import UNIT_PROFILE, UNKNOWN, Units, shown
from zbsolve.present.tables import LAYER_LABELS, PER_DEVICE, device_memory_table, figures_table
from zbsolve.problem.costs import Costs

app = typer.Typer(help="Find and check pipeline-parallel training schedules (zero bubble).",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
TABLE_WIDTH = 100
"""Columns the tables are laid out for: stdout's width where no terminal (and no COLUMNS) says one."""


class _Out(Console):
    """stdout as a console whose width, where COLUMNS is unset and no standard stream is a terminal (rich would take
    80), is ``TABLE_WIDTH``: a file or a pipe gets the tables as a 100-column terminal does."""

    def __init__(self) -> None:
        super().__init__()
        self._width = None  # COLUMNS is read at each table, not once at import

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        if self._width is None and "COLUMNS" not in os.environ and not any(_tty(fd) for fd in (0, 1, 2)):
            return ConsoleDimensions(TABLE_WIDTH, size.height)
        return size

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        self.width, self.height = new_size


def _tty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


out = _Out()
err = Console(stderr=True)
wide = Console(width=max(out.width, 180))
"""For tables with many columns, with ``--wide``: they fit 100 columns otherwise."""

def _shared(*flags: str, **fixed: Any) -> Callable[..., Any]:
    """An option several commands take, its ``flags`` (and ``fixed`` settings) declared here once: each command
    gives its default and its help (``option(default, help, **settings)``)."""
    def option(default: Any, help: str, **settings: Any) -> Any:
        return typer.Option(default, *flags, help=help, **{**fixed, **settings})
    return option


devices_option = _shared("--devices", "-p", min=1)
microbatches_option = _shared("--microbatches", "-m", min=1)
time_limit_option = _shared("--time-limit")
jobs_option = _shared("--jobs", "-j")
executor_option = _shared("--executor")
target_option = _shared("--target")
output_option = _shared("--output", "-o")
chart_option = _shared("--chart")

DEVICES = devices_option(None, "Number of pipeline devices p (required).", show_default=False)
DEVICES_ALIAS = typer.Option(None, "--stages", min=1, hidden=True, help="Another name of --devices.")
MICROBATCHES = microbatches_option(..., "Number of microbatches m.")
PROFILE = typer.Option(None, "--profile", help="Profile YAML/JSON (default: unit times, no communication, M_B=1).")
JSON = typer.Option(False, "--json", help="Print machine-readable JSON instead of a table.")
WIDE = typer.Option(False, "--wide", help="Print the tables whole, every column, over 100 columns wide.")
QUIET = typer.Option(False, "--quiet", "-q", help="Print nothing but errors.")
CONFIG = typer.Argument(..., metavar="CONFIG", help="Hugging Face config.json of the model.")
SCHEDULE_OUTPUT = output_option(None, "Write the schedule document (JSON).")
GANTT_CHART = chart_option(None, "Write a Gantt chart (.png or .svg).")


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


REFRESH_SECONDS = 0.25
"""How often a progress line is redrawn (its spinner and elapsed time)."""


class _Redraw:
    """Redraws a progress display every ``REFRESH_SECONDS`` in a thread of its own, stopped while a pool of
    processes starts (``paused``), so that its workers fork."""

    def __init__(self, bar: Progress) -> None:
        self.bar, self.done, self.thread = bar, threading.Event(), threading.Thread()

    def start(self) -> None:
        """Redraw until stopped."""
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="progress", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        """Stop redrawing, the thread ended."""
        self.done.set()
        self.thread.join()

    @contextmanager
    def paused(self) -> Iterator[None]:
        """No redrawing inside."""
        self.stop()
        try:
            yield
        finally:
            self.start()

    def _run(self) -> None:
        while not self.done.wait(REFRESH_SECONDS):
            self.bar.refresh()


@contextmanager
def progress(description: str, quiet: bool, counted: bool = False) -> Iterator[Callable[..., None]]:
    """A transient progress line on stderr (none when ``quiet``, or when stderr is no terminal: a log file gets no
    stray empty line), and the callback that updates it: with a spinner and the work's last log line
    (``update(line)``), or ``counted``, a bar of the jobs done (``update(done, total)``). Its redrawing stops while
    a pool of processes starts (``paused_for_pools``)."""
    columns = ((TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()) if counted
               else (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                     TextColumn("{task.fields[line]}")))
    disabled = quiet or not err.is_terminal
    with Progress(*columns, console=err, transient=True, disable=disabled, auto_refresh=False) as bar:
        task = bar.add_task(description, total=None, line="")
        redraw = _Redraw(bar)
        if not disabled:
            redraw.start()
        try:
            with paused_for_pools(redraw.paused) if not disabled else nullcontext():
                if counted:
                    yield lambda done, total: bar.update(task, completed=done, total=total)
                else:
                    yield lambda line: bar.update(task, line=line[:100])
        finally:
            if not disabled:
                redraw.stop()


RAW_MEMORY = ("peak_memory", "peak_memory_per_device")
"""Figures in the profile's memory unit, which the table of memory per device shows in GiB when it is bytes."""


def file_units(path: Optional[Path]) -> Units:
    """The units of the profile in the file at ``path`` as its top-level ``time_unit`` and ``memory_unit`` state them
    (a problem file, or a profile under a ``profile:`` key); the unit profile's when ``path`` is None."""
    if path is None:
        return UNIT_PROFILE
    data = load_mapping(path)
    return Units.of(None, str(data.get("time_unit") or ""), str(data.get("memory_unit") or ""))


def unit_keys(units: Units) -> dict[str, str]:
    """What a schedule document states of its profile's units, as a problem file does (``time_unit``,
    ``memory_unit``), those known: none of memory where its figures are bytes (shown in GiB)."""
    stated = {"time_unit": units.time, "memory_unit": "" if units.in_bytes else units.memory}
    return {key: value for key, value in stated.items() if value and value != UNKNOWN}


def document_units(loaded: Loaded) -> Units:
    """The units of a schedule document's figures: seconds and GiB where its costs are a model's or in bytes, else
    as its ``time_unit`` and ``memory_unit`` state them (``unit_keys``), "profile's unit" where it states none."""
    data = loaded.data
    return Units.of(loaded.costs, str(data.get("time_unit") or ""), str(data.get("memory_unit") or ""))


def print_result(summary: dict[str, object], costs: Optional[Costs], title: str, *, units: Optional[Units] = None,
                 extra: Optional[Mapping[str, object]] = None, note: Optional[str] = None) -> None:
    """The figures table (each figure under its name with its unit, ``present.figures``: ``units``, default the
    costs'; the status as ``status_text`` reads it; ``extra`` rows after the figures; what tells the bubbles apart
    and ``note`` under it), then memory per device in GiB with the layers each device holds when it is in bytes."""
    in_bytes = costs is not None and costs.in_bytes
    figures = {key: value for key, value in summary.items()
               if not (in_bytes and key in (*PER_DEVICE, *LAYER_LABELS, *RAW_MEMORY))}
    if "bound_met" in summary:
        figures["status"] = status_text(str(summary["status"]), bool(summary["bound_met"]))
    rows = shown(figures, units or Units.of(costs))
    notes = [BUBBLES_NOTE] if "paper_bubble" in summary and "bubble_rate" in summary else []
    out.print(figures_table({**rows, **(extra or {})}, title, "\n".join(notes + ([note] if note else [])) or None))
    if in_bytes:
        out.print(device_memory_table(summary, "memory per device"))
