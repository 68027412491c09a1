"""The memory table: every run of ``problems/calibration/`` that publishes its peak memory
(``measured.peak_memory_gib``) predicted with ``zbsolve predict`` (``configure.predict``, configured as
``benchmarks/calibration.py`` maps the file) and its largest device's peak held against the published one. The
model is taken as stated (``--calibration none``): the shipped calibrations were fitted to these peaks, and
``benchmarks/calibration.py`` gives the figures under them and left out of them.

One row per run: published and predicted peak GiB, predicted/published, and whether the configuration is predicted
to fit the memory of the GPU it ran on (``MEMORY``: the 96 GB H100 of torchtitan's benchmarks has no preset).
Targets, printed met or missed: the median |ratio - 1| at most ``MEDIAN``, every run within ``WITHIN``, every
published configuration predicted to fit.

Run: .venv/bin/python benchmarks/memory.py [--only TEXT]
"""

from __future__ import annotations

import argparse
import statistics

from benchmarks.calibration import ROOT, mapped, runs
from zbsolve.base.errors import InputError
from zbsolve.base.units import GIB
from zbsolve.configure.predict import predict

MEDIAN = 0.10
"""Largest median |predicted/published - 1|."""
WITHIN = 0.25
"""Largest |predicted/published - 1| of any run."""
MEMORY = {"h100-hbm2e-96gb-500w": 96 * GIB}
"""Device memory of the calibration GPUs whose preset's is not theirs, bytes."""


def rows(only: str | None = None) -> list[tuple[str, float, float | None, bool | None, str]]:
    """Per run with a published peak: its name, the published and predicted peak GiB, whether it is predicted to
    fit, and why it has no prediction (empty where it has one)."""
    found = []
    for run in runs(only):
        published = (run.get("measured") or {}).get("peak_memory_gib")
        if published is None:
            continue
        m = mapped(run)
        if m.configuration is None:
            found.append((run["name"], published, None, None, m.reason or ""))
            continue
        c = m.configuration.replace(config=ROOT / m.configuration.config,
                                    device_memory=MEMORY.get(run["hardware"]["gpu"]), calibration=None)
        try:
            p = predict(c)
        except InputError as error:
            found.append((run["name"], published, None, None, str(error)))
            continue
        found.append((run["name"], published, max(p.peak_memory_gib), p.fits, ""))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="runs whose name holds this text")
    table = rows(parser.parse_args().only)
    print(f"{'run':52} {'published':>9} {'predicted':>9} {'ratio':>6} fits")
    errors = []
    for name, published, predicted, fits, reason in table:
        if predicted is None:
            print(f"{name:52} {published:9.1f} {'-':>9} {'-':>6} -    {reason}")
            errors.append(float("inf"))
            continue
        errors.append(abs(predicted / published - 1))
        print(f"{name:52} {published:9.1f} {predicted:9.1f} {predicted / published:6.2f} {fits}")
    median = statistics.median(errors) if errors else float("inf")
    print(f"median |ratio - 1| {median:.2f} <= {MEDIAN}: {'met' if median <= MEDIAN else 'missed'}")
    worst = max(errors, default=float("inf"))
    print(f"every run within {WITHIN}: {'met' if worst <= WITHIN else 'missed'} (worst {worst:.2f})")
    fit = all(fits for *_, fits, _ in table)
    print(f"every published configuration predicted to fit: {'met' if fit else 'missed'}")


if __name__ == "__main__":
    main()
