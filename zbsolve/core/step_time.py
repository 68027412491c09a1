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
from zbsolve.core.simulator import Timeline, back_to_back

MAX_ITERATIONS = 16
"""Back-to-back steps timed at most while looking for the steady-state period."""


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
    the steps that follow it (timing is as soon as possible), so the steps are timed one after another
    (``simulator.back_to_back``) until two growths agree."""
    steps, devices = back_to_back(timeline.schedule), timeline.schedule.devices
    spans: list[float] = []
    while True:
        spans.append(step(device_share(0.0, end, "makespan") for end, ops in zip(next(steps), devices) if ops))
        settled = len(spans) >= 3 and abs((spans[-1] - spans[-2]) - (spans[-2] - spans[-3])) <= slack(spans[-1])
        if settled or len(spans) == MAX_ITERATIONS:
            return spans[-1] - spans[-2]


def step_times(timeline: Timeline) -> StepTimes:
    """The step times of a simulated schedule."""
    period = steady_period(timeline)
    return StepTimes(timeline.makespan, period, timeline.bubble_rate, bubble(timeline.work, period))
