"""The calibration table: every published run of ``problems/calibration/`` predicted with
``zbsolve predict`` (``configure.predict``) and held against its measured tokens/s/GPU, then the targets printed met
or missed.

- One row per run: its parallelism, dtype, measured and predicted tokens/s/GPU, predicted/measured, |ratio - 1| and
  whether it is within ``WITHIN``; below the table, the ``zbsolve predict`` command that reproduces each row, and
  what the configuration had to assume. A run predict cannot take (no config it reads, a recomputation or a degree
  it does not model) is a row with the reason, counted as a miss.
- Runs marked ``held_back: true`` are a table of their own and never enter the targets' statistics; runs marked
  ``scored: false`` are records only, listed and not scored.
- Targets: the median |ratio - 1| over the scored pipeline-parallel runs at most ``MEDIAN`` (a run without a
  prediction counts as an infinite error), every scored run within ``WITHIN``; and for each published pair of 1F1B
  against Interleaved1F1B on the same model and GPUs (``schedule.pair``), the predicted ratio of their step times
  within ``PAIR`` of the measured one.

Each prediction is one simulation (the slowest, p = 8, v = 4, m = 128, MoE, about 2 s); the leave-one-out fits
(one full fit per fitted run without it, ``calibrate.leave_one_out``) take about a minute over two processes.

Run: .venv/bin/python benchmarks/calibration.py [--only TEXT] [--json out.json] [--jobs N] [--refit]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

from zbsolve.base.errors import InputError
from zbsolve.configure.calibrate import Fit, leave_one_out, read_fit
from zbsolve.configure.measured_runs import (
    GPUS,
    SCHEDULES,
    SUBSTITUTES,
    Mapped,
    mapped,
    read_run,
    recompute_choice,
    runtime,
)
from zbsolve.configure.predict import Configuration, predict
from zbsolve.costmodel.calibration import FITTED, TERMS, Calibration

__all__ = ["GPUS", "SCHEDULES", "SUBSTITUTES", "Configuration", "Mapped", "mapped", "recompute_choice"]

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "problems" / "calibration"
MEDIAN = 0.10
"""Largest median leave-one-out |predicted/measured - 1| over the scored runs."""
WITHIN = 0.25
"""Largest leave-one-out |predicted/measured - 1| of any scored run."""
PAIR = 0.10
"""Largest |predicted ratio / measured ratio - 1| of an interleaving pair's step times."""
MEMORY_MEDIAN = 0.10
"""Largest median |predicted/measured - 1| of the published peak memories."""
RANKED = 0.10
"""Published alternatives whose measured figures differ by more than this must be predicted in the measured order."""


@dataclass(frozen=True)
class Row:
    """One run's line of the table: its figures as stated (no calibration), under its shipped calibration, and
    left out (predicted by the calibration fitted without it): the last is the one the targets judge."""

    name: str
    """The file's stem."""
    parallelism: str
    """GPUs and TP/PP/VP/CP/EP (and FSDP)."""
    dtype: str
    """bf16 or fp8."""
    pipeline: bool
    """Whether the run is pipeline parallel (pp > 1)."""
    held_back: bool
    """Reported apart, never in the targets."""
    scored: bool
    """False for a record kept only for traceability (``scored: false``)."""
    measured: float
    """Published tokens/s/GPU."""
    predicted: float | None
    """Leave-one-out tokens/s/GPU (None: ``reason``)."""
    step_time_s: float | None
    """Leave-one-out seconds of a step."""
    command: str | None
    """The ``zbsolve predict`` command line that reproduces the row (with ``--calibration`` where one applies)."""
    reason: str | None = None
    """Why there is no prediction."""
    notes: tuple[str, ...] = ()
    """What the configuration assumed."""
    fits: bool | None = None
    """Whether the leave-one-out prediction fits the preset's memory."""
    seconds: float = 0.0
    """Wall-clock seconds of the predictions."""
    stated: float | None = None
    """Tokens/s/GPU without a calibration."""
    calibrated: float | None = None
    """Tokens/s/GPU under the shipped calibration of its GPU and runtime."""
    group: str | None = None
    """Its GPU preset and runtime (the shipped calibration's name)."""
    model: str = ""
    """The model's name (alternatives share it)."""
    cluster: str = ""
    """GPU, GPU count, sequence and global batch: what alternatives share."""
    measured_memory_gib: float | None = None
    """Published peak memory per device, GiB."""
    predicted_memory_gib: float | None = None
    """Leave-one-out peak memory of the fullest device, GiB."""

    @property
    def ratio(self) -> float | None:
        """predicted / measured (None without a prediction)."""
        return None if self.predicted is None else self.predicted / self.measured

    @property
    def error(self) -> float:
        """|ratio - 1|, infinite without a prediction."""
        return math.inf if self.ratio is None else abs(self.ratio - 1)

    @property
    def within(self) -> bool:
        """Whether the prediction is within ``WITHIN`` of the measurement."""
        return self.error <= WITHIN

    @property
    def memory_error(self) -> float | None:
        """|predicted / measured - 1| of the peak memory (None where either is missing)."""
        if self.measured_memory_gib is None or self.predicted_memory_gib is None:
            return None
        return abs(self.predicted_memory_gib / self.measured_memory_gib - 1)


