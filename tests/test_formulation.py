"""The integer formulation, the lower bound and both backends against brute force on tiny problems."""

from __future__ import annotations

from fractions import Fraction

import pytest

from conftest import ICLR, brute_force, objective_of, problem, serial_order, stem
from zbsolve.optimize.backends.cbc import solve_cbc
from zbsolve.optimize.backends.cpsat import solve_cpsat
from zbsolve.optimize.bound import lower_bound, warmup_bound
from zbsolve.base.errors import InputError, MemoryLimitError
from zbsolve.schedulers.families import make_schedule
from zbsolve.optimize.formulation import formulate
from zbsolve.schedulers.heuristic import heuristic
from zbsolve.core.placement import sequential, vshape
from zbsolve.problem.problem_file import Problem
from zbsolve.core.profile import UNIT, Profile
from zbsolve.core.schedule import B, F, W
from zbsolve.core.simulator import simulate

PROFILE_1_5B = Profile.from_paper(T_F=18522, T_B=18086, T_W=9337, T_comm=601, M_B=201216, M_W=73728)
SKEWED = Profile(t_f=[1.0, 1.5], t_b=[1.0, 2.0], t_w=[0.5, 1.0], t_comm=0.25)


def test_times_and_memory_scale_to_exact_integers():
    form = formulate(PROFILE_1_5B, sequential(4), 4, 4 * 201216)
    assert form.time_scale == 1 and form.exact_time
    mf, mb, mw = (form.mem_delta[form.index_of(k, 0, 0)] for k in (F, B, W))
    assert (mf * form.mem_unit, mb * form.mem_unit, mw * form.mem_unit) == (201216, -127488, -73728)
    assert Fraction(mf).denominator == 1 and abs(mf) > 1
    assert form.limit == (4 * mf,) * 4
    quarter = formulate(Profile(t_f=0.25, t_b=0.5, t_w=0.75, t_comm=0.1), sequential(2), 2)
    assert quarter.time_scale == 100 and quarter.exact_time
    assert quarter.duration[quarter.index_of(F, 0, 0)] == 25
    assert not formulate(Profile(t_f=1 / 3), sequential(2), 2).exact_time


def test_memory_check_agrees_with_the_simulator():
    schedule = make_schedule("zb-h2", UNIT, 4, 8)
    peak = max(simulate(schedule).peak_memory)
    for limit in (peak - 0.5, peak - 1e-12, peak, peak + 0.25):
        form = formulate(UNIT, sequential(4), 8, limit)
        ok = form.memory_ok(form.order_of(schedule))
        try:
            simulate(form.schedule(form.order_of(schedule), "x"))
            assert ok
        except MemoryLimitError:
            assert not ok


@pytest.mark.parametrize("family", ["zb-h1", "zb-h2", "1f1b"])
@pytest.mark.parametrize("profile", [PROFILE_1_5B, UNIT])
def test_asap_matches_the_simulator(family, profile):
    schedule = make_schedule(family, profile, 4, 8)
    form = formulate(profile, sequential(4), 8)
    order = form.order_of(schedule)
    start = form.asap(order)
    timeline = simulate(form.schedule(order, "x"))
    assert timeline.makespan <= simulate(schedule).makespan
    for d, seq in enumerate(order):
        assert [start[i] for i in seq] == [t * form.time_scale for t in timeline.start[d]]
    assert form.value(start) == max(timeline.span) * form.time_scale


def test_order_of_splits_bw_and_first_last_passes():
    form = formulate(UNIT, sequential(3), 4)
    order = form.order_of(make_schedule("1f1b", UNIT, 3, 4))
    assert sorted(i for seq in order for i in seq) == list(range(len(form.passes)))
    for d in range(3):
        assert form.passes[form.first[d]] == (F, 0, d) and [form.passes[i] for i in form.last[d]] == [(W, 3, d)]
        assert order[d][0] == form.first[d] and order[d][-1] in form.last[d]


def test_earliest_and_latest_bracket_every_schedule():
    form = formulate(SKEWED, sequential(2), 4)
    for family in ("zb-h1", "zb-h2", "1f1b"):
        start = form.asap(form.order_of(make_schedule(family, SKEWED, 2, 4)))
        latest = form.latest(form.value(start))
        assert all(e <= s <= lt for e, s, lt in zip(form.earliest, start, latest))


