"""The multi-chunk families: zb-v, v-half, v-min (V placement), dualpipe (bidirectional) and dualpipev.

Closed forms use the unit profile (T_F = T_B = T_W = 1, M_B = 1, M_W = 0.5, no communication): a V
chunk then lasts 0.5 per pass and holds M_B / 2, and 1F1B's peak is p M_B.
"""

from __future__ import annotations

import random

import pytest

from conftest import span_bubble
from zbsolve.base.errors import InputError
from zbsolve.schedulers.families import FAMILIES, make_schedule
from zbsolve.core.profile import UNIT, Profile
from zbsolve.core.schedule import BW, F, Pair, passes_of
from zbsolve.core.simulator import Timeline, simulate

V_FAMILIES = ("zb-v", "v-half", "v-min")
FAMILY_NAMES = V_FAMILIES + ("dualpipe", "dualpipev")


def least_microbatches(name: str, p: int) -> int:
    """Smallest m each family accepts (DualPipe's warm-up on device 0 needs 2p-2 or 2p-1)."""
    return {"dualpipe": max(2, 2 * p - 2), "dualpipev": 2 * p - 1}.get(name, 1)


def devices_for(name: str) -> range:
    return range(2, 9, 2) if name == "dualpipe" else range(2, 9)


def microbatches_for(name: str, p: int) -> range:
    return range(least_microbatches(name, p), 4 * p + 1, 2 if name == "dualpipe" else 1)


def run(name: str, p: int, m: int, profile: Profile = UNIT) -> Timeline:
    return simulate(make_schedule(name, profile, p, m))


def idle(tl: Timeline) -> list[float]:
    """Per device, time idle within the makespan."""
    return [tl.makespan - w for w in tl.work]


def random_profile(rng: random.Random, stages: int, overlap_saving: float = 0.0) -> Profile:
    times = {k: [rng.uniform(0.3, 2.0) for _ in range(stages)] for k in ("T_F", "T_B", "T_W")}
    mem = [rng.uniform(0.5, 2.0) for _ in range(stages)]
    return Profile.from_paper(**times, T_comm=0.25, M_B=mem, M_W=[x * rng.uniform(0.1, 0.9) for x in mem],
                              overlap_saving=overlap_saving)


def test_all_registered() -> None:
    assert set(FAMILY_NAMES) <= set(FAMILIES)


# -- ZB-V ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("p", range(1, 9))
def test_zb_v_zero_bubble_from_2p_minus_1_at_1f1b_memory(p: int) -> None:
    for m in range(1, 4 * p + 1):
        tl = run("zb-v", p, m)
        assert tl.peak == pytest.approx(min(m, p))
        if m >= 2 * p - 1:
            assert tl.paper_bubble == pytest.approx(0.0, abs=1e-12)
        else:
            assert tl.paper_bubble > 0


def test_zb_v_memory_is_uniform_over_devices() -> None:
    p, m = 6, 18
    assert run("zb-v", p, m).peak_memory == pytest.approx([p] * p)


def test_zb_v_has_no_fused_backward() -> None:
    schedule = make_schedule("zb-v", UNIT, 4, 9)
    assert all(op.kind != BW and not isinstance(op, Pair) for ops in schedule.devices for op in ops)


# -- V-Half and V-Min ------------------------------------------------------------------------------

def v_half_idle(p: int) -> float:
    return 0.5 if p == 2 else (3 * p - 4) / 2 if p % 2 else (3 * p - 7) / 2


def v_min_idle(p: int) -> float:
    return 2 * p - 3.5 if p % 3 == 0 else 2 * p - 2.5


