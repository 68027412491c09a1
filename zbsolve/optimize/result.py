"""What a solve returns: the schedule, its figures, and how good it provably is."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from zbsolve.base.shown import Shown
from zbsolve.core.measures import FIGURES, OBJECTIVE_FIGURES
from zbsolve.core.schedule import Schedule
from zbsolve.core.simulator import Timeline
from zbsolve.core.step_time import StepTimes, step_times
from zbsolve.io.costs_section import costs_section
from zbsolve.io.document import to_document, write_document
from zbsolve.io.targets import Exportable
from zbsolve.problem.costs import Costs, memory_figures

BOUND_MET = 1e-5
"""The largest gap that reads as the bound met: what rounding times to integers for the solver leaves."""


def status_text(status: str, bound_met: bool) -> str:
    """A solve's status as a reader takes it: one not proven optimal whose schedule meets the lower bound all the same
    (a bound on times rounded for the solver) reads "<status> (bound met)", e.g. "heuristic (bound met)"."""
    return f"{status} (bound met)" if bound_met and status != "optimal" else status


def meets_bound(gap: float | None) -> bool:
    """Whether a schedule ``gap`` (relative) above its lower bound meets it, up to ``BOUND_MET``; None (no
    bound) does not."""
    return gap is not None and gap <= BOUND_MET


@dataclass(frozen=True, repr=False)
class SolveResult(Shown, Exportable):
    """What ``solve`` found: a validated schedule, its figures, and how good it provably is."""

    schedule: Schedule
    """The schedule (validated by the simulator)."""
    timeline: Timeline
    """The simulator's timing of ``schedule``."""
    measured: StepTimes | None
    """The step times the solve made (None where it made none: ``step_times`` makes them when first read)."""
    objective: float
    """Objective value: makespan (the step time with an optimizer barrier) or longest per-device span ("span"),
    in profile time units."""
    objective_kind: str
    """Which objective was minimised: "span" or "makespan"."""
    lower_bound: float
    """A proven lower bound on the objective, in profile time units."""
    gap: float
    """(objective - lower_bound) / objective; 0 means proven optimal."""
    status: str
    """"optimal" (proven), "feasible" (improved, not proven) or "heuristic" (the warm start)."""
    solver: str
    """The solver asked for: "cpsat", "cbc" or "heuristic"."""
    solve_time: float
    """Wall time of the whole solve, in seconds."""
    solver_log: str
    """What the warm start and the backend did, line by line."""
    interrupted: bool = False
    """Whether an interrupt stopped the solve (the schedule is the best found until then)."""
    costs: Costs | None = field(default=None)
    """Where the profile's figures come from: the model and its partition, and the device memory."""

    @cached_property
    def step_times(self) -> StepTimes:
        """Step time with and without an optimizer barrier, and their bubbles."""
        return self.measured or step_times(self.timeline)

    @property
    def step_time(self) -> float:
        """One training step with an optimizer barrier: the makespan."""
        return self.timeline.makespan

    @property
    def step_time_no_barrier(self) -> float:
        """One training step when steps overlap (no barrier): the steady-state period."""
        return self.step_times.step_time_no_barrier

    @property
    def bubble_rate(self) -> float:
        """1 - total work / (devices x makespan)."""
        return self.timeline.bubble_rate

    @property
    def bound_met(self) -> bool:
        """Whether the schedule meets the lower bound: proven optimal, or within ``BOUND_MET`` of it where the
        bound is on times rounded for the solver."""
        return meets_bound(self.gap)

    @property
    def status_text(self) -> str:
        """The status as a reader takes it (``status_text``): "heuristic (bound met)" for a warm start that meets
        the bound."""
        return status_text(self.status, self.bound_met)

    @property
    def paper_bubble(self) -> float:
        """The paper's bubble rate: (max span - max work) / max span."""
        return self.timeline.paper_bubble

    @property
    def peak_memory(self) -> tuple[float, ...]:
        """Peak activation memory per device."""
        return self.timeline.peak_memory

    def title(self, name: str) -> str:
        """What was solved and which schedule was kept, as a chart's title names them: "NAME: the step time with
        barrier minimised by cpsat; the schedule kept is zb-h1's (cpsat found none shorter), proven optimal"."""
        maker = self.schedule.name
        kept = f"{maker}'s" + ("" if maker == self.solver or self.solver == "heuristic"
                               else f" ({self.solver} found none shorter)")
        proof = ("proven optimal" if self.status == "optimal" else "which meets the lower bound" if self.bound_met
                 else f"{self.gap:.1%} above the lower bound")
        return (f"{name}: the {FIGURES[OBJECTIVE_FIGURES[self.objective_kind]].name} minimised by {self.solver}; "
                f"the schedule kept is {kept}, {proof}" + (" (interrupted)" if self.interrupted else ""))

    def summary(self) -> dict[str, object]:
        """The headline figures as plain values: step times and bubbles first, then the paper's bubble; memory per
        device in GiB (static bytes, peak activations, their sum) when the profile is in bytes."""
        figures = {"solver": self.solver, "status": self.status, "objective": self.objective_kind,
                   "value": self.objective, "lower_bound": self.lower_bound, "gap": self.gap,
                   "bound_met": self.bound_met,
                   **self.step_times.figures(), "paper_bubble": self.paper_bubble, "makespan": self.timeline.makespan}
        if self.costs is not None and self.costs.in_bytes:
            figures.update(memory_figures(self.costs, self.timeline))
        else:
            figures["peak_memory"] = list(self.peak_memory)
        return {**figures, "solve_time": self.solve_time, "interrupted": self.interrupted}

    def to_json(self, path: str | Path | None = None, **stated: str) -> dict:
        """The schedule document with a "solver" section (and the costs' "partition" and "device_memory"), and the
        keys ``stated`` (the profile's ``time_unit`` and ``memory_unit``, docs/schedule-format.md); written to
        ``path`` (whole or not at all) when given."""
        extra = {**(costs_section(self.costs) if self.costs is not None else {}),
                 "solver": {**self.summary(), "log": self.solver_log}, **stated}
        return to_document(self.timeline, **extra) if path is None else write_document(self.timeline, path, **extra)


    def __repr__(self) -> str:
        return (f"SolveResult(status={self.status!r}, objective={self.objective:.6g}, gap={self.gap:.4g}, "
                f"solver={self.solver!r}, interrupted={self.interrupted})")
