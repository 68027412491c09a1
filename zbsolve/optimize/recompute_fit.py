"""Per-stage recomputation chosen for one partition: for each of a few orders that hold little memory (the
placement's handcrafted families, and the heuristic's under ``REFERENCE_FACTORS`` x 1F1B's peak, all without
whole-block recomputation, every block selective where asked), the fewest blocks per stage recomputed whole that
let that order fit every device's memory (a device's blocks added one at a time where they lower its
peak most per second of recomputed forward); of these, the choice whose step under the real limits is shortest
(timed as the caller says: ``solve`` times each by its warm starts).

The order is the reference's, so each device's peak is a running sum over its own stages only and every device is
fitted alone; the heuristic then schedules the chosen costs under the real limits (longer B, other orders), and
the simulator judges the result."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial

from zbsolve.base.checks import exceeds
from zbsolve.base.errors import ZbsolveError
from zbsolve.core.memory import peak
from zbsolve.core.placement import CHUNKS, Placement
from zbsolve.core.schedule import Schedule
from zbsolve.core.spec import Spec
from zbsolve.costmodel.model import Model
from zbsolve.problem.memory_factor import reference_peak
from zbsolve.problem.partition import stage_profile
from zbsolve.problem.recompute import Recompute, first_blocks, parse_recompute, stage_blocks
from zbsolve.problem.request import Request, resolve
from zbsolve.schedulers.families import PLACEMENT_FAMILIES, make_schedule
from zbsolve.schedulers.heuristic import heuristic

REFERENCE_FACTORS = (1.0, 2.0)
"""The memory limits of the reference orders, as multiples of 1F1B's peak (1: ZB-H1's, 2: ZB-H2's)."""


def fit_recompute(model: Model, request: Request, step: Callable[[Request], float]) -> Recompute:
    """The per-stage recomputation (the first N_s blocks of each stage s, the others selective where ``request``
    says "selective+per-stage") of ``request``'s partition whose step, timed by ``step``, is shortest among the
    fits of the reference orders and no recomputation; none where no device memory is given."""
    selective = parse_recompute(request.recompute).selective
    plain = request.model_copy(update={"recompute": "selective" if selective else "none"})
    spec, costs = resolve(model, plain)
    placement, m = spec.placement, spec.num_microbatches
    zero = Recompute("per-stage", per_stage=(0,) * placement.num_stages, selective=selective)
    if costs.device_memory is None:
        return zero
    budgets = costs.limits()
    peak = reference_peak(spec.profile, placement.num_devices, m, spec.chunks)
    fits = [Recompute("per-stage", per_stage=_fit(model, costs.ranges, placement, order, budgets, selective),
                      selective=selective)
            for order in _references(spec, peak)]
    timed = {choice: step(request.model_copy(update={"recompute": str(choice)}))
             for choice in dict.fromkeys([zero._replace(selective=False), zero, *fits])}
    return min(timed, key=lambda choice: (timed[choice], sum(choice.per_stage)))


def _references(spec: Spec, peak: float) -> list[Schedule]:
    """The orders fitted: the placement's families (``PLACEMENT_FAMILIES``) and the heuristic's under each
    reference limit, on the costs without recomputation (those that exist)."""
    p, m = spec.placement.num_devices, spec.num_microbatches
    families = PLACEMENT_FAMILIES.get(spec.placement_name, ()) if spec.chunks in (1, CHUNKS) else ()
    orders = []
    for make in [*(partial(make_schedule, name, spec.profile, p, m) for name in families),
                 *(partial(heuristic, spec.profile, spec.placement, m, factor * peak) for factor in REFERENCE_FACTORS)]:
        try:
            orders.append(make())
        except ZbsolveError:
            continue
    return orders


def _fit(model: Model, ranges: Sequence[tuple[int, int]], placement: Placement, order: Schedule,
         budgets: Sequence[float], selective: bool) -> tuple[int, ...]:
    """Per stage, the blocks that recompute whole so that ``order`` fits ``budgets`` (every block of a device that
    cannot fit; the others selective where ``selective``), each device's peak by the one memory rule
    (``core.memory.levels``)."""
    blocks = stage_blocks(model, ranges)
    chosen = [0] * len(ranges)

    def peak_with(d: int, s: int, n: int) -> float:
        counts = [n if stage == s else k for stage, k in enumerate(chosen)]
        whole = first_blocks(blocks, counts)
        rest = {i for stage in blocks for i in stage} - whole if selective else ()
        profile = stage_profile(model, ranges, whole, rest)
        return peak(replace(order, profile=profile), d)

    for d, budget in enumerate(budgets):
        mine = [s for r, s in placement.stages_of(d) if r == 0]
        top = peak_with(d, -1, 0)
        while exceeds(top, budget):
            room = [s for s in mine if chosen[s] < len(blocks[s])]
            if not room:
                break
            trials = {s: peak_with(d, s, chosen[s] + 1) for s in room}
            s = max(room, key=lambda s: ((top - trials[s]) / model.layers[blocks[s][chosen[s]]].t_f,
                                         -model.layers[blocks[s][chosen[s]]].t_f))
            chosen[s] += 1
            top = trials[s]
    return tuple(chosen)