@pytest.mark.parametrize("p", range(2, 9))
def test_v_half_half_of_1f1b_memory(p: int) -> None:
    for m in range(1, 4 * p + 1):
        tl = run("v-half", p, m)
        assert tl.peak == pytest.approx(min(m, (p + 2) // 2))
        assert tl.paper_bubble <= p / (2 * m) + 1e-12
        if m >= 2 * p:
            assert span_bubble(tl) == pytest.approx(v_half_idle(p))


@pytest.mark.parametrize("p", range(2, 9))
def test_v_min_third_of_1f1b_memory(p: int) -> None:
    for m in range(1, 4 * p + 1):
        tl = run("v-min", p, m)
        if p >= 3:
            assert tl.peak == pytest.approx(min(m, (p + 4) // 3))
        assert tl.peak <= (p + 4) // 3 + 1e-12
        assert tl.paper_bubble <= 2 * p / (3 * m) + 1e-12
        if m >= 2 * p:
            assert span_bubble(tl) == pytest.approx(v_min_idle(p))


def test_v_min_two_devices_peak() -> None:
    assert [run("v-min", 2, m).peak for m in range(1, 9)] == pytest.approx([1] + [1.5] * 7)


@pytest.mark.parametrize("name", ["v-half", "v-min"])
def test_block_repetition_adds_only_work(name: str) -> None:
    """A repeated building block keeps every device busy in the steady state: one more microbatch
    lengthens the longest span by exactly its work, 2 chunks x (F + B + W)."""
    p = 5
    spans = [max(run(name, p, m).span) for m in range(2 * p, 2 * p + 4)]
    assert [b - a for a, b in zip(spans, spans[1:])] == pytest.approx([3.0] * 3)


# -- DualPipe and DualPipeV ------------------------------------------------------------------------

def dualpipe_bubble(half_pp: float, t_fb: float, t_b: float, t_w: float) -> float:
    """DeepSeek's (PP/2 - 1)(F&B + B - 3W) with B the full backward t_b + t_w."""
    return (half_pp - 1) * (t_fb + (t_b + t_w) - 3 * t_w)


@pytest.mark.parametrize("p", range(2, 9, 2))
def test_dualpipe_closed_form(p: int) -> None:
    for m in microbatches_for("dualpipe", p):
        tl = run("dualpipe", p, m)
        assert idle(tl) == pytest.approx([dualpipe_bubble(p / 2, 3.0, 1.0, 1.0)] * p)
        assert tl.peak == pytest.approx(min(p + 1, m))
        if m >= 2 * p:
            assert tl.peak_memory == pytest.approx([p + 1] * p)


@pytest.mark.parametrize("p", range(1, 9))
def test_dualpipev_closed_form(p: int) -> None:
    for m in microbatches_for("dualpipev", p):
        tl = run("dualpipev", p, m)
        assert idle(tl) == pytest.approx([dualpipe_bubble(p, 1.5, 0.5, 0.5)] * p)
        assert tl.peak == pytest.approx(min(p + 0.5, m))
        if m >= 2 * p:
            assert tl.peak_memory == pytest.approx([p + 0.5] * p)


@pytest.mark.parametrize("saving", [0.2, 1 / 3])
def test_dualpipe_overlap_saving(saving: float) -> None:
    profile = Profile(overlap_saving=saving)
    for p in (4, 6):
        fb = (1 - saving) * 3.0
        assert max(idle(run("dualpipe", p, 3 * p, profile))) == pytest.approx(dualpipe_bubble(p / 2, fb, 1, 1))
        half = (1 - saving) * 1.5
        assert max(idle(run("dualpipev", p, 3 * p, profile))) == pytest.approx(dualpipe_bubble(p, half, .5, .5))


def test_dualpipe_overlap_saving_shortens_the_schedule() -> None:
    assert run("dualpipe", 4, 12, Profile(overlap_saving=0.2)).makespan < run("dualpipe", 4, 12).makespan


def test_dualpipe_routes_and_pairs() -> None:
    p, m = 6, 16
    schedule = make_schedule("dualpipe", UNIT, p, m)
    assert schedule.microbatch_route == (0,) * (m // 2) + (1,) * (m // 2)
    for d, ops in enumerate(schedule.devices):
        held = {(schedule.microbatch_route[q.mb], q.stage) for op in ops for q in passes_of(op)}
        assert held == {(0, d), (1, p - 1 - d)}
        pairs = [op for op in ops if isinstance(op, Pair)]
        assert pairs and all(op.f.kind == F and op.b.kind == BW for op in pairs)


# -- bad input -------------------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "p", "m", "words"), [
    ("dualpipe", 3, 12, ["= 3", "even", "smallest valid is 4"]),
    ("dualpipe", 4, 5, ["microbatches = 5", "smallest valid is 6"]),
    ("dualpipe", 4, 7, ["microbatches = 7", "even", "smallest valid is 8"]),
    ("dualpipev", 4, 6, ["microbatches = 6", "smallest valid is 7"]),
])
def test_dualpipe_bad_sizes(name: str, p: int, m: int, words: list[str]) -> None:
    with pytest.raises(InputError) as err:
        make_schedule(name, UNIT, p, m)
    assert all(w in str(err.value) for w in words)


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_profile_of_wrong_stage_count(name: str) -> None:
    with pytest.raises(InputError, match="profile has 3 stages"):
        make_schedule(name, Profile(t_f=[1.0, 2.0, 3.0]), 4, 12)


def test_dualpipe_rejects_a_chunked_profile() -> None:
    with pytest.raises(InputError, match="profile has 8 stages"):
        make_schedule("dualpipe", UNIT.expand(8), 4, 8)


@pytest.mark.parametrize("name", V_FAMILIES + ("dualpipev",))
def test_v_profile_with_2p_stages_is_kept(name: str) -> None:
    profile = random_profile(random.Random(7), 8)
    schedule = make_schedule(name, profile, 4, 9)
    assert schedule.profile == profile
    simulate(schedule)


@pytest.mark.parametrize("name", V_FAMILIES + ("dualpipev",))
def test_v_profile_is_split_in_two_chunks(name: str) -> None:
    profile = Profile(t_f=[2.0, 4.0, 6.0], t_b=3.0)
    schedule = make_schedule(name, profile, 3, 6)
    assert schedule.profile.t_f == [1.0, 1.0, 2.0, 2.0, 3.0, 3.0]
    assert schedule.placement.routes == ((0, 1, 2, 2, 1, 0),)


# -- any profile -----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_random_profiles_validate_and_keep_the_order(name: str) -> None:
    rng = random.Random(name)
    for p in (2, 4, 6):
        for m in (least_microbatches(name, p), 3 * p):
            profile = random_profile(rng, p, overlap_saving=0.15)
            schedule = make_schedule(name, profile, p, m)
            simulate(schedule)
            assert schedule.devices == make_schedule(name, UNIT, p, m).devices


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_every_unit_size_validates(name: str) -> None:
    for p in devices_for(name):
        for m in microbatches_for(name, p):
            simulate(make_schedule(name, UNIT, p, m))
