"""Step time: what one training step costs, with and without an optimizer barrier.

With a barrier (global gradient-norm clipping all-reduces across the pipeline before any stage
steps) a step is the makespan of one iteration. Without one (the post-validated optimizer step) a
device starts the next step's passes once it is done with its own, so steps overlap and a step
costs the steady-state period: the growth of the makespan per iteration of back-to-back steps,
simulated until it settles.
"""

from __future__ import annotations

from dataclasses import dataclass

from zbsolve.base.checks import slack
from zbsolve.core.measures import bubble
from zbsolve.core.objective import device_share, step
from zbsolve.core.simulator import Timeline, simulate
from zbsolve.core.transforms import repeat

MAX_ITERATIONS = 16
"""Back-to-back steps simulated at most while looking for the steady-state period."""
FIRST_ITERATIONS = 4
"""Back-to-back steps simulated first: most schedules settle within them."""


@dataclass(frozen=True)
class StepTimes:
    """A schedule's step time with and without an optimizer barrier, and the bubbles they leave."""

    step_time: float
    """One step with the barrier: the makespan."""
    step_time_no_barrier: float
    """One step when steps overlap: the steady-state period of back-to-back steps."""
    bubble: float
    """1 - work / (devices x step_time)."""
    bubble_no_barrier: float
    """1 - work / (devices x step_time_no_barrier)."""

    def figures(self) -> dict[str, float]:
        """The four figures as plain values (the barrier's bubble is the timeline's ``bubble_rate``)."""
        return {"step_time": self.step_time, "step_time_no_barrier": self.step_time_no_barrier,
                "bubble_rate": self.bubble, "bubble_no_barrier": self.bubble_no_barrier}


def steady_period(timeline: Timeline) -> float:
    """The makespan's growth per step once back-to-back steps (no barrier) settle: the growth at the first of 2,
    3, ... steps where two successive growths agree, or at ``MAX_ITERATIONS`` steps. Each step ends no later for
    the steps that follow it (timing is as soon as possible), so one simulation of k steps gives the makespans of
    1 to k; k doubles from ``FIRST_ITERATIONS`` until the growths agree."""
    schedule = timeline.schedule
    k = FIRST_ITERATIONS
    while True:
        repeated = simulate(repeat(schedule, k))
        spans = [step(device_share(0.0, end[(i + 1) * len(ops) - 1], "makespan")
                      for end, ops in zip(repeated.end, schedule.devices) if ops) for i in range(k)]
        growth = [b - a for a, b in zip(spans, spans[1:])]
        for g, h, span in zip(growth, growth[1:], spans[2:]):
            if abs(h - g) <= slack(span):
                return h
        if k == MAX_ITERATIONS:
            return growth[-1]
        k = min(2 * k, MAX_ITERATIONS)


def step_times(timeline: Timeline) -> StepTimes:
    """The step times of a simulated schedule."""
    period = steady_period(timeline)
    return StepTimes(timeline.makespan, period, timeline.bubble_rate, bubble(timeline.work, period))
