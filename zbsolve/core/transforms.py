"""Pure schedule transforms: each takes plain data and returns new data, nothing else.

In the manner of torch.distributed.pipelining's lowering passes, every step from one form of a
schedule to another is one small function here: split a fused BW into B then W, give a schedule
another memory limit, run F&B pairs' passes one after the other, run a 1F1B order combined (Megatron's
combined 1F1B), put the last stage's forwards in microbatch order for torch, and lower a schedule to torch's
compute-only actions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from zbsolve.base.checks import check_limit
from zbsolve.core.schedule import BW, B, F, Op, Pair, Pass, Schedule, W, passes_of


def split_bw(op: Op) -> tuple[Pass, ...]:
    """The B/W-split passes of an op: a BW becomes B then W; an F&B pair is refused by the caller."""
    if isinstance(op, Pair):
        raise TypeError(f"{op} is an F&B pair, not a pass")
    if op.kind == BW:
        return Pass(B, op.mb, op.stage), Pass(W, op.mb, op.stage)
    return (op,)


def with_limit(schedule: Schedule, mem_limit: float | Sequence[float] | None) -> Schedule:
    """The same orders under another memory limit (one number, one per device, or None)."""
    return replace(schedule, mem_limit=check_limit(mem_limit, schedule.num_devices))


def unpaired(schedule: Schedule) -> Schedule:
    """The same orders with each F&B pair run as its F, then its B: how a runtime that does not overlap a pair's
    passes runs it (torch's ``_PipelineScheduleRuntime`` runs an ``OVERLAP_F_B`` action's sub-actions, F then B,
    one after the other unless a function is registered for it)."""
    return replace(schedule, devices=tuple(tuple(p for op in ops for p in passes_of(op)) for ops in schedule.devices))


def combined(schedule: Schedule) -> Schedule:
    """A 1F1B order (each steady-state step a forward, then a backward) run as Megatron's combined 1F1B: each
    backward that a forward follows on its device runs with that forward as one overlapped F&B pair. So every device
    warms up with one forward more, and its steady-state step k runs the forward after the warm-up's with backward
    k, as megatron-core's ``get_pp_rank_microbatches`` (``overlap_moe_expert_parallel_comm``: one more warm-up
    forward) and ``forward_backward_helper_wrapper`` (the steady state's forward and backward given together to
    ``combined_1f1b_schedule_for_interleaved_pipelining``) run them; the drain's backwards run alone."""
    devices = []
    for ops in schedule.devices:
        out: list[Op] = []
        for op in ops:
            last = out[-1] if out else None
            if isinstance(op, Pass) and op.kind == F and isinstance(last, Pass) and last.kind in (B, BW):
                out[-1] = Pair(op, last)
            else:
                out.append(op)
        devices.append(tuple(out))
    return replace(schedule, devices=tuple(devices))


TORCH_KIND = {F: "F", B: "I", W: "W", BW: "B"}
"""zbsolve pass kind -> torch's computation type (torch's I is zbsolve's B, its B zbsolve's BW)."""


def repeat(schedule: Schedule, iterations: int) -> Schedule:
    """``iterations`` training steps back to back with no barrier between them: each device runs its orders of
    step 0, then of step 1, ..., step k's microbatch j being microbatch k * m + j. A step starts on a device as
    soon as that device is done with the previous one (a post-validated optimizer step)."""
    m = schedule.num_microbatches

    def shift(p: Pass, k: int) -> Pass:
        return Pass(p.kind, p.mb + k * m, p.stage)

    def shift_op(op: Op, k: int) -> Op:
        return Pair(shift(op.f, k), shift(op.b, k)) if isinstance(op, Pair) else shift(op, k)

    devices = tuple(tuple(shift_op(op, k) for k in range(iterations) for op in ops) for ops in schedule.devices)
    return replace(schedule, num_microbatches=iterations * m, devices=devices,
                   microbatch_route=schedule.microbatch_route * iterations)


def renumber_last_stage(schedule: Schedule) -> Schedule:
    """The same schedule with its microbatches renumbered so that the last stage runs its forwards in microbatch
    order, as torch's runtime needs; the gradient, a sum over microbatches, is unchanged. ``schedule`` must hold
    every forward of the last stage (a valid schedule does)."""
    last = schedule.num_stages - 1
    order = [p.mb for ops in schedule.devices for op in ops for p in passes_of(op) if p.kind == F and p.stage == last]
    new = {mb: i for i, mb in enumerate(order)}

    def renumber(op: Op) -> Op:
        if isinstance(op, Pair):
            return Pair(op.f._replace(mb=new[op.f.mb]), op.b._replace(mb=new[op.b.mb]))
        return op._replace(mb=new[op.mb])

    route = [0] * schedule.num_microbatches
    for mb, r in enumerate(schedule.microbatch_route):
        route[new[mb]] = r
    return replace(schedule, devices=tuple(tuple(renumber(op) for op in ops) for ops in schedule.devices),
                   microbatch_route=tuple(route))


def _torch_cell(p: Pass) -> str:
    return f"{p.stage}{TORCH_KIND[p.kind]}{p.mb}"


def torch_actions(schedule: Schedule) -> list[list[str]]:
    """Per device, torch's compute-only action strings for its ops, in order: ``{stage}{F|I|W|B}{mb}``, and
    ``({f};{b})OVERLAP_F_B`` for an F&B pair."""
    return [[f"({_torch_cell(op.f)};{_torch_cell(op.b)})OVERLAP_F_B" if isinstance(op, Pair) else _torch_cell(op)
             for op in ops] for ops in schedule.devices]