def load(path: Path) -> dict:
    """One calibration file."""
    return yaml.safe_load(path.read_text())


def runs(only: str | None = None) -> list[dict]:
    """The calibration files, by name, those whose name holds ``only`` where given."""
    loaded = [load(path) for path in sorted(RUNS.glob("*.yaml"))]
    return [run for run in loaded if only is None or only in run["name"]]


def shipped_fits() -> dict[str, Fit]:
    """The shipped calibrations' fits, by name (``GPU-runtime``)."""
    return {path.stem: read_fit(load(path), str(path)) for path in sorted(FITTED.glob("*.yaml"))}


def parallelism(run: dict) -> str:
    """GPUs and TP/PP/VP/CP/EP of a run, with its FSDP group."""
    par = run["parallelism"]
    text = f"{run['hardware']['gpus']} GPUs {par['tp']}/{par['pp']}/{par['vp'] or '-'}/{par['cp']}/{par['ep']}"
    return text + (f" FSDP{par['fsdp']}" if par.get("fsdp") else "")


def left_out(fits: dict[str, Fit], names: set[str] | None = None, jobs: int = 2,
             say: Callable[[str], None] | None = None) -> dict[str, Calibration]:
    """Each fitted run's leave-one-out calibration (``calibrate.leave_one_out``: its shipped fit's terms fitted
    again over the fit's other runs), for the runs of ``names`` (default: every fitted run)."""
    found: dict[str, Calibration] = {}
    for group, f in fits.items():
        wanted = [r.name for r in f.runs if names is None or r.name in names]
        if not wanted:
            continue
        runs = [read_run(RUNS / f"{r.name}.yaml") for r in f.runs]
        began = time.monotonic()
        loo = leave_one_out(runs, f, say, jobs=jobs)
        found |= {n: loo[n] for n in wanted if n in loo}
        if say:
            say(f"{group}: {len(loo)} leave-one-out fits in {time.monotonic() - began:.0f} s")
    return found


def row(run: dict, fits: dict[str, Fit] | None = None, loo: dict[str, Calibration] | None = None) -> Row:
    """The table's line of ``run``: predicted as stated, under its shipped calibration, and left out of it
    (``loo``: each fitted run's calibration fitted without it, ``left_out``; a run its fit did not see takes the
    fit's own), where it maps to a configuration predict takes."""
    group = f"{GPUS.get(run['hardware']['gpu'], run['hardware']['gpu'])}-{runtime(run)}"
    memory = run["measured"].get("peak_memory_gib")
    base = dict(name=run["name"], parallelism=parallelism(run), dtype=run["precision"]["dtype"],
                pipeline=run["parallelism"]["pp"] > 1, held_back=run["held_back"], scored=run["scored"],
                measured=float(run["measured"]["tokens_per_s_per_gpu"]), group=group, model=run["model"]["name"],
                cluster=f"{run['hardware']['gpus']} x {run['hardware']['gpu']}, seq {run['batch']['seq_len']}, "
                        f"global batch {run['batch']['global_batch_size']}",
                measured_memory_gib=None if memory is None else float(memory))
    if not run["scored"]:
        return Row(**base, predicted=None, step_time_s=None, command=None,
                   reason="record only (scored: false): not predicted, not scored")
    m = mapped(run)
    if m.configuration is None:
        return Row(**base, predicted=None, step_time_s=None, command=None, reason=m.reason)
    fit = (fits or {}).get(group)
    c = m.configuration.replace(config=ROOT / m.configuration.config)
    shown = m.configuration.replace(calibration=group) if fit else m.configuration
    began = time.monotonic()
    try:
        stated = predict(c.replace(calibration=None))
        calibrated = predict(c.replace(calibration=fit.calibration)) if fit else stated
        left = (loo or {}).get(run["name"], fit.calibration) if fit else Calibration()
        p = predict(c.replace(calibration=left)) if fit else stated
    except InputError as error:
        return Row(**base, predicted=None, step_time_s=None, command=shown.command(), reason=str(error),
                   notes=m.notes, seconds=time.monotonic() - began)
    return Row(**base, predicted=p.tokens_per_s_per_gpu, step_time_s=p.step_time_s, command=shown.command(),
               notes=m.notes, fits=p.fits, seconds=time.monotonic() - began, stated=stated.tokens_per_s_per_gpu,
               calibrated=calibrated.tokens_per_s_per_gpu, predicted_memory_gib=max(p.peak_memory_gib))


