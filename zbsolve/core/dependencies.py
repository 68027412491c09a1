"""The dependency rule, written once: what each pass waits for, and the lag of crossing devices.

Every module that times or orders passes (the simulator, the formulation, the heuristic, the
V-shape greedy, the families, the bounds) asks this module, so a new pass kind or a new lag is a
change here alone.
"""

from __future__ import annotations

from typing import TypeVar

from zbsolve.core.schedule import BACKWARD, B, F, Pass

Time = TypeVar("Time", int, float)
"""Seconds, or the solver's integer time units: a lag is of the type the transfer time is."""


def dependencies(p: Pass, num_stages: int) -> tuple[Pass, ...]:
    """The passes ``p`` waits for: an F the previous stage's F; a B (or BW) the next stage's backward,
    or on the last stage its own F; a W its own B. A backward is named B whether it runs as B or BW."""
    if p.kind == F:
        return (Pass(F, p.mb, p.stage - 1),) if p.stage > 0 else ()
    if p.kind in BACKWARD:
        return (Pass(B, p.mb, p.stage + 1),) if p.stage < num_stages - 1 else (Pass(F, p.mb, p.stage),)
    return (Pass(B, p.mb, p.stage),)


def identity(p: Pass) -> Pass:
    """The name other passes depend on: B and BW are both the backward of (microbatch, stage)."""
    return Pass(B, p.mb, p.stage) if p.kind in BACKWARD else p


def lag(t_comm: Time, producer_device: int, consumer_device: int) -> Time:
    """Time between a dependency's end and its consumer's earliest start: ``t_comm`` across devices."""
    return t_comm if producer_device != consumer_device else 0
