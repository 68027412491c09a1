"""What a plan is: the candidates timed, the baselines beside it, and the plan itself."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from zbsolve.base.shown import Shown
from zbsolve.core.measures import STEP_TIME, gap
from zbsolve.core.simulator import Timeline
from zbsolve.core.step_time import StepTimes, step_times
from zbsolve.io.costs_section import costs_section
from zbsolve.io.document import to_document, write_document
from zbsolve.io.targets import Exportable, runs_as_planned
from zbsolve.io.targets.launch import Launch
from zbsolve.io.targets.plan import Plan
from zbsolve.problem.costs import Costs, memory_figures
from zbsolve.schedulers.builtins import builtin_placement

OWN_ORDER = "'s own order"
"""How a plan's source ends when its schedule is its runtime's own order: "Megatron (megatron-core 0.16.1)'s own
order"."""


@dataclass(frozen=True)
class Candidate:
    """A partition of a placement, timed by the heuristic (or the runtime's own order) and the simulator."""

    placement: str
    """"sequential", "interleaved" or "vshape"."""
    chunks: int
    """Stages per device."""
    counts: tuple[int, ...]
    """Layers per stage."""
    origin: str
    """Where it comes from: "split bound", "balance", a baseline's split, or "move"."""
    step_time: float
    """Seconds of a step with the barrier (infinity when nothing fits)."""
    recompute: str = "none"
    """Which blocks recompute: one of ``problem.recompute.RECOMPUTE_FORMS`` (none, full, uniform:N, per-stage:N,N,...,
    or per-stage: the counts chosen as the candidate is timed; the selective forms: the other blocks' norms and MLP
    activation function)."""

    def key(self) -> tuple[str, int, str, tuple[int, ...]]:
        """(placement, chunks, recompute, counts): what tells candidates apart."""
        return self.placement, self.chunks, self.recompute, self.counts

    def label(self) -> str:
        """The placement, chunks and recomputation, as the log names them (``choice_label``)."""
        return choice_label(self.placement, self.chunks, self.recompute)


def choice_label(placement: str, chunks: int, recompute: str) -> str:
    """A placement with its stages per device and a recomputation, as the log names them: "interleaved x2
    recompute full"."""
    return f"{placement} x{chunks}" + ("" if recompute == "none" else f" recompute {recompute}")


@dataclass(frozen=True)
class Baseline:
    """A built-in torch schedule on a baseline split (Megatron's schedules as the built-ins of their order),
    simulated on the same costs."""

    split: str
    """"uniform", "torchtitan", "megatron" or "layout" (a Megatron ``--pipeline-model-parallel-layout``)."""
    schedule: str
    """torch's schedule name (GPipe, 1F1B, Interleaved1F1B, InterleavedZeroBubble, ZBVZeroBubble, DualPipeV), or
    Megatron's combined 1F1B (``schedulers.builtins.COMBINED``)."""
    counts: tuple[int, ...] | None
    """Layers per stage (None when the split does not exist for this model)."""
    step_time: float | None
    """Seconds of a step with the barrier."""
    bubble: float | None
    """1 - work / (devices x step_time)."""
    memory_gib: tuple[float, ...] | None
    """Per device, the device memory it needs (``Costs.needed``: static bytes + peak activations + reserve), GiB:
    the row fits exactly when none is above the device memory ("max GiB" is the largest)."""
    fits: bool
    """Whether every device's memory and the reserve fit the device memory."""
    note: str = ""
    """Why there is no figure, when there is none."""
    recompute: str = "none"
    """Which blocks recompute: none, full (every block) or uniform:N (the first N blocks of every stage)."""
    chunks: int = field(kw_only=True)
    """Stages per device: the built-in's own (``BUILTINS``), or a Megatron layout's virtual stages."""
    recomputed: tuple[int, ...] | None = field(kw_only=True)
    """Blocks recomputed per stage (None without a figure)."""

    @property
    def placement(self) -> str:
        """The placement its schedule runs on (``BUILTINS``, ``builtin_placement``), with ``chunks`` stages per
        device."""
        return builtin_placement(self.schedule, self.chunks)

    def row(self) -> dict[str, object]:
        """The baseline as a table row; the blocks recomputed per stage with runs written n*k, as Megatron's
        layout repeats (``2*39,1``: two on each of the first 39 stages, one on the last)."""
        return {"split": self.split, "recompute": self.recompute, "schedule": self.schedule,
                "step_time": self.step_time, "bubble": self.bubble,
                "max GiB": max(self.memory_gib) if self.memory_gib else None, "fits": self.fits,
                "recomputed": _runs(self.recomputed) if self.recomputed is not None and any(self.recomputed) else None,
                "note": self.note}


