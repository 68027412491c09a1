"""What a new user meets first, as targets printed met or missed: one row per target, what was measured and the
figure it is held to.

- A timed V-shape solve of the unit profile at p = 32, m = 256 and half of 1F1B's memory, with a time limit of 1 s:
  its makespan at most V-Min's (the family it can build: every family of the placement that fits is built before any
  look at the clock, ``optimize.warm_start.floor``).

- Zero tracebacks over the fuzzer's inputs: ``tests/test_fuzz_inputs.py``'s strategies over ``predict``'s and
  ``configure``'s options and the Python entry points, run with ``FUZZ_EXAMPLES`` examples each (the slow ones
  fewer), every command exiting 0, 1 or 2 with no traceback and every function returning or raising an
  ``InputError``.

Run: .venv/bin/python benchmarks/first_contact.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from rich.console import Console
from rich.table import Table

from zbsolve.core.profile import UNIT
from zbsolve.core.simulator import simulate
from zbsolve.optimize.solve import solve
from zbsolve.problem.memory_factor import reference_peak
from zbsolve.schedulers.families import make_schedule


@dataclass(frozen=True)
class Row:
    """One target: what it asks, what was measured, what it is held to, and whether it was met."""

    target: str
    measured: str
    held_to: str
    met: bool
    seconds: float


def vshape_solve() -> Row:
    """A 1 s V-shape solve at p = 32, m = 256 and half of 1F1B's memory against V-Min's makespan."""
    p, m = 32, 256
    limit = 0.5 * reference_peak(UNIT, p, m)
    v_min = simulate(make_schedule("v-min", UNIT, p, m)).objective("makespan")
    began = time.monotonic()
    result = solve(UNIT, limit, num_microbatches=m, num_devices=p, placement="vshape", time_limit=1)
    return Row("1 s V-shape solve at p=32, m=256, half memory: <= V-Min's makespan",
               f"{result.objective:g} ({result.schedule.name})", f"{v_min:g} (v-min)", result.objective <= v_min,
               time.monotonic() - began)


FUZZ_EXAMPLES = 100
"""Examples drawn for each fast entry point (a search's: a tenth)."""


def fuzzed() -> Row:
    """The fuzzer's strategies (``tests/test_fuzz_inputs.CHECKS``) with more examples: how many inputs ended in a
    traceback (a command's) or an exception other than an ``InputError`` (a function's)."""
    import sys
    from pathlib import Path

    from hypothesis import HealthCheck, given, settings

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from test_fuzz_inputs import CHECKS, EXAMPLES, FEW

    began = time.monotonic()
    runs, failures = 0, []

    def counted(check: Callable[[dict], None]) -> Callable[[dict], None]:
        def run(knobs: dict) -> None:
            nonlocal runs
            runs += 1
            try:
                check(knobs)
            except Exception as exc:  # noqa: BLE001 (what the row counts)
                failures.append(f"{check.__name__}({knobs}): {type(exc).__name__}: {str(exc)[:200]}")
        return run

    for name, (check, strategy) in CHECKS.items():
        examples = FUZZ_EXAMPLES * EXAMPLES.get(name, FEW) // FEW if name in EXAMPLES else FUZZ_EXAMPLES
        settings(max_examples=max(examples, 1), deadline=None, database=None,
                 suppress_health_check=list(HealthCheck))(given(strategy)(counted(check)))()
    for failure in failures[:5]:
        print(failure)
    return Row(f"zero tracebacks over the fuzzer's inputs ({len(CHECKS)} entry points)",
               f"{len(failures)} of {runs} inputs", "0", not failures, time.monotonic() - began)


TARGETS: tuple[Callable[[], Row], ...] = (vshape_solve, fuzzed)
"""Each target's measurement, in the order printed."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the rows to this file too")
    args = parser.parse_args()
    rows = [target() for target in TARGETS]
    table = Table(title="first contact: targets")
    for column in ("target", "measured", "held to", "met", "seconds"):
        table.add_column(column)
    for row in rows:
        table.add_row(row.target, row.measured, row.held_to, "met" if row.met else "MISSED", f"{row.seconds:.1f}")
    Console().print(table)
    print(f"{sum(row.met for row in rows)} of {len(rows)} targets met")
    if args.json:
        with open(args.json, "w") as out:
            json.dump([asdict(row) for row in rows], out, indent=2)


if __name__ == "__main__":
    main()
