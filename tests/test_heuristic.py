"""Tests of the paper's heuristic scheduler (zbsolve.schedulers.heuristic)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import ICLR, limits_of, span_bubble, stem
from zbsolve.base.errors import InfeasibleError, InputError
from zbsolve.schedulers.heuristic import heuristic
from zbsolve.schedulers.one_at_a_time import min_feasible_limits
from zbsolve.core.placement import bidirectional, interleaved, sequential, vshape
from zbsolve.problem.problem_file import Problem
from zbsolve.core.profile import UNIT, Profile
from zbsolve.core.simulator import simulate

FEW = settings(max_examples=40, deadline=None)


def check(schedule, limit) -> object:
    """Validate ``schedule`` and its memory against ``limit`` (number, list or None)."""
    timeline = simulate(schedule)
    assert schedule.name == "heuristic"
    assert schedule.mem_limit == (tuple(limit) if isinstance(limit, list) else limit)
    if limit is not None:
        for peak, lim in zip(timeline.peak_memory, limits_of(limit, schedule.num_devices)):
            assert peak <= lim * (1 + 1e-9)
    return timeline


@st.composite
def sequential_profiles(draw, max_p: int = 4) -> tuple[Profile, int, list[float]]:
    """A random per-stage profile, its p, and each stage's min feasible memory max(M_B, M_W)."""
    p = draw(st.integers(1, max_p))
    times = st.lists(st.floats(0.1, 3.0), min_size=p, max_size=p)
    m_b = draw(st.lists(st.floats(0.1, 2.0), min_size=p, max_size=p))
    m_w = [b * x for b, x in zip(m_b, draw(st.lists(st.floats(0.0, 1.5), min_size=p, max_size=p)))]
    profile = Profile.from_paper(draw(times), draw(times), draw(times), draw(st.floats(0.0, 1.0)), m_b, m_w)
    return profile, p, [max(b, w) for b, w in zip(m_b, m_w)]


@pytest.mark.parametrize("path", ICLR, ids=stem)
@pytest.mark.parametrize("name,factor", [("zb-1p", 1), ("zb-2p", 2)])
def test_iclr_close_to_published(path: Path, name: str, factor: int) -> None:
    problem = Problem.load(path)
    p = problem.num_devices
    limit = factor * p * problem.profile.stage_value("mem_f", 0)
    timeline = check(heuristic(problem.profile, sequential(p), problem.num_microbatches, limit), limit)
    assert timeline.paper_bubble == pytest.approx(problem.published[name], abs=1e-3)


@pytest.mark.parametrize("p", range(1, 7))
@pytest.mark.parametrize("rounds", [1, 2, 3])
def test_unit_profile_at_least_zb_h1_with_p_mb(p: int, rounds: int) -> None:
    m = rounds * p
    timeline = check(heuristic(UNIT, sequential(p), m, p * 1.0), p * 1.0)
    assert span_bubble(timeline) <= (p - 1) * (1 + 1 - 1) + 1e-9


@pytest.mark.parametrize("p", range(1, 7))
@pytest.mark.parametrize("rounds", [2, 3])
def test_unit_profile_at_least_zb_h2_with_2p_mb(p: int, rounds: int) -> None:
    m = rounds * p
    timeline = check(heuristic(UNIT, sequential(p), m, 2.0 * p), 2.0 * p)
    assert span_bubble(timeline) <= (p - 1) * (1 + 1 - 2 * 1) + 1e-9


def test_unlimited_memory_unit_profile_has_no_bubble() -> None:
    timeline = check(heuristic(UNIT, sequential(4), 12), None)
    assert span_bubble(timeline) == pytest.approx(0.0, abs=1e-9)


def test_heterogeneous_last_stage_slower() -> None:
    p, m = 4, 12
    slow = [1.0] * (p - 1) + [1.4]
    profile = Profile(t_f=slow, t_b=slow, t_w=[0.5 * t for t in slow], t_comm=0.05)
    timeline = check(heuristic(profile, sequential(p), m, p * 1.0), p * 1.0)
    assert span_bubble(timeline) <= (p - 1) * (1.4 + 1.4 - 0.5) + 2 * (p - 1) * 0.05
    for limit in (2.0 * p, None):
        timeline = check(heuristic(profile, sequential(p), m, limit), limit)
        assert span_bubble(timeline) == pytest.approx(0.0, abs=1e-9)


