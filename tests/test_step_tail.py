"""A device's tail (seconds after its last pass that belong to its step): the objective adds it once, and the
simulator, the formulation, the bounds and CP-SAT read it alike; no tail changes nothing."""

from __future__ import annotations

import pytest

from zbsolve.core.objective import device_share, offset
from zbsolve.core.placement import interleaved, sequential
from zbsolve.core.profile import Profile
from zbsolve.core.simulator import simulate
from zbsolve.optimize.backends import BACKENDS
from zbsolve.optimize.bound import lower_bound
from zbsolve.optimize.formulation import formulate
from zbsolve.schedulers.families.classic import interleaved_1f1b, one_f_one_b
from zbsolve.schedulers.heuristic import heuristic

BASE = dict(t_f=[1.0, 1.2, 0.9], t_b=[1.1, 1.3, 1.0], t_w=[0.7, 0.8, 0.6], t_comm=0.1)
TAILS = [0.4, 0.0, 2.5]
"""The last device, which ends first, gets the longest tail: it decides the step."""


def test_a_share_adds_the_tail_to_the_last_end():
    assert device_share(1.0, 5.0, "makespan", 0.5) == 5.5
    assert device_share(1.0, 5.0, "span", 0.5) == 4.5
    assert device_share(1.0, 5.0, "span") == 4.0 and offset(1.0, "makespan") == 0


def test_device_tails_sum_each_device_s_stages_once():
    profile = Profile(**BASE, t_tail=[1.0, 2.0, 4.0]).expand(3).split_chunks(2)
    assert profile.device_tails(interleaved(3, 2)) == pytest.approx((0.5 + 1.0, 0.5 + 2.0, 1.0 + 2.0))
    assert Profile(**BASE).device_tails(sequential(3)) == (0.0, 0.0, 0.0)


def test_no_tail_leaves_the_profile_document_as_it_was():
    assert "t_tail" not in Profile(**BASE).model_dump()
    assert Profile(**BASE, t_tail=TAILS).model_dump()["t_tail"] == TAILS


def test_a_negative_tail_is_refused():
    with pytest.raises(ValueError, match=r"t_tail\[1\] = -1.0 must be >= 0"):
        Profile(**BASE, t_tail=[0.0, -1.0, 0.0])


@pytest.mark.parametrize("objective", ["makespan", "span"])
def test_the_simulator_adds_each_device_s_tail(objective):
    plain = simulate(one_f_one_b(Profile(**BASE), 3, 4))
    tailed = simulate(one_f_one_b(Profile(**BASE, t_tail=TAILS), 3, 4))
    assert tailed.end == plain.end
    shares = [share + tail for share, tail in zip(plain.device_shares(objective), TAILS)]
    assert tailed.device_shares(objective) == pytest.approx(shares)
    assert tailed.objective(objective) == pytest.approx(max(shares))
    assert max(shares) > plain.objective(objective)
    assert plain.device_shares(objective)[2] < plain.objective(objective)


def test_interleaved_tails_follow_the_placement():
    profile = Profile(**BASE, t_tail=TAILS).expand(3).split_chunks(2)
    timeline = simulate(interleaved_1f1b(profile, 3, 3, 2))
    tails = profile.device_tails(interleaved(3, 2))
    assert timeline.makespan == pytest.approx(max(es[-1] + t for es, t in zip(timeline.end, tails)))


@pytest.mark.parametrize("objective", ["makespan", "span"])
def test_formulation_bound_and_cpsat_agree_with_the_simulator(objective):
    profile = Profile(**BASE, t_tail=TAILS)
    form = formulate(profile, sequential(3), 3, None, objective)
    warm = heuristic(profile, sequential(3), 3, None)
    assert form.to_time(form.value(form.asap(form.order_of(warm)))) == pytest.approx(simulate(warm).objective(objective))
    lower = lower_bound(form)
    result = BACKENDS["cpsat"](form, form.order_of(warm), time_limit=10, workers=1, seed=0, lower=lower,
                               report=lambda line: None)
    assert result.order is not None
    solved = simulate(form.schedule(result.order, "cpsat"))
    assert form.to_time(lower) <= solved.objective(objective) + 1e-9
    assert form.to_time(form.value(form.asap(result.order))) == pytest.approx(solved.objective(objective))
    assert form.to_time(lower) >= 3 * (0.9 + 1.0 + 0.6) + TAILS[2] - 1e-9  # the last device's work, then its tail


def test_zero_tail_changes_no_figure_of_the_formulation():
    with_zero = formulate(Profile(**BASE, t_tail=0.0), sequential(3), 3, None, "makespan")
    without = formulate(Profile(**BASE), sequential(3), 3, None, "makespan")
    assert with_zero.offset == without.offset == (0, 0, 0) and lower_bound(with_zero) == lower_bound(without)
