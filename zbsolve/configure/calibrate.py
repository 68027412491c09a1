"""``zbsolve calibrate``: the values of the cost model's terms (``costmodel.calibration.TERMS``) fitted to measured
runs (``configure.measured_runs``) by bounded least squares.

The procedure (docs/cost-model.md, "Calibration"): each run is predicted (``configure.predict``) under the
values; the residuals are the log of predicted over measured step time, and of predicted over measured peak
memory per device (the largest device's) where the run publishes one, plus one prior residual per term,
``PRIOR_WEIGHT`` times its distance from its neutral value in units of its range, which keeps a term no run
constrains where the model states it. ``scipy.optimize.least_squares`` minimises their squares over the values,
each scaled to its range and within it (trust-region reflective, the Jacobian by forward differences of
``DIFF_STEP``). Runs marked held back or not scored are never fitted. The leave-one-out calibration of a run
(``leave_one_out``) is the same fit over the other runs, started from the full fit's values.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import least_squares

from zbsolve.base.errors import InputError
from zbsolve.configure.measured_runs import MeasuredRun
from zbsolve.configure.predict import predict
from zbsolve.costmodel.calibration import TERMS, Calibration

PRIOR_WEIGHT = 0.1
"""A term's prior residual is ``PRIOR_WEIGHT`` times its distance from its neutral value over its range: a term
moved across its whole range weighs as much as one run off by 10% (a tie-break for terms the runs leave free, not a
pull on those they fix)."""
DIFF_STEP = 0.05
"""The forward-difference step of the Jacobian, as a share of each term's range."""
MAX_EVALUATIONS = 12
"""Iterations of the trust-region method at most (each predicts every run once, and once more per term for the
Jacobian)."""
TOLERANCE = 1e-4
"""The relative change in cost, and in the scaled values, at which the fit stops."""

Predictor = Callable[[MeasuredRun, Calibration], tuple[float, float]]
"""Seconds of a step and GiB of the fullest device of a run under a calibration."""


@dataclass(frozen=True)
class RunFit:
    """One run under the fitted multipliers."""

    name: str
    """The run's name."""
    measured_step_s: float
    """Measured seconds of a step."""
    predicted_step_s: float
    """Predicted seconds of a step under the fitted multipliers."""
    measured_memory_gib: float | None = None
    """Published peak memory per device, GiB (None: not published)."""
    predicted_memory_gib: float | None = None
    """Predicted peak memory of the fullest device, GiB."""
    sensitivity: dict[str, float] = field(default_factory=dict)
    """d log(step time) / d value at the fit, the value in units of its range, by term (empty where the fit stopped
    early)."""
    memory_sensitivity: dict[str, float] = field(default_factory=dict)
    """The same of the peak memory, where it is measured."""

    @property
    def residual(self) -> float:
        """log(predicted / measured) step time."""
        return math.log(self.predicted_step_s / self.measured_step_s)

    @property
    def memory_residual(self) -> float | None:
        """log(predicted / measured) peak memory (None where either is missing)."""
        if self.measured_memory_gib is None or self.predicted_memory_gib is None:
            return None
        return math.log(self.predicted_memory_gib / self.measured_memory_gib)


@dataclass(frozen=True)
class Fit:
    """A fitted calibration and the runs it was fitted on."""

    multipliers: dict[str, float]
    """The fitted multiplier of each term fitted."""
    runs: tuple[RunFit, ...]
    """Each run under the fitted multipliers."""
    evaluations: int
    """Times every run was predicted."""
    stopped_early: bool = False
    """Whether an interrupt stopped the fit: the multipliers are the best evaluated by then."""

    @property
    def calibration(self) -> Calibration:
        """The fitted multipliers as a ``Calibration``."""
        return Calibration(self.multipliers)

    def summary(self) -> dict[str, float]:
        """Median, largest and root-mean-square |log residual| of the step times, and of the memories where any."""
        steps = [abs(r.residual) for r in self.runs]
        found = {"median_abs_log_step": statistics.median(steps), "max_abs_log_step": max(steps),
                 "rms_log_step": math.sqrt(statistics.fmean([s * s for s in steps]))}
        memories = [abs(m) for r in self.runs if (m := r.memory_residual) is not None]
        if memories:
            found |= {"median_abs_log_memory": statistics.median(memories), "max_abs_log_memory": max(memories)}
        return found


def fitted_terms(terms: Sequence[str] | None) -> tuple[str, ...]:
    """The terms a fit varies: ``terms`` (each one of ``TERMS``, none twice), or every term of ``TERMS``."""
    chosen = tuple(TERMS) if terms is None else tuple(terms)
    for term in chosen:
        if term not in TERMS:
            raise InputError(f"terms = {term!r}: should be among {', '.join(TERMS)}")
    if not chosen or len(set(chosen)) != len(chosen):
        raise InputError(f"terms = {', '.join(chosen) or 'none'}: give one or more terms, each once")
    return chosen


