"""What ``zbsolve configure`` returns: the ranked configurations, each with the ``zbsolve predict`` line that
reproduces its figures and why it loses to the chosen one, the counts of the search, and the chosen one's plan with
its target's export."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from zbsolve.base.errors import InputError
from zbsolve.base.shown import Shown
from zbsolve.configure.predict import BREAKDOWN, Configuration, Prediction
from zbsolve.io.document import document_of
from zbsolve.io.targets.plan import read_plan
from zbsolve.io.targets.torchtitan import torchtitan_launch
from zbsolve.planning.result import PlanResult

EXPORTS = {"megatron": "megatron", "torchtitan": "torchtitan", "zbsolve": None}
"""The export of a plan for each target (``io.targets.FORMATS``): Megatron's arguments, torchtitan's folder, and
for zbsolve's own executor the schedule document itself (None)."""
MEMORY_NOTED_GIB = 1.0
"""A peak memory differing from the chosen one's by more than this is named beside why a configuration loses."""


@dataclass(frozen=True)
class Ranked:
    """One configuration timed, with its figures."""

    configuration: Configuration
    """The configuration, as ``zbsolve predict`` takes it."""
    prediction: Prediction
    """What ``predict(configuration)`` returns."""
    command: str
    """The ``zbsolve predict`` command line that prints ``prediction``."""
    planned_step_s: float | None = None
    """Seconds of a step of its plan (``plan``: split, placement, order and recomputation chosen), None where it
    was not refined."""
    planned_memory_gib: float | None = None
    """The plan's largest device use (static bytes and peak activations), GiB; None where it was not refined."""
    why: str = ""
    """Why it loses to the chosen configuration: the part of the step that differs most (``predict.BREAKDOWN``, or
    what the plan saves), and its peak memory where that differs; empty for the chosen one."""
    warnings: tuple[str, ...] = ()
    """What its runtime warns of it, each with the rule's source (``configure.runtime_rules``)."""

    @property
    def step_s(self) -> float:
        """Seconds of its step: its plan's where that is shorter, else the predicted one."""
        planned = self.planned_step_s
        return self.prediction.step_time_s if planned is None else min(planned, self.prediction.step_time_s)

    @property
    def planned(self) -> bool:
        """Whether its figures are its plan's (refined, and the plan no slower than predicted)."""
        return self.planned_step_s is not None and self.planned_step_s <= self.prediction.step_time_s

    @property
    def tokens_per_s_per_gpu(self) -> float:
        """Global batch x sequence length / ``step_s`` / GPUs."""
        return self.prediction.tokens_per_s_per_gpu * self.prediction.step_time_s / self.step_s

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation at ``step_s``."""
        return self.prediction.mfu * self.prediction.step_time_s / self.step_s

    @property
    def memory_gib(self) -> float:
        """The memory its busiest device needs as ``predict`` prints it (``predicted_memory_gib``): one figure per
        configuration, whether or not it was refined."""
        return predicted_memory_gib(self.prediction)

    def degrees(self) -> str:
        """tp/pp/vp/cp/ep/dp."""
        c = self.configuration
        return "/".join(map(str, (c.tp, c.pp, c.vp, c.cp, c.ep, self.prediction.dp)))

    def row(self) -> dict[str, object]:
        """Its figures as a table's row (``ConfigureResult.rows``)."""
        c = self.configuration
        return {"tp/pp/vp/cp/ep/dp": self.degrees(), "mbs": c.microbatch_size, "zero": c.zero,
                "recompute": c.recompute, "split": c.layout or c.partition,
                "tokens/s/GPU": self.tokens_per_s_per_gpu, "MFU": self.mfu,
                "step s": self.prediction.step_time_s, "planned step s": self.planned_step_s,
                "peak GiB": self.memory_gib, "why it loses": self.why, "warnings": list(self.warnings)}


@dataclass(frozen=True)
class Timed:
    """One configuration timed, by the figures the chart of the candidates draws (``ConfigureResult.plot``)."""

    configuration: Configuration
    """The configuration."""
    tokens_per_s_per_gpu: float
    """Its predicted tokens/s/GPU."""
    memory_gib: float
    """Its largest device's predicted use (static bytes and peak activations), GiB."""
    fits: bool
    """Whether every device fits its memory with the reserve."""

    @classmethod
    def of(cls, c: Configuration, p: Prediction) -> "Timed":
        """``c`` by the figures of its prediction ``p``."""
        return cls(c, p.tokens_per_s_per_gpu, predicted_memory_gib(p), p.fits)


def predicted_memory_gib(p: Prediction) -> float:
    """The memory ``predict`` prints for its busiest device (``Prediction.busiest``), GiB."""
    return p.busiest()[1]


