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

Each prediction is one simulation: all 21 runs take about 5 s on one core, the slowest (p = 8, v = 4, m = 128, MoE)
about 2 s.

Run: .venv/bin/python benchmarks/calibration.py [--only TEXT] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

from zbsolve.base.errors import InputError
from zbsolve.configure.predict import Configuration, predict
from zbsolve.costmodel.model import RECOMPUTE_MODULES
from zbsolve.schedulers.builtins import COMBINED, megatron_builtin

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "problems" / "calibration"
MEDIAN = 0.10
"""Largest median |predicted/measured - 1| over the scored pipeline-parallel runs."""
WITHIN = 0.25
"""Largest |predicted/measured - 1| of any scored run."""
PAIR = 0.10
"""Largest |predicted ratio / measured ratio - 1| of an interleaving pair's step times."""
GPUS = {"h100-sxm-80gb": "h100", "h100-hbm2e-96gb-500w": "h100", "h200-sxm-141gb": "h200"}
"""The preset each calibration GPU is predicted with."""
SUBSTITUTES = {"h100-hbm2e-96gb-500w": "no preset for the H100 96 GB HBM2e at 500 W: the h100 (SXM 80 GB, 700 W) "
                                       "preset's peaks and memory"}
"""What a preset stands in for where it is not the run's GPU."""
SCHEDULES = {"1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B", "interleaved-1f1b-combined": COMBINED}
"""predict's order for each calibration schedule name (``none (...)``: no pipeline, predict's default)."""


@dataclass(frozen=True)
class Mapped:
    """A calibration file as ``zbsolve predict`` takes it."""

    configuration: Configuration | None
    """The configuration (None: ``reason``); its config path relative to the repository."""
    reason: str | None
    """Why the file has no configuration."""
    notes: tuple[str, ...] = ()
    """What the configuration assumes where the file leaves it open or predict has no flag for it."""


@dataclass(frozen=True)
class Row:
    """One run's line of the table."""

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
    """Predicted tokens/s/GPU (None: ``reason``)."""
    step_time_s: float | None
    """Predicted seconds of a step."""
    command: str | None
    """The ``zbsolve predict`` command line that reproduces the row."""
    reason: str | None = None
    """Why there is no prediction."""
    notes: tuple[str, ...] = ()
    """What the configuration assumed."""
    fits: bool | None = None
    """Whether the prediction fits the preset's memory."""
    seconds: float = 0.0
    """Wall-clock seconds of the prediction."""

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


def load(path: Path) -> dict:
    """One calibration file."""
    return yaml.safe_load(path.read_text())


def runs(only: str | None = None) -> list[dict]:
    """The calibration files, by name, those whose name holds ``only`` where given."""
    loaded = [load(path) for path in sorted(RUNS.glob("*.yaml"))]
    return [run for run in loaded if only is None or only in run["name"]]


def recompute_choice(recompute: dict) -> str | InputError:
    """The recomputation of a file in ``problem.recompute``'s grammar, or why it has none."""
    granularity, modules, method = recompute["granularity"], recompute.get("modules"), recompute.get("method")
    if granularity == "none":
        return "none"
    if granularity == "full":
        if method == "block":
            return f"uniform:{recompute['num_layers']}"
        return "full"
    if granularity == "selective" and modules:
        unknown = [name for name in modules if name not in RECOMPUTE_MODULES]
        if unknown:
            return InputError(f"recompute module {unknown[0]!r} is not one of Megatron-LM's that zbsolve models")
        return "modules:" + ",".join(modules)
    if granularity == "selective":
        return InputError(f"recompute: {method or 'a selective policy without modules'} has no form in "
                          "problem/recompute.py (its selective form is Megatron's norms and activation)")
    return InputError("recompute granularity not published (unknown)")