def median_error(rows: list[Row]) -> float | None:
    """Median |ratio - 1| of ``rows``, a row without a prediction counting as infinite; None for no rows."""
    return statistics.median(r.error for r in rows) if rows else None


def pairs(rows: list[Row], files: list[dict]) -> list[dict]:
    """Each published 1F1B / Interleaved1F1B pair (``schedule.pair``) with both halves in ``rows``: the measured and
    predicted ratio of their step times (1F1B's over Interleaved1F1B's) and whether they agree within ``PAIR``."""
    by_name = {r.name: r for r in rows}
    found = []
    for run in files:
        other = (run.get("schedule") or {}).get("pair")
        if not other or run["schedule"]["name"] != "1f1b" or other not in by_name:
            continue
        plain, interleaved = by_name[run["name"]], by_name[other]
        measured = interleaved.measured / plain.measured
        predicted = (plain.step_time_s / interleaved.step_time_s
                     if plain.step_time_s is not None and interleaved.step_time_s is not None else None)
        reason = None if predicted is not None else plain.reason or interleaved.reason
        found.append({"pair": f"{plain.name} / {interleaved.name}", "measured": measured, "predicted": predicted,
                      "met": predicted is not None and abs(predicted / measured - 1) <= PAIR, "reason": reason})
    return found


def ranking(rows: list[Row]) -> list[dict]:
    """Every pair of published alternatives (same model and cluster: ``Row.cluster``) whose measured tokens/s/GPU
    differ by more than ``RANKED``: whether the leave-one-out predictions order them as measured."""
    found = []
    for i, first in enumerate(rows):
        for second in rows[i + 1:]:
            if (first.model, first.cluster) != (second.model, second.cluster) or not (first.scored and second.scored):
                continue
            fast, slow = (first, second) if first.measured >= second.measured else (second, first)
            if fast.measured / slow.measured - 1 <= RANKED:
                continue
            met = fast.predicted is not None and slow.predicted is not None and fast.predicted > slow.predicted
            found.append({"pair": f"{fast.name} > {slow.name}", "measured": fast.measured / slow.measured,
                          "predicted": None if not met and (fast.predicted is None or slow.predicted is None)
                          else fast.predicted / slow.predicted, "met": met,
                          "held_back": fast.held_back or slow.held_back})
    return found