def why_loses(candidate: Ranked, best: Ranked) -> str:
    """Why ``candidate`` loses to ``best``: what ``best``'s plan saves beyond ``candidate``'s where it does ("plan"),
    the part of the predicted step that is longer by the most (``predict.BREAKDOWN``), and its peak memory where it
    differs by more than ``MEMORY_NOTED_GIB``; "ties" where no part is longer."""
    planned = (best.prediction.step_time_s - best.step_s) - (candidate.prediction.step_time_s - candidate.step_s)
    parts = {name: candidate.prediction.breakdown[name] - best.prediction.breakdown[name] for name in BREAKDOWN}
    name = max(parts, key=parts.__getitem__)
    why = [f"plan {_seconds(planned)}"] * (planned > 0) + [f"{name} {_seconds(parts[name])}"] * (parts[name] > 0)
    memory = candidate.memory_gib - best.memory_gib
    return ", ".join(why or ["ties"]) + (f", {memory:+.1f} GiB" if abs(memory) > MEMORY_NOTED_GIB else "")


def _seconds(t: float) -> str:
    """A signed time in seconds to two decimals, or in milliseconds below a tenth of a second."""
    return f"{t:+.2f} s" if abs(t) >= 0.1 else f"{1e3 * t:+.3g} ms"


@dataclass(frozen=True)
class Counts:
    """How many configurations the search enumerated, and what became of each."""

    enumerated: int
    """Every combination of the degrees' menus (``configure.space``)."""
    invalid: int
    """Refused: degrees that do not divide, the estimate's rules, the target's runtime row or export."""
    pruned_memory: int
    """Pruned before timing: no device can hold its static bytes and one microbatch's activations."""
    pruned_bound: int
    """Pruned before timing: their step's lower bound is no shorter than the ``top``-th best step timed."""
    timed: int
    """Timed with ``predict``."""
    unfit: int
    """Of those timed, how many do not fit the device memory with ``predict``'s order."""
    untimed: int
    """Left untimed when the time limit or an interrupt stopped the search (0 when it finished)."""
    refined: int
    """Planned with ``plan``."""
    unenumerated: int = 0
    """Configurations of the menus not enumerated when the time limit or an interrupt stopped the enumeration (the
    shapes left, ``configurations.shape_size``), outside ``enumerated``."""
    untimed_bound_s: float | None = None
    """The best (least) lower bound on the step among the configurations left untimed (``untimed``), seconds; None
    where none is."""

    @property
    def complete(self) -> bool:
        """Whether the search finished: every configuration enumerated, and each timed, refused or pruned."""
        return not self.untimed and not self.unenumerated

    def completeness(self) -> str:
        """Timed, untimed and pruned counts with the best bound among the untimed, in one line."""
        pruned = self.pruned_memory + self.pruned_bound
        line = f"{self.timed} timed, {self.untimed + self.unenumerated} untimed, {pruned} pruned"
        if self.unenumerated:
            return line + f" ({self.unenumerated} not enumerated: no bound on them)"
        if self.untimed_bound_s is not None:
            return line + f"; best bound among the untimed {self.untimed_bound_s:.4g} s"
        return line

    def line(self) -> str:
        """The counts in one line."""
        return (f"{self.enumerated} enumerated: {self.invalid} invalid, {self.pruned_memory} pruned for memory, "
                f"{self.pruned_bound} pruned by the bound, {self.timed} timed ({self.unfit} do not fit)"
                + (f", {self.untimed} left untimed" if self.untimed else "") + f"; {self.refined} refined"
                + (f"; {self.unenumerated} not enumerated" if self.unenumerated else ""))