def mapped(run: dict) -> Mapped:
    """The ``zbsolve predict`` configuration of calibration file ``run``, or the reason it has none."""
    if run["model"]["config"] is None:
        return Mapped(None, "no config zbsolve's estimate reads (model.config: null)")
    recompute = recompute_choice(run["recompute"])
    if isinstance(recompute, InputError):
        return Mapped(None, str(recompute))
    par, batch, schedule = run["parallelism"], run["batch"], run.get("schedule") or {}
    overlap, optimizer = run.get("overlap") or {}, run.get("optimizer") or {}
    hardware = run["hardware"]
    notes = [SUBSTITUTES[hardware["gpu"]]] if hardware["gpu"] in SUBSTITUTES else []
    name = schedule.get("name") or "none"
    if name not in SCHEDULES and not name.startswith("none"):
        return Mapped(None, f"schedule {name!r} is not one predict runs")
    zero = 3 if optimizer.get("fsdp") else optimizer.get("zero")
    if zero is None:
        zero = 1
        notes.append("optimizer not published: zero 1 (the distributed optimizer)")
    flags = {}
    for key in ("overlap_grad_reduce", "overlap_param_gather"):
        value = overlap.get(key, optimizer.get(key))
        if value is None:
            notes.append(f"{key} not published: on")
        flags[key] = True if value is None else bool(value)
    tp_comm_overlap = bool(overlap.get("tp_comm_overlap") or overlap.get("async_tp"))
    if par["tp"] > 1 and overlap.get("tp_comm_overlap") is None and overlap.get("async_tp") is None:
        notes.append("TP communication overlap not published: off")
    dispatcher = "flex" if str((run.get("moe") or {}).get("dispatcher", "")).startswith("flex") else "alltoall"
    if overlap.get("delay_wgrad_compute"):
        notes.append("delay_wgrad_compute on in the run: predict has no flag for it")
    vp = par["vp"] or 1
    layout = schedule.get("layout")
    titan = layout is None and par["pp"] > 1 and "torchtitan" in schedule.get("runtime", "")
    if layout is None and par["pp"] > 1 and not titan and "split not published" in schedule.get("notes", ""):
        notes.append("pipeline split not published: uniform")
    order = SCHEDULES.get(name)
    configuration = Configuration(
        config=run["model"]["config"], gpu=GPUS[hardware["gpu"]], dtype=run["precision"]["dtype"],
        seq_len=batch["seq_len"], microbatch_size=batch["microbatch_size"], global_batch=batch["global_batch_size"],
        gpus=hardware["gpus"], tp=par["tp"], pp=par["pp"], vp=vp, cp=par["cp"], ep=par["ep"], zero=zero,
        layout=layout, partition="torchtitan" if titan else "uniform",
        schedule=None if order in (None, megatron_builtin(vp)) else order, recompute=recompute,
        tp_comm_overlap=tp_comm_overlap and par["tp"] > 1, dispatcher=dispatcher if par["ep"] > 1 else "alltoall",
        **flags)
    return Mapped(configuration, None, tuple(notes))


def parallelism(run: dict) -> str:
    """GPUs and TP/PP/VP/CP/EP of a run, with its FSDP group."""
    par = run["parallelism"]
    text = f"{run['hardware']['gpus']} GPUs {par['tp']}/{par['pp']}/{par['vp'] or '-'}/{par['cp']}/{par['ep']}"
    return text + (f" FSDP{par['fsdp']}" if par.get("fsdp") else "")


def row(run: dict) -> Row:
    """The table's line of ``run``: predicted where it maps to a configuration predict takes."""
    base = dict(name=run["name"], parallelism=parallelism(run), dtype=run["precision"]["dtype"],
                pipeline=run["parallelism"]["pp"] > 1, held_back=run["held_back"], scored=run["scored"],
                measured=float(run["measured"]["tokens_per_s_per_gpu"]))
    if not run["scored"]:
        return Row(**base, predicted=None, step_time_s=None, command=None,
                   reason="record only (scored: false): not predicted, not scored")
    m = mapped(run)
    if m.configuration is None:
        return Row(**base, predicted=None, step_time_s=None, command=None, reason=m.reason)
    began = time.monotonic()
    try:
        p = predict(m.configuration.replace(config=ROOT / m.configuration.config))
    except InputError as error:
        return Row(**base, predicted=None, step_time_s=None, command=m.configuration.command(), reason=str(error),
                   notes=m.notes, seconds=time.monotonic() - began)
    return Row(**base, predicted=p.tokens_per_s_per_gpu, step_time_s=p.step_time_s,
               command=m.configuration.command(), notes=m.notes, fits=p.fits, seconds=time.monotonic() - began)


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