def targets(rows: list[Row], found: list[dict], ranked: list[dict] | None = None) -> list[dict]:
    """The targets over the scored rows that are not held back (leave-one-out figures), met or missed: time, the
    interleaving pairs, memory and the ranking of alternatives."""
    scored = [r for r in rows if r.scored and not r.held_back]
    median = median_error(scored)
    predicted = median_error([r for r in scored if r.ratio is not None])
    misses = [r.name for r in scored if not r.within]
    result = [{"target": f"time: leave-one-out median |pred/meas - 1| <= {MEDIAN:.0%} over the {len(scored)} scored "
                         f"runs ({sum(r.ratio is None for r in scored)} unpredicted, counted as misses)",
               "value": None if median is None or math.isinf(median) else median,
               "met": median is not None and median <= MEDIAN,
               "detail": f"median {fmt_pct(median)}; over the predicted ones alone {fmt_pct(predicted)}"},
              {"target": f"time: every scored run within {WITHIN:.0%} ({len(scored)} runs)",
               "value": len(scored) - len(misses), "met": not misses and bool(scored),
               "detail": f"{len(scored) - len(misses)} within; missed: {', '.join(misses) or 'none'}"}]
    for pair in found:
        result.append({"target": f"interleaving: predicted 1F1B/Interleaved1F1B step ratio within {PAIR:.0%} of the "
                                 f"measured {pair['measured']:.3f} ({pair['pair']})",
                       "value": pair["predicted"], "met": pair["met"],
                       "detail": pair["reason"] or f"predicted {pair['predicted']:.3f}, "
                                                   f"{pair['predicted'] / pair['measured']:.3f} of the measured"})
    memories = [r for r in scored if r.measured_memory_gib is not None]
    errors = [e if (e := r.memory_error) is not None else math.inf for r in memories]
    if memories:
        middle = statistics.median(errors)
        result += [{"target": f"memory: median |pred/meas - 1| <= {MEMORY_MEDIAN:.0%} over the {len(memories)} "
                              "published peaks", "value": middle, "met": middle <= MEMORY_MEDIAN,
                    "detail": f"median {fmt_pct(middle)}"},
                   {"target": f"memory: every published peak within {WITHIN:.0%}",
                    "value": sum(e <= WITHIN for e in errors), "met": all(e <= WITHIN for e in errors),
                    "detail": f"missed: {', '.join(r.name for r, e in zip(memories, errors) if e > WITHIN) or 'none'}"}]
    refused = [r.name for r in scored if r.fits is False]
    unknown = [r.name for r in scored if r.fits is None]
    result.append({"target": "memory: every scored configuration predicted to fit the GPU it ran on",
                   "value": len(refused), "met": not refused and not unknown,
                   "detail": f"predicted not to fit: {', '.join(refused) or 'none'}"
                             + (f"; not predicted: {', '.join(unknown)}" if unknown else "")})
    kept = [pair for pair in ranked or [] if not pair["held_back"]]
    if kept:
        wrong = [pair["pair"] for pair in kept if not pair["met"]]
        result.append({"target": f"ranking: every pair of published alternatives more than {RANKED:.0%} apart in "
                                 f"the measured order ({len(kept)} pairs)", "value": len(kept) - len(wrong),
                       "met": not wrong, "detail": f"out of order: {'; '.join(wrong) or 'none'}"})
    return result


def fmt_pct(value: float | None) -> str:
    """A share as a percentage ("-" for None, "inf" for an infinite one)."""
    return "-" if value is None else "inf" if math.isinf(value) else f"{100 * value:.1f}%"


def print_rows(console: Console, rows: list[Row], title: str) -> None:
    """The table of ``rows`` (tokens/s/GPU as stated, under the shipped calibration and left out; memory), then
    each row's command and notes."""
    table = Table(title=title)
    for column in ("#", "run", "parallelism", "dtype", "measured", "stated", "shipped", "left out", "LOO/meas",
                   f"within {WITHIN:.0%}", "GiB meas", "GiB LOO", "note"):
        table.add_column(column, overflow="fold")
    for i, r in enumerate(rows, 1):
        within = "not scored" if not r.scored else "yes" if r.within else "MISS"
        note = r.reason or ("" if r.fits is None or r.fits else "does not fit the preset's memory")
        table.add_row(str(i), r.name, r.parallelism, r.dtype, f"{r.measured:,.1f}", _figure(r.stated),
                      _figure(r.calibrated), _figure(r.predicted), "-" if r.ratio is None else f"{r.ratio:.3f}",
                      within, _figure(r.measured_memory_gib), _figure(r.predicted_memory_gib), note)
    console.print(table)
    for i, r in enumerate(rows, 1):
        if r.command is not None:
            console.print(f"{i}. {r.command}", markup=False, highlight=False, soft_wrap=True)
        for note in r.notes:
            console.print(f"   assumed: {note}", markup=False, highlight=False, soft_wrap=True)


