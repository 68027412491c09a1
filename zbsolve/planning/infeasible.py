"""Why no plan fits: the error a plan raises where no candidate and no baseline fits the device memory, naming what
the time limit left untimed, what the candidate closest to fitting lacks and what would help."""

from __future__ import annotations

from zbsolve.base.errors import InfeasibleError
from zbsolve.base.units import gib
from zbsolve.core.placement import make_placement
from zbsolve.planning.baselines import NOT_TIMED
from zbsolve.planning.result import Baseline, choice_label
from zbsolve.planning.runs import BaselineSetting
from zbsolve.planning.search import Search
from zbsolve.problem.costs import model_costs
from zbsolve.problem.recompute import FULL, parse_recompute
from zbsolve.schedulers.one_at_a_time import min_feasible_limits


def nothing_fits(search: Search, options: list[tuple[str, int, str]], rows: list[Baseline],
                 setting: BaselineSetting) -> InfeasibleError:
    """The error of a plan where no candidate of ``search`` and no baseline of ``rows`` fits: which ``options``
    (placement, stages per device, recomputation) and rows were not timed within the time limit, and what the
    candidate closest to fitting lacks."""
    untimed_rows = sum(b.note == NOT_TIMED for b in rows)
    skipped = [choice_label(*option) for option in options if not any(k[:3] == option for k in search.timed)]
    left = ([f"{len(skipped)} of {len(options)} placement and recomputation choices "
             f"({', '.join(skipped[:3])}{', ...' if len(skipped) > 3 else ''})"] * bool(skipped)
            + [f"{untimed_rows} of {len(rows)} baselines"] * bool(untimed_rows))
    not_timed = f"; {' and '.join(left)} not timed within the time limit: a longer one times them" if left else ""
    return InfeasibleError(f"no partition of {setting.model.name} over {setting.num_devices} devices "
                           f"{'timed ' * bool(not_timed)}fits device_memory {gib(setting.device_memory):.2f} GiB "
                           f"(reserve {gib(setting.reserve):.2f} GiB) with any placement searched"
                           f"{_closest(search, not not_timed)}{not_timed}")


def _closest(search: Search, complete: bool) -> str:
    """What the candidate closest to fitting lacks (the device, its static bytes, one microbatch's activations and
    the reserve over the device memory) and, where the search was ``complete`` (every choice and baseline timed),
    what would help; nothing when no candidate was timed."""
    misses = []
    for pl, c, rc, counts in search.timed:
        r = search.request
        layout = make_placement(pl, search.num_devices, c)
        choice = parse_recompute(rc)  # per-stage counts not chosen yet: its least memory is every block's
        profile, costs = model_costs(search.model, layout, counts, r.device_memory, r.reserve,
                                     FULL if choice.undecided else choice)
        per_device = [{"static": static, "one microbatch's activations": need}
                      for static, need in zip(costs.static_bytes, min_feasible_limits(profile, layout))]
        d = max(range(search.num_devices), key=lambda d: costs.over(per_device[d]))
        misses.append((costs.over(per_device[d]), pl, c, rc, counts, costs, d, per_device[d]))
    if not misses:
        return ""
    _, pl, c, rc, counts, costs, d, uses = min(misses, key=lambda miss: miss[0])
    closest = f"; the closest, {choice_label(pl, c, rc)} {list(counts)}: {costs.shortfall(d, uses)}"
    if not complete:
        return closest
    if costs.over({"static": uses["static"]}) > 0:
        helps = "more devices, or weights and optimizer states sharded further (zbsolve estimate --tp, --zero)"
    else:
        helps = ("more devices, a smaller microbatch or a shorter sequence (every candidate already runs one "
                 "microbatch at a time where it must, and no baseline fits with every block recomputed)")
    return f"{closest}; what would help: {helps}"