def targets(rows: list[Row], found: list[dict]) -> list[dict]:
    """The calibration targets over the scored rows that are not held back, met or missed."""
    scored = [r for r in rows if r.scored and not r.held_back]
    pipeline = [r for r in scored if r.pipeline]
    median = median_error(pipeline)
    predicted = median_error([r for r in pipeline if r.ratio is not None])
    misses = [r.name for r in scored if not r.within]
    result = [{"target": f"median |pred/meas - 1| <= {MEDIAN:.0%} over the {len(pipeline)} scored pipeline-parallel "
                         f"runs ({sum(r.ratio is None for r in pipeline)} unpredicted, counted as misses)",
               "value": None if median is None or math.isinf(median) else median,
               "met": median is not None and median <= MEDIAN,
               "detail": f"median {fmt_pct(median)}; over the predicted ones alone {fmt_pct(predicted)}"},
              {"target": f"every scored run within {WITHIN:.0%} ({len(scored)} runs)",
               "value": len(scored) - len(misses), "met": not misses and bool(scored),
               "detail": f"{len(scored) - len(misses)} within; missed: {', '.join(misses) or 'none'}"}]
    for pair in found:
        result.append({"target": f"interleaving: predicted 1F1B/Interleaved1F1B step ratio within {PAIR:.0%} of the "
                                 f"measured {pair['measured']:.3f} ({pair['pair']})",
                       "value": pair["predicted"], "met": pair["met"],
                       "detail": pair["reason"] or f"predicted {pair['predicted']:.3f}, "
                                                   f"{pair['predicted'] / pair['measured']:.3f} of the measured"})
    return result


def fmt_pct(value: float | None) -> str:
    """A share as a percentage ("-" for None, "inf" for an infinite one)."""
    return "-" if value is None else "inf" if math.isinf(value) else f"{100 * value:.1f}%"


def print_rows(console: Console, rows: list[Row], title: str) -> None:
    """The table of ``rows``, then each row's command and notes."""
    table = Table(title=title)
    for column in ("#", "run", "parallelism", "dtype", "measured", "predicted", "pred/meas", "|ratio-1|",
                   f"within {WITHIN:.0%}", "note"):
        table.add_column(column, overflow="fold")
    for i, r in enumerate(rows, 1):
        within = "not scored" if not r.scored else "yes" if r.within else "MISS"
        note = r.reason or ("" if r.fits is None or r.fits else "does not fit the preset's memory")
        table.add_row(str(i), r.name, r.parallelism, r.dtype, f"{r.measured:,.1f}",
                      "-" if r.predicted is None else f"{r.predicted:,.1f}",
                      "-" if r.ratio is None else f"{r.ratio:.3f}", fmt_pct(r.error if r.scored else None), within,
                      note)
    console.print(table)
    for i, r in enumerate(rows, 1):
        if r.command is not None:
            console.print(f"{i}. {r.command}", markup=False, highlight=False, soft_wrap=True)
        for note in r.notes:
            console.print(f"   assumed: {note}", markup=False, highlight=False, soft_wrap=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=None, help="only the runs whose file name holds this text")
    parser.add_argument("--json", type=Path, default=None, help="write the rows and targets as JSON here")
    args = parser.parse_args()
    console = Console(width=200)
    files = runs(args.only)
    began = time.monotonic()
    rows = [row(run) for run in files]
    fitted = [r for r in rows if not r.held_back]
    held = [r for r in rows if r.held_back]
    print_rows(console, fitted, "Published runs against zbsolve predict (tokens/s/GPU)")
    if held:
        print_rows(console, held, "Held-back runs (never fitted to, outside the targets)")
        console.print(f"held back: median |ratio - 1| {fmt_pct(median_error(held))}, "
                      f"{sum(r.within for r in held)} of {len(held)} within {WITHIN:.0%}", highlight=False)
    found = pairs(rows, files)
    result = targets(rows, found)
    for t in result:
        console.print(f"{'met   ' if t['met'] else 'MISSED'} {t['target']}: {t['detail']}", markup=False,
                      highlight=False, soft_wrap=True)
    if not found:
        console.print("interleaving: no published 1F1B / Interleaved1F1B pair among the runs selected",
                      highlight=False)
    console.print(f"{len(rows)} runs in {time.monotonic() - began:.1f} s "
                  f"(slowest prediction {max((r.seconds for r in rows), default=0):.1f} s)", highlight=False)
    if args.json:
        records = [{**asdict(r), "ratio": r.ratio, "error": None if r.ratio is None else r.error} for r in rows]
        args.json.write_text(json.dumps({"rows": records, "pairs": found, "targets": result}, indent=1,
                                        default=str))


if __name__ == "__main__":
    main()