def test_bad_input():
    with pytest.raises(InputError, match="objective"):
        formulate(UNIT, sequential(2), 2, objective="area")
    with pytest.raises(InputError, match="num_microbatches"):
        formulate(UNIT, sequential(2), 0)
    with pytest.raises(InputError, match="mem_limit"):
        formulate(UNIT, sequential(2), 2, [1.0, 2.0, 3.0])


SKEWED_3 = Profile(t_f=[1.0, 1.5, 1.0], t_b=[1.0, 2.0, 1.5], t_w=[0.5, 1.0, 1.0], t_comm=0.25)


@pytest.mark.parametrize("profile, p, m, limit, objective", [
    (UNIT, 2, 3, None, "span"), (UNIT, 2, 3, 1.5, "span"), (SKEWED, 2, 3, None, "span"),
    (SKEWED, 2, 3, 2.0, "makespan"), (SKEWED, 2, 3, 2.0, "span"), (PROFILE_1_5B, 2, 3, 1.7 * 201216, "span"),
    (SKEWED_3, 3, 2, 1.5, "span"), (SKEWED_3, 3, 2, None, "makespan"),
])
def test_backends_match_brute_force(profile, p, m, limit, objective):
    """No backend beats brute force or claims a bound above it, none returns worse than its warm start, and
    a backend that says "optimal" has brute force's value (timing-free: a backend out of time claims less)."""
    form = formulate(profile, sequential(p), m, limit, objective)
    value, order = brute_force(form)
    simulate(form.schedule(order, "brute force"))
    bound = lower_bound(form)
    assert bound <= warmup_bound(form, 5.0, 1) <= value
    serial = serial_order(form)
    start = form.value(form.asap(serial))
    assert start > value
    for result in (solve_cpsat(form, serial, time_limit=10, workers=1, seed=0, lower=bound),
                   solve_cbc(form, serial, time_limit=10, workers=1, lower=bound)):
        assert result.bound is None or result.bound <= value
        if result.order is None:
            assert not result.optimal
            continue
        timeline = simulate(form.schedule(result.order, "x"))
        got = round(objective_of(timeline, objective) * form.time_scale)
        assert value <= got <= start
        if result.optimal:
            assert got == value


@pytest.mark.parametrize("p", [2, 3, 4, 6])
def test_bound_is_zb_h1_bubble_at_1f1b_memory(p):
    form = formulate(UNIT, sequential(p), 3 * p, float(p))
    assert lower_bound(form) == 9 * p + (p - 1) * (1 + 1 - 1)


@pytest.mark.parametrize("path", ICLR, ids=stem)
def test_bound_meets_published_zb_1p(path):
    prob = Problem.load(path)
    p, m = prob.num_devices, prob.num_microbatches
    profile = prob.profile.expand(p)
    form = formulate(profile, sequential(p), m, p * profile.stage_value("mem_f", 0))
    bound, work = lower_bound(form), max(form.work)
    assert round((bound - work) / bound, 4) == prob.published["zb-1p"]


def test_multi_stage_devices_use_the_reservoir():
    """Two stages per device (V-shape): CP-SAT's memory reservoir keeps its schedule within the limit, never
    worse than the warm start and never below the bound."""
    placement = vshape(2)
    form = formulate(UNIT, placement, 3, 2.5)
    warm = heuristic(UNIT, placement, 3, 2.5)
    bound = lower_bound(form)
    result = solve_cpsat(form, form.order_of(warm), time_limit=5, workers=1, seed=0, lower=bound)
    timeline = simulate(form.schedule(result.order, "x"))
    assert max(timeline.peak_memory) <= 2.5
    assert bound <= round(max(timeline.span) * form.time_scale) and max(timeline.span) <= max(simulate(warm).span)


def test_warmup_relaxation_bound_lies_between_earliest_starts_and_the_heuristic():
    """At twice 1F1B's memory the cheap bound is the work alone; the warm-up relaxation's bound (whatever
    CP-SAT proves in its time) is still no more than the heuristic's span."""
    prob = problem("iclr/1.5b-p8-m32")
    p, m = prob.num_devices, prob.num_microbatches
    profile = prob.profile.expand(p)
    limit = 2 * p * profile.stage_value("mem_f", 0)
    form = formulate(profile, sequential(p), m, limit)
    warm = simulate(heuristic(profile, sequential(p), m, limit))
    assert lower_bound(form) == max(form.work)
    assert warmup_bound(form, 5.0, 1) <= max(warm.span) * form.time_scale