def by_step_time(baseline: Baseline) -> float:
    """A baseline's step time as the fastest is chosen by (infinite without a figure)."""
    return math.inf if baseline.step_time is None else baseline.step_time


@dataclass(frozen=True, repr=False)
class PlanResult(Shown, Exportable):
    """The plan: partition, placement, schedule, step times, the bound over partitions, and the baselines."""

    placement: str
    """The chosen placement."""
    chunks: int
    """Stages per device."""
    costs: Costs
    """The model, its partition (``costs.ranges``) and the device memory."""
    timeline: Timeline
    """The schedule (``timeline.schedule``) as the simulator times it."""
    source: str
    """Who made the schedule: "cpsat", "heuristic", "baseline <split> <schedule>" or, for a runtime that runs its
    own order, "<runtime>'s own order" (``OWN_ORDER``)."""
    lower_bound: float | None
    """Seconds no schedule on any partition of the placements searched beats; None where none was computed (an
    interrupt before the split bounds): unknown, not zero."""
    baselines: tuple[Baseline, ...]
    """Built-in schedules on the baseline splits."""
    candidates: tuple[Candidate, ...]
    """Every partition timed, in the order timed."""
    plan_time: float
    """Wall time of the plan, seconds."""
    log: str
    """What each phase did."""
    interrupted: bool = False
    """Whether an interrupt stopped the search (the plan is the best found until then)."""
    recompute: str = "none"
    """Which blocks recompute in the plan: the shortest of ``problem.recompute.RECOMPUTE_FORMS`` that says so
    (per-stage with its counts), or "layers" where none does (``costs.recomputed`` and ``costs.selective`` name
    them)."""
    target: str = "zbsolve"
    """The runtime the plan was made for (``plan --target``)."""
    measured: StepTimes | None = None
    """The step times the plan made of its schedule, in its time limit (None: ``step_times`` makes them when read)."""
    launch: Launch | None = None
    """What it is to be launched with (the document's "launch" section), where known: ``configure`` says."""

    @cached_property
    def runtimes(self) -> tuple[str, ...]:
        """The runtimes whose export takes the plan as it is (``io.targets.runs_as_planned``)."""
        model = self.costs.model
        assert model is not None, "a plan's costs are its model's"
        return runs_as_planned(Plan(self.timeline.schedule, model, self.costs.ranges,
                                    frozenset(self.costs.recomputed), frozenset(self.costs.selective),
                                    self.costs.modules))

    @property
    def step_time(self) -> float:
        """Seconds of one step with an optimizer barrier: the makespan."""
        return self.timeline.makespan

    @cached_property
    def step_times(self) -> StepTimes:
        """Step time with and without the barrier, and their bubbles."""
        return self.measured or step_times(self.timeline)

    @property
    def gap(self) -> float | None:
        """(step_time - lower_bound) / step_time; None where the bound is unknown."""
        return None if self.lower_bound is None else gap(self.step_time, self.lower_bound)

    @property
    def counts(self) -> tuple[int, ...]:
        """Layers per stage."""
        return tuple(b - a for a, b in self.costs.ranges)

    @property
    def partition(self) -> tuple[int, ...]:
        """Layers per stage, as the summary, the repr and ``zbsolve plan`` name them (``counts``)."""
        return self.counts

    def best_baseline(self, split: str | None = None) -> Baseline | None:
        """The fastest baseline that fits (on ``split`` alone when given)."""
        fitting = [b for b in self.baselines if b.fits and b.step_time is not None and split in (None, b.split)]
        return min(fitting, key=by_step_time, default=None)

    def title(self) -> str:
        """What was planned and which schedule was kept, as a chart's title names them: the model, the placement,
        the recomputation (or none), the partition and whose schedule it is."""
        maker, source = self.timeline.schedule.name, self.source
        kept = (f"the {source}" if source.startswith("baseline") else f"{maker}'s" if maker == source
                else f"{maker}, {source}" if source.endswith(OWN_ORDER) else f"{maker}'s ({source} found none shorter)")
        recompute = "no recomputation" if self.recompute == "none" else f"recompute {self.recompute}"
        name = self.costs.model.name if self.costs.model is not None else "plan"
        return (f"{name}: plan for the {STEP_TIME.name}: {self.placement} x{self.chunks}, {recompute}, partition "
                f"{list(self.counts)}; the schedule kept is {kept}" + (" (interrupted)" if self.interrupted else ""))

    def summary(self) -> dict[str, object]:
        """The headline figures as plain values."""
        uniform, titan = self.best_baseline("uniform"), self.best_baseline("torchtitan")
        return {"placement": self.placement, "chunks": self.chunks, "partition": list(self.counts),
                "recompute": self.recompute, "target": self.target, "runs as planned on": ", ".join(self.runtimes),
                "source": self.source, **self.step_times.figures(), "lower_bound": self.lower_bound, "gap": self.gap,
                "best uniform baseline": _named(uniform), "vs best uniform": _ratio(self.step_time, uniform),
                "best torchtitan baseline": _named(titan), "vs best torchtitan": _ratio(self.step_time, titan),
                **memory_figures(self.costs, self.timeline), "plan_time": self.plan_time,
                "interrupted": self.interrupted}

    def to_json(self, path: str | Path | None = None) -> dict:
        """The schedule document with the costs' sections and a "plan" section (bound, baselines, candidates);
        written to ``path`` (whole or not at all) when given."""
        plan = {**self.summary(), "baselines": [b.__dict__ | {"counts": list(b.counts or []) or None}
                                                for b in self.baselines],
                "candidates": [c.__dict__ | {"counts": list(c.counts)} for c in self.candidates], "log": self.log}
        extra = {**costs_section(self.costs), "plan": _finite(plan),
                 **({"launch": self.launch.section()} if self.launch is not None else {})}
        return to_document(self.timeline, **extra) if path is None else write_document(self.timeline, path, **extra)


    def __repr__(self) -> str:
        return (f"PlanResult(placement={self.placement!r}, partition={list(self.counts)}, "
                f"step_time={self.step_time:.6g}, gap={'unknown' if self.gap is None else f'{self.gap:.4g}'}, "
                f"source={self.source!r})")



def _runs(counts: tuple[int, ...]) -> str:
    """``counts`` with each run of one count written count*length (``2*39,1``)."""
    runs = [(count, len(list(group))) for count, group in itertools.groupby(counts)]
    return ",".join(f"{count}*{length}" if length > 1 else str(count) for count, length in runs)


def _named(baseline: Baseline | None) -> str | None:
    if baseline is None:
        return None
    return f"{baseline.schedule} ({baseline.split}" + ("" if baseline.recompute == "none" else
                                                       f", recompute {baseline.recompute}") + ")"


def _ratio(step: float, baseline: Baseline | None) -> float | None:
    return None if baseline is None or not baseline.step_time else step / baseline.step_time


def _finite(value: object) -> object:
    """``value`` with infinite floats as None, for JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