def test_same_input_same_schedule() -> None:
    profile = Profile(t_f=[1.0, 1.2, 0.9], t_b=[1.1, 1.0, 1.3], t_w=[0.5, 0.7, 0.4], t_comm=0.1)
    assert heuristic(profile, sequential(3), 7, 3.0) == heuristic(profile, sequential(3), 7, 3.0)


@FEW
@given(sequential_profiles(), st.integers(1, 6), st.sampled_from(["none", "uniform", "per-device"]),
       st.lists(st.floats(1.0, 3.0), min_size=4, max_size=4))
def test_random_profiles_validate_within_the_limit(case, m: int, kind: str, factors: list[float]) -> None:
    profile, p, need = case
    if kind == "none":
        limit = None
    elif kind == "uniform":
        limit = max(need) * factors[0]
    else:
        limit = [n * f for n, f in zip(need, factors)]
    check(heuristic(profile, sequential(p), m, limit), limit)


@FEW
@given(sequential_profiles(), st.integers(1, 5), st.floats(0.01, 0.9))
def test_below_min_feasible_raises_and_min_feasible_works(case, m: int, short: float) -> None:
    profile, p, need = case
    with pytest.raises(InfeasibleError, match="smallest feasible limit") as info:
        heuristic(profile, sequential(p), m, max(need) * (1 - short))
    assert info.value.min_feasible == pytest.approx(max(need))
    check(heuristic(profile, sequential(p), m, info.value.min_feasible), info.value.min_feasible)


def test_one_device_below_its_need_raises() -> None:
    profile = Profile.from_paper(1.0, 1.0, 1.0, 0.0, [1.0, 2.0, 1.0], [0.5, 1.0, 0.5])
    with pytest.raises(InfeasibleError, match="device 1") as info:
        heuristic(profile, sequential(3), 4, [3.0, 1.5, 3.0])
    assert info.value.min_feasible == pytest.approx(2.0)


@pytest.mark.parametrize("make", [vshape, interleaved], ids=["vshape", "interleaved"])
@pytest.mark.parametrize("p", [2, 4])
def test_two_chunks_per_device(make, p: int) -> None:
    profile = UNIT.expand(p).split_chunks(2)
    placement = make(p)
    assert min_feasible_limits(profile, placement) == pytest.approx([1.0] * p)
    with pytest.raises(InfeasibleError):
        heuristic(profile, placement, 2 * p, 0.99)
    for limit in (1.0, p * 1.0, 2.0 * p, None):
        timeline = check(heuristic(profile, placement, 3 * p, limit), limit)
        if limit is not None and limit >= p:
            assert span_bubble(timeline) <= (p - 1) * (1 + 1 - 1) + 1e-9


@FEW
@given(st.integers(1, 4), st.integers(2, 3), st.integers(1, 8), st.sampled_from([vshape, interleaved]),
       st.randoms(use_true_random=False), st.sampled_from([None, 1.0, 1.5, 3.0]))
def test_random_multi_chunk_profiles_validate(p: int, chunks: int, m: int, make, rng, factor) -> None:
    placement = make(p, chunks)
    S = placement.num_stages
    m_b = [rng.uniform(0.1, 2.0) for _ in range(S)]
    profile = Profile.from_paper([rng.uniform(0.1, 2.0) for _ in range(S)], [rng.uniform(0.1, 2.0) for _ in range(S)],
                                 [rng.uniform(0.1, 2.0) for _ in range(S)], rng.choice([0.0, 0.3]),
                                 m_b, [b * rng.uniform(0.0, 1.0) for b in m_b])
    limit = None if factor is None else max(min_feasible_limits(profile, placement)) * factor
    check(heuristic(profile, placement, m, limit), limit)


def test_bad_input() -> None:
    with pytest.raises(InputError, match="bidirectional"):
        heuristic(UNIT, bidirectional(4), 8)
    with pytest.raises(InputError, match="num_microbatches"):
        heuristic(UNIT, sequential(4), 0)
    with pytest.raises(InputError, match="mem_limit has 3 entries"):
        heuristic(UNIT, sequential(4), 8, [4.0, 4.0, 4.0])
    with pytest.raises(InputError, match="mem_limit"):
        heuristic(UNIT, sequential(4), 8, math.nan)
    with pytest.raises(InputError, match="stages"):
        heuristic(Profile(t_f=[1.0, 1.0]), sequential(4), 8)
