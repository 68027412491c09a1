"""The step's objective, stated once: what one device's timeline adds up to, and the step over the devices.

With an optimizer barrier ("makespan", the default) a device's share of the step is the end of its last pass; for
the paper's post-validated runtime ("span") it is that end less the start of its first pass. Either way the share
takes the device's tail: the seconds after its last pass that still belong to its step (its gradients'
data-parallel synchronisation left exposed and the optimizer step, ``costmodel.step_tail``; 0 where none is given).
The step is the largest share. The simulator, the formulation (and through it the backends and the bounds), the
heuristic, the pair search and the planner read the step here, so a new term of a device's timeline is added here
once. The step time without a barrier, the steady-state period of back-to-back steps, is ``core.step_time``'s,
built on the simulator (it leaves the tail out).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal, TypeVar, get_args

from zbsolve.base.errors import InputError

Objective = Literal["makespan", "span"]
"""What a schedule is judged by: the makespan (one step with an optimizer barrier, the default) or the
longest per-device span (the paper's, for the post-validated runtime)."""
OBJECTIVES: tuple[str, ...] = get_args(Objective)

T = TypeVar("T", int, float)
"""A time: seconds, or the formulation's integer units."""


def check_objective(objective: str) -> str:
    """``objective`` when it is one of ``OBJECTIVES``; an ``InputError`` naming it otherwise."""
    if objective not in OBJECTIVES:
        raise InputError(f"objective = {objective!r} is unknown; choose one of {', '.join(OBJECTIVES)}")
    return objective


def offset(first_start: T, objective: str, tail: T | int = 0) -> T | int:
    """What a device's share subtracts from the end of its last pass: its first start for "span" (else 0), less
    its ``tail`` (seconds after its last pass that belong to its step)."""
    return (first_start if objective == "span" else 0) - tail


def device_share(first_start: T, last_end: T, objective: str, tail: T | int = 0) -> T:
    """One device's share of the step: the end of its last pass less ``offset`` (its ``tail`` added)."""
    return last_end - offset(first_start, objective, tail)


def step(shares: Iterable[T]) -> T:
    """The step: the largest device share (0 with no device)."""
    return max(shares, default=0)