def _figure(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def refit(files: list[dict], console: Console) -> None:
    """Fit each GPU-and-runtime group's shipped calibration (``FITTED``) on its scored runs that are not held back,
    where they are at least as many as the terms (``TERMS``), as ``zbsolve calibrate`` does (the procedure of
    docs/cost-model.md, "Calibration")."""
    import datetime

    from zbsolve import __version__
    from zbsolve.configure.calibrate import document, fit
    from zbsolve.configure.measured_runs import read_run

    groups: dict[str, list[Path]] = {}
    for run in files:
        path = RUNS / f"{run['name']}.yaml"
        if run["scored"] and not run["held_back"] and mapped(run).configuration is not None:
            groups.setdefault(read_run(path).group, []).append(path)
    FITTED.mkdir(exist_ok=True)
    for group, paths in sorted(groups.items()):
        if len(paths) < len(TERMS):
            console.print(f"not refit {group}: {len(paths)} runs, fewer than the {len(TERMS)} terms a fit moves",
                          highlight=False)
            continue
        out = FITTED / f"{group}.yaml"
        result = fit([read_run(path) for path in paths])
        words = ["zbsolve", "calibrate", *(str(p.relative_to(ROOT)) for p in paths), "-o", str(out.relative_to(ROOT))]
        out.write_text(yaml.safe_dump(document(result, " ".join(words), __version__,
                                               datetime.date.today().isoformat()), sort_keys=False, width=120))
        console.print(f"refit {group}: " + ", ".join(f"{n} x{m:.3f}" for n, m in result.multipliers.items()),
                      highlight=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=None, help="only the runs whose file name holds this text")
    parser.add_argument("--json", type=Path, default=None, help="write the rows and targets as JSON here")
    parser.add_argument("--refit", action="store_true", help="fit the shipped calibrations again first (minutes)")
    parser.add_argument("--jobs", type=int, default=2, help="processes for the leave-one-out fits (default 2)")
    args = parser.parse_args()
    console = Console(width=200)
    files = runs(args.only)
    began = time.monotonic()
    if args.refit:
        refit(runs(), console)
    fits = shipped_fits()
    loo = left_out(fits, {run["name"] for run in files}, args.jobs,
                   lambda line: console.print(line, highlight=False, markup=False))
    rows = [row(run, fits, loo) for run in files]
    fitted = [r for r in rows if not r.held_back]
    held = [r for r in rows if r.held_back]
    print_rows(console, fitted, "Published runs against zbsolve predict (tokens/s/GPU: as stated, under the "
                                "shipped calibration, left out of it)")
    if held:
        print_rows(console, held, "Held-back runs (never fitted to, outside the targets)")
        console.print(f"held back: median |ratio - 1| {fmt_pct(median_error(held))}, "
                      f"{sum(r.within for r in held)} of {len(held)} within {WITHIN:.0%}", highlight=False)
    for name, f in fits.items():
        console.print(f"shipped calibration {name}: " + ", ".join(f"{n} x{m:.3f}" for n, m in f.multipliers.items())
                      + f" (fitted on {len(f.runs)} runs)", highlight=False)
    found = pairs(rows, files)
    ranked = ranking(rows)
    for pair in ranked:
        console.print(f"ranking{' (held back)' if pair['held_back'] else ''}: {pair['pair']}: measured "
                      f"{pair['measured']:.3f}x, predicted "
                      f"{'-' if pair['predicted'] is None else format(pair['predicted'], '.3f') + 'x'} "
                      f"{'in order' if pair['met'] else 'OUT OF ORDER'}", highlight=False, markup=False)
    result = targets(rows, found, ranked)
    for t in result:
        console.print(f"{'met   ' if t['met'] else 'MISSED'} {t['target']}: {t['detail']}", markup=False,
                      highlight=False, soft_wrap=True)
    if not found:
        console.print("interleaving: no published 1F1B / Interleaved1F1B pair among the runs selected",
                      highlight=False)
    console.print(f"{len(rows)} runs in {time.monotonic() - began:.1f} s "
                  f"(slowest row {max((r.seconds for r in rows), default=0):.1f} s)", highlight=False)
    if args.json:
        records = [{**asdict(r), "ratio": r.ratio, "error": None if r.ratio is None else r.error} for r in rows]
        args.json.write_text(json.dumps({"rows": records, "pairs": found, "ranking": ranked, "targets": result},
                                        indent=1, default=str))


if __name__ == "__main__":
    main()