def predicted(run: MeasuredRun, calibration: Calibration) -> tuple[float, float]:
    """Seconds of a step and GiB of the fullest device of ``run`` under ``calibration``."""
    p = predict(run.configuration.replace(calibration=calibration))
    return p.step_time_s, max(p.peak_memory_gib)


def _span(term: str) -> float:
    return TERMS[term].high - TERMS[term].low


def _values(names: tuple[str, ...], x: np.ndarray) -> dict[str, float]:
    """The terms' values at scaled point ``x`` (each in [0, 1] over its range), clipped to their ranges."""
    return {n: float(np.clip(TERMS[n].low + v * _span(n), TERMS[n].low, TERMS[n].high)) for n, v in zip(names, x)}


def _scaled(names: tuple[str, ...], calibration: Calibration) -> np.ndarray:
    """``calibration``'s values of ``names`` each scaled to its range ([0, 1])."""
    return np.array([(calibration.scale(n) - TERMS[n].low) / _span(n) for n in names])


def fit(runs: Sequence[MeasuredRun], terms: Sequence[str] | None = None,
        progress: Callable[[str], None] | None = None, start: Calibration | None = None,
        predictor: Predictor = predicted, memo: dict | None = None) -> Fit:
    """The values of ``terms`` (default: every term of ``TERMS``) that fit ``runs`` best (the module's procedure),
    from ``start`` (default: each neutral); ``progress`` hears each evaluation; ``predictor`` predicts a run (``memo``:
    its figures by run and values, kept across fits). An interrupt (``KeyboardInterrupt``) returns the best
    evaluated so far, ``stopped_early`` set (one before the first evaluation propagates)."""
    names = fitted_terms(terms)
    fitted = [r for r in runs if r.scored and not r.held_back]
    if not fitted:
        raise InputError("runs: none to fit (each is held back or not scored, or none was given)")
    say = progress or (lambda line: None)
    known = {} if memo is None else memo
    best: list[tuple[float, np.ndarray, list[tuple[float, float]]]] = []
    count = [0]

    def evaluate(x: np.ndarray) -> list[tuple[float, float]]:
        values = _values(names, x)
        calibration = Calibration(values)
        key = tuple(round(values[n], 9) for n in names)
        for run in fitted:
            if (run.name, names, key) not in known:
                known[run.name, names, key] = predictor(run, calibration)
        return [known[run.name, names, key] for run in fitted]

    def residuals(x: np.ndarray) -> np.ndarray:
        figures = evaluate(x)
        r = _residuals(fitted, figures, x - neutral)
        count[0] += 1
        cost = float(r @ r)
        if not best or cost < best[0][0]:
            best[:] = [(cost, x.copy(), figures)]
        say(f"evaluation {count[0]}: sum of squares {cost:.4f} at "
            + ", ".join(f"{n} {v:.3f}" for n, v in _values(names, x).items()))
        return r

    low, high, neutral = np.zeros(len(names)), np.ones(len(names)), _scaled(names, Calibration())

    def jacobian(x: np.ndarray) -> np.ndarray:
        """Forward differences of ``DIFF_STEP`` in each scaled value (backward where the bound is nearer)."""
        base = residuals(x)
        columns = []
        for k in range(len(names)):
            step = DIFF_STEP if x[k] + DIFF_STEP <= high[k] else -DIFF_STEP
            moved = x.copy()
            moved[k] += step
            columns.append((residuals(moved) - base) / step)
        return np.column_stack(columns)

    x0 = np.clip(_scaled(names, start or Calibration()), low, high)
    try:
        result = least_squares(residuals, x0, jac=jacobian, bounds=(low, high), max_nfev=MAX_EVALUATIONS,
                               ftol=TOLERANCE, xtol=TOLERANCE, x_scale=1.0)
    except KeyboardInterrupt:
        if not best:
            raise
        _, x, figures = best[0]
        return Fit(_values(names, x), _run_fits(fitted, figures, names, None), count[0], stopped_early=True)
    _, x, figures = best[0]
    slopes = result.jac if np.allclose(result.x, x) else None
    return Fit(_values(names, x), _run_fits(fitted, figures, names, slopes), count[0])


def _residuals(runs: Sequence[MeasuredRun], figures: list[tuple[float, float]], x: np.ndarray) -> np.ndarray:
    """The fit's residuals: each run's log step ratio, then each measured memory's log ratio, then the priors
    (``x``: each term's scaled distance from its neutral value)."""
    steps = [math.log(step / run.step_time_s) for run, (step, _) in zip(runs, figures)]
    memories = [math.log(memory / run.peak_memory_gib) for run, (_, memory) in zip(runs, figures)
                if run.peak_memory_gib is not None]
    return np.array(steps + memories + list(PRIOR_WEIGHT * x))


def _run_fits(runs: Sequence[MeasuredRun], figures: list[tuple[float, float]], names: tuple[str, ...],
              jacobian: np.ndarray | None) -> tuple[RunFit, ...]:
    """Each run's figures at the fit, with its rows of the Jacobian where there is one."""
    memory_rows = iter(range(len(runs), len(runs) + sum(r.peak_memory_gib is not None for r in runs)))
    found = []
    for i, (run, (step, memory)) in enumerate(zip(runs, figures)):
        row = next(memory_rows) if run.peak_memory_gib is not None else None
        step_row = {} if jacobian is None else dict(zip(names, map(float, jacobian[i])))
        memory_row = {} if jacobian is None or row is None else dict(zip(names, map(float, jacobian[row])))
        found.append(RunFit(run.name, run.step_time_s, step, run.peak_memory_gib, memory, step_row, memory_row))
    return tuple(found)


