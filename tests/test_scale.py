"""Tests of size: problems over ``MAX_PASSES`` refused up front, deadlines of the heuristic and the V-shape
greedy, and large-ish schedules simulated to their closed forms (no wall-clock assertions)."""

from __future__ import annotations

import time

import pytest

from conftest import span_bubble
from zbsolve import heuristic as heuristic_module
from zbsolve.checks import MAX_PASSES, check_size
from zbsolve.errors import BudgetError, InputError
from zbsolve.families import make_schedule
from zbsolve.heuristic import heuristic
from zbsolve.placement import sequential, vshape
from zbsolve.profile import UNIT, Profile
from zbsolve.simulator import simulate
from zbsolve.spec import make_spec
from zbsolve.vgreedy import v_greedy

STAGES = 64
BIGGEST = MAX_PASSES // (3 * STAGES)
"""The most microbatches ``STAGES`` stages may have."""


def test_check_size_counts_passes_up_to_the_limit() -> None:
    assert check_size(STAGES, BIGGEST) == 3 * STAGES * BIGGEST <= MAX_PASSES
    with pytest.raises(InputError, match=f"would be {3 * STAGES * (BIGGEST + 1):,} passes; the limit is {MAX_PASSES:,}"):
        check_size(STAGES, BIGGEST + 1)


def test_entry_points_refuse_too_many_passes_up_front() -> None:
    with pytest.raises(InputError, match="the limit is"):
        make_schedule("zb-h1", UNIT, STAGES, BIGGEST + 1)
    with pytest.raises(InputError, match="the limit is"):
        heuristic(UNIT, sequential(STAGES), BIGGEST + 1, STAGES * 1.0)
    with pytest.raises(InputError, match="the limit is"):
        make_spec(UNIT, None, num_microbatches=BIGGEST + 1, num_devices=STAGES)


def test_two_chunk_entry_points_count_both_chunks() -> None:
    p, m = STAGES // 2, BIGGEST + 1
    assert check_size(p, m)
    with pytest.raises(InputError, match=f"{2 * p} stages"):
        make_schedule("zb-v", UNIT, p, m)
    with pytest.raises(InputError, match=f"{2 * p} stages"):
        v_greedy(UNIT, p, m)
    with pytest.raises(InputError, match=f"{2 * p} stages"):
        heuristic(UNIT.per_chunk(p, 2), vshape(p), m)
    with pytest.raises(InputError, match=f"{2 * p} stages"):
        make_spec(UNIT, None, num_microbatches=m, num_devices=p, placement="vshape")


COMM = Profile(t_f=1.0, t_b=1.5, t_w=0.5, t_comm=0.1)
"""A small problem on which the heuristic tries several variants (4 devices, 8 microbatches, limit 8 M_B)."""


def test_heuristic_past_its_deadline_finds_nothing() -> None:
    with pytest.raises(BudgetError, match="before its first variant finished") as caught:
        heuristic(COMM, sequential(4), 8, 8.0, deadline=time.monotonic() - 1.0)
    assert isinstance(caught.value, TimeoutError)


def test_heuristic_within_its_deadline_is_unchanged() -> None:
    without = heuristic(COMM, sequential(4), 8, 8.0)
    within = heuristic(COMM, sequential(4), 8, 8.0, deadline=time.monotonic() + 3600.0)
    assert within.devices == without.devices


def test_heuristic_stops_trying_variants_once_its_deadline_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    runs: list[float | None] = []
    run = heuristic_module._Run.run
    monkeypatch.setattr(heuristic_module._Run, "run", lambda self, deadline=None: runs.append(deadline) or run(self, deadline))
    heuristic(COMM, sequential(4), 8, 8.0)
    assert len(runs) > 1
    runs.clear()
    looks = iter([0.0])
    monkeypatch.setattr(heuristic_module.time, "monotonic", lambda: next(looks, 2.0))
    schedule = heuristic(COMM, sequential(4), 8, 8.0, deadline=1.0)
    assert runs == [1.0]
    assert simulate(schedule).peak <= 8.0


def test_v_greedy_deadline() -> None:
    with pytest.raises(BudgetError, match="before its first run finished"):
        v_greedy(UNIT, 4, 8, 4.0, deadline=time.monotonic() - 1.0)
    within = v_greedy(UNIT, 4, 8, 4.0, deadline=time.monotonic() + 3600.0)
    assert within is not None and within.devices == v_greedy(UNIT, 4, 8, 4.0).devices


@pytest.mark.parametrize("name, bubble, peak", [("zb-h1", 15.0, 16.0), ("zb-h2", 0.0, 31.0), ("1f1b", 45.0, 16.0),
                                                ("zb-v", 0.0, 16.0)])
def test_large_family_closed_form(name: str, bubble: float, peak: float) -> None:
    """p = 16, m = 256, unit profile: each family's docstring's bubble (max span - max work) and peak."""
    timeline = simulate(make_schedule(name, UNIT, 16, 256))
    assert max(timeline.work) == pytest.approx(256 * 3.0)
    assert span_bubble(timeline) == pytest.approx(bubble, abs=1e-9)
    assert timeline.peak == pytest.approx(peak)
    assert timeline.memory[0][-1][1] == pytest.approx(0.0)