@dataclass(frozen=True, repr=False)
class ConfigureResult(Shown):
    """The configurations ``configure`` ranks, how it searched, and the chosen one with its plan; shown as the ranked
    table, drawn as the candidates' throughput against memory (``plot``)."""

    candidates: tuple[Ranked, ...]
    """The best configurations timed that fit, fastest first (planned figures where they are shorter)."""
    counts: Counts
    """What became of every configuration enumerated."""
    chosen: Ranked
    """The fastest candidate (``candidates[0]``)."""
    plan: PlanResult | None
    """The chosen configuration's plan; None where it has no pipeline (pp = 1) or an interrupt came first
    (``configure``: its order as predicted where no plan of its own is faster)."""
    interrupted: bool
    """Whether an interrupt stopped the search (the result is the best found until then)."""
    elapsed_s: float
    """Wall time of the whole search, seconds."""
    target: str
    """The runtime the configurations are for."""
    notes: tuple[str, ...] = ()
    """What the user should know: plans slower than predicted, refining skipped or cut short."""
    timed: tuple[Timed, ...] = ()
    """Every configuration timed, fitting or not, in the order timed."""
    complete: bool = True
    """Whether the search finished (``Counts.complete``, no interrupt): the choice is then the best of the space
    by ``predict``, else the best found."""
    gap: float | None = 0.0
    """How much faster than the choice an untimed configuration may still be: 1 - (the best bound among the
    untimed) / (the choice's step), at least 0; 0 where complete, None where some were not enumerated (no bound)."""

    @classmethod
    def gap_of(cls, counts: Counts, step_s: float, interrupted: bool) -> tuple[bool, float | None]:
        """(complete, gap) of a search with ``counts`` whose choice's step is ``step_s``."""
        if counts.complete and not interrupted:
            return True, 0.0
        if counts.unenumerated:
            return False, None
        bound = counts.untimed_bound_s
        return False, 0.0 if bound is None else max(0.0, 1.0 - bound / step_s)

    def status(self) -> str:
        """The choice's standing in one line: "best" where the search finished, else "best found" with its gap to
        the best bound among the untimed; then the counts of ``Counts.completeness``."""
        if self.complete:
            return f"best of the search (complete: {self.counts.completeness()})"
        gap = ("unknown" if self.gap is None else f"an untimed configuration may be up to {100 * self.gap:.1f}% "
               "faster")
        why = "interrupted" if self.interrupted else "the time limit"
        return f"best found, search incomplete ({why}; gap {gap}: {self.counts.completeness()})"

    def rows(self) -> list[dict[str, object]]:
        """One row per candidate, ranked from 1."""
        return [{"rank": k, **r.row()} for k, r in enumerate(self.candidates, 1)]

    def summary(self) -> dict[str, object]:
        """The candidates (with their configurations and command lines), the counts and the chosen one, as
        ``configure --json`` prints them."""
        def record(r: Ranked) -> dict[str, object]:
            c = r.configuration.model_dump(mode="json")
            return {**r.row(), "configuration": c, "command": r.command, "prediction": r.prediction.figures()}
        return {"candidates": [{"rank": k, **record(r)} for k, r in enumerate(self.candidates, 1)],
                "counts": asdict(self.counts), "chosen": record(self.chosen), "target": self.target,
                "planned": None if self.plan is None else self.plan.summary(), "interrupted": self.interrupted,
                "complete": self.complete, "gap": self.gap, "status": self.status(),
                "elapsed_s": self.elapsed_s, "notes": list(self.notes)}

    def __repr__(self) -> str:
        c = self.chosen
        return (f"ConfigureResult(chosen='tp/pp/vp/cp/ep/dp {c.degrees()}', step_s={c.step_s:.4g}, "
                f"tokens_per_s_per_gpu={c.tokens_per_s_per_gpu:,.0f}, candidates={len(self.candidates)}, "
                f"target={self.target!r}, planned={self.plan is not None}, interrupted={self.interrupted}, "
                f"complete={self.complete}, gap={self.gap}, {'best' if self.complete else 'best found'}: "
                f"{self.counts.completeness()!r}, counts={self.counts.line()!r})")

    def unplanned(self) -> str | None:
        """Why the chosen configuration has no plan, or None."""
        if self.plan is not None:
            return None
        why = ("pp = 1 has no pipeline to plan" if self.chosen.configuration.pp == 1
               else "an interrupt came before it was planned")
        return f"the chosen configuration ({self.chosen.degrees()}) has no plan: {why}"

    def command(self) -> str | None:
        """The command that launches the chosen plan on its target, as its export writes it: Megatron's ``torchrun
        ... pretrain_gpt.py``, torchtitan's ``torchrun ... -m torchtitan.train`` (run in the export's folder); None
        for zbsolve's own executor or where the chosen configuration has no plan."""
        if self.plan is None or self.target == "zbsolve":
            return None
        if self.target == "megatron":
            return self.export()
        document = json.loads(json.dumps(self.plan.to_json(), default=str))
        launched = torchtitan_launch(read_plan(document_of(document, taker="ConfigureResult.command"), self.target))
        return None if launched is None else launched[0]

    def export(self, path: str | Path | None = None) -> str:
        """Write the target's export of the chosen plan to ``path`` (``PlanResult.export``): Megatron's arguments
        with the layout (a file; printed only without ``path``), torchtitan's folder with its config and schedule
        CSV, or for zbsolve the schedule document. Returns the main text: Megatron's arguments, the CSV, or the
        document. An ``InputError`` where the chosen configuration has no plan."""
        why = self.unplanned()
        if why is not None:
            raise InputError(f"export: {why}")
        assert self.plan is not None  # planned
        fmt = EXPORTS[self.target]
        if fmt is not None:
            return self.plan.export(fmt, path)
        if path is None:
            raise InputError("export: the zbsolve target's export is the schedule document: give a path")
        return json.dumps(self.plan.to_json(path), indent=1, default=str)
