"""What a plan keeps and what it claims: never a schedule slower than one its search timed (the final solves build
theirs again, with less time), and a bound that is never 0 for want of time: the devices' work shared evenly at
least, or unknown (None, "unknown" in tables, null in JSON) where none was computed."""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import json

import pytest

from conftest import heavy_head
from zbsolve.core.placement import interleaved
from zbsolve.core.schedule import build
from zbsolve.core.simulator import simulate
from zbsolve.planning import planner
from zbsolve.planning.planner import plan
from zbsolve.planning.result import Baseline, Candidate
from zbsolve.planning.split_bound import Figures, split_bound
from zbsolve.present.figures import shown
from zbsolve.schedulers.one_at_a_time import one_at_a_time

REAL_SOLVE = planner.solve_request


def one_microbatch_at_a_time(model, request, progress=None, document=True):
    """A final solve that comes back with a slower schedule than the search timed on the same candidate (as one
    given less time can): the candidate's schedule with one microbatch at a time, re-simulated."""
    result = REAL_SOLVE(model, request.model_copy(update={"solver": "heuristic"}), progress, document=document)
    own = result.schedule
    slower = simulate(build("one-at-a-time", own.placement, own.num_microbatches, own.profile,
                            one_at_a_time(own.placement, own.num_microbatches), own.mem_limit))
    return dataclasses.replace(result, schedule=slower.schedule, timeline=slower, solver="cpsat")


@pytest.fixture(scope="module")
def kept():
    """A plan whose final solves each return a slower schedule than the search timed on their candidate."""
    with pytest.MonkeyPatch.context() as patch, cf.ThreadPoolExecutor(1) as pool:
        patch.setattr(planner, "solve_request", one_microbatch_at_a_time)
        patch.setattr(planner, "local_search", lambda *args: None)  # the time left goes to the final solves
        return plan(heavy_head(), num_devices=4, num_microbatches=8, device_memory="16GiB", reserve=0,
                    placement="sequential", time_limit=30, executor=pool)


def test_a_plan_is_never_slower_than_a_schedule_its_search_timed(kept):
    log = kept.log.splitlines()
    finals = [line for line in log if line.startswith("cpsat on ")]
    assert finals, kept.log  # the final solves ran, and came back slower
    best = min(c.step_time for c in kept.candidates)
    assert all(float(line.rsplit(": ", 1)[1].split("s ")[0]) > best for line in finals), kept.log
    assert kept.step_time <= best * (1 + 1e-9) and kept.source != "cpsat"
    assert simulate(kept.timeline.schedule).makespan == kept.step_time
    assert log[-1].startswith(f"kept: {kept.source} on sequential x1 {list(kept.counts)}: ")
    assert kept.lower_bound is not None and kept.lower_bound <= kept.step_time


def test_a_bound_not_computed_is_unknown_never_zero(kept):
    unknown = dataclasses.replace(kept, lower_bound=None)
    assert unknown.gap is None and "gap=unknown" in repr(unknown)
    summary = unknown.summary()
    assert summary["lower_bound"] is None and summary["gap"] is None
    rows = shown(summary)
    assert [value for name, value in rows.items() if name.startswith(("lower bound", "gap"))] == ["unknown"] * 2
    section = json.loads(json.dumps(unknown.to_json()))["plan"]
    assert section["lower_bound"] is None and section["gap"] is None


def test_a_split_bound_out_of_time_is_at_least_the_devices_work_shared_evenly():
    """A split model of 64 stages given a hundredth of a second proves little of its own: its bound is still the
    devices' work shared evenly (every partition's busiest device has at least that), never 0."""
    model, layout, m = heavy_head(blocks=78, head=2.0), interleaved(8, 8), 16
    found = split_bound(model, layout, m, time_limit=0.01)
    even = Figures.of(model, layout, m).even_share()
    assert even > 0 and found.bound >= even
    work = sum(x.t_f + x.t_b + x.t_w for x in model.layers)
    assert even == pytest.approx(m * work / 8)


def _baseline(step: float) -> Baseline:
    return Baseline("torchtitan", "DualPipeV", (2, 3, 3, 2), step, 0.1, (1.0,) * 2, True, recompute="full", chunks=2,
                    recomputed=(1, 1, 1, 1))


def test_the_best_baseline_is_the_first_finalist_where_it_beats_every_candidate():
    """Its split, placement and recomputation go first to the final solves where it is faster than every
    candidate the search timed (the same candidate timed by the search not twice), else the candidates stand."""
    ranked = [Candidate("vshape", 2, (2, 3, 3, 2), "move", 5.0, "full"),
              Candidate("sequential", 1, (5, 5), "move", 6.0)]
    first, *rest = planner._from_baseline(_baseline(4.0), ranked)
    assert (first.key(), first.origin, first.step_time) == (ranked[0].key(), planner.BASELINE, 4.0)
    assert rest == ranked[1:]
    assert planner._from_baseline(_baseline(5.0), ranked) == ranked
    assert planner._from_baseline(None, ranked) == ranked
    assert planner._from_baseline(_baseline(4.0), [])[0].origin == planner.BASELINE