def leave_one_out(runs: Sequence[MeasuredRun], full: Fit, progress: Callable[[str], None] | None = None,
                  predictor: Predictor = predicted, jobs: int = 1) -> dict[str, Calibration]:
    """Each fitted run's leave-one-out calibration: the terms of ``full`` fitted again (``fit``) over the other
    runs ``full`` was fitted on, started from ``full``'s values; ``jobs`` processes at once. A run left alone
    has no other run to be fitted on: the cost model as stated (``full`` saw it)."""
    names = tuple(full.multipliers)
    seen = {r.name for r in full.runs}
    fitted = [r for r in runs if r.name in seen and r.scored and not r.held_back]
    say = progress or (lambda line: None)
    tasks = [([o for o in fitted if o.name != r.name], names, full.calibration, predictor) for r in fitted]
    found: dict[str, Calibration] = {}
    if jobs > 1 and len(tasks) > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            for run, calibration in zip(fitted, pool.map(_refit, tasks)):
                found[run.name] = calibration
                say(f"left out {run.name}: " + _shown(calibration))
        return found
    memo: dict = {}
    for run, task in zip(fitted, tasks):
        found[run.name] = _refit(task, memo)
        say(f"left out {run.name}: " + _shown(found[run.name]))
    return found


def _refit(task: tuple[list[MeasuredRun], tuple[str, ...], Calibration, Predictor], memo: dict | None = None
           ) -> Calibration:
    """One leave-one-out fit (``leave_one_out``): none (the cost model as stated) where no other run is left."""
    others, names, start, predictor = task
    if not others:
        return Calibration()
    return fit(others, names, start=start, predictor=predictor, memo=memo).calibration


def _shown(calibration: Calibration) -> str:
    return ", ".join(f"{n} {v:.3f}" for n, v in calibration.multipliers.items())


def document(fit: Fit, command: str, version: str, date: str) -> dict:
    """The calibration file of ``fit`` (what ``costmodel.calibration.load_calibration`` reads, and the fit written
    down): its multipliers, bounds and terms, each run's figures, residuals and sensitivities, the summary, the
    date, zbsolve's version and the command that wrote it."""
    runs = []
    for r in fit.runs:
        entry: dict[str, object] = {"name": r.name, "measured_step_s": _round(r.measured_step_s),
                                    "predicted_step_s": _round(r.predicted_step_s),
                                    "log_step_residual": _round(r.residual)}
        if r.measured_memory_gib is not None:
            entry |= {"measured_memory_gib": r.measured_memory_gib,
                      "predicted_memory_gib": _round(r.predicted_memory_gib),
                      "log_memory_residual": _round(r.memory_residual)}
        if r.sensitivity:
            entry["sensitivity"] = {n: _round(v) for n, v in r.sensitivity.items()}
        if r.memory_sensitivity:
            entry["memory_sensitivity"] = {n: _round(v) for n, v in r.memory_sensitivity.items()}
        runs.append(entry)
    return {"multipliers": {n: _round(v) for n, v in fit.multipliers.items()},
            "terms": {n: TERMS[n].what for n in fit.multipliers},
            "bounds": {n: [TERMS[n].low, TERMS[n].high] for n in fit.multipliers},
            "at_bound": list(fit.calibration.at_bound),
            "objective": "least squares of log(predicted/measured) step time and peak memory where measured, "
                         f"plus {PRIOR_WEIGHT:g} x each term's distance from its neutral value over its range "
                         "(docs/cost-model.md, Calibration)",
            "residuals": {k: _round(v) for k, v in fit.summary().items()}, "runs": runs,
            "evaluations": fit.evaluations, "stopped_early": fit.stopped_early, "date": date,
            "zbsolve_version": version, "command": command}


def _round(value: float | None) -> float | None:
    return None if value is None else float(f"{value:.6g}")


def read_fit(data: dict, where: str = "calibration") -> Fit:
    """The fit a calibration file (``document``) records; an ``InputError`` naming ``where`` where it records none."""
    try:
        runs = tuple(RunFit(r["name"], float(r["measured_step_s"]), float(r["predicted_step_s"]),
                            r.get("measured_memory_gib"), r.get("predicted_memory_gib"),
                            dict(r.get("sensitivity") or {}), dict(r.get("memory_sensitivity") or {}))
                     for r in data["runs"])
        return Fit(dict(Calibration(data["multipliers"]).multipliers), runs, int(data.get("evaluations", 0)),
                   bool(data.get("stopped_early", False)))
    except (KeyError, TypeError, ValueError) as error:
        raise InputError(f"{where}: records no fit zbsolve calibrate wrote ({type(error).__name__}: {error})") from None
