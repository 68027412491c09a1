"""The sequential-placement families gpipe, 1f1b, 1f1b-i, zb-h1 and zb-h2: closed forms with the
unit profile, validity on non-uniform profiles, and input checks."""

import random

import pytest

from conftest import ICLR, span_bubble, stem
from zbsolve import InputError, Profile, simulate
from zbsolve.schedulers.families import FAMILIES, make_schedule
from zbsolve.core.placement import interleaved, sequential
from zbsolve.problem.problem_file import Problem
from zbsolve.core.profile import UNIT
from zbsolve.core.schedule import B, BW, F, W

NAMES = ("gpipe", "1f1b", "1f1b-i", "zb-h1", "zb-h2")
T_F, T_B, T_W = UNIT.durations(0)
M_B = UNIT.mem_f


def grid(name):
    """(p, m) for p in 1..8 and m from 1 to 4p (multiples of p only for 1f1b-i)."""
    step = (lambda p: p) if name == "1f1b-i" else (lambda p: 1)
    return [(p, m) for p in range(1, 9) for m in range(step(p), 4 * p + 1, step(p))]


def expected(name, p, m):
    """(bubble, peak) of a family under the unit profile: the paper's closed forms, and for
    microbatch counts below a family's bound the values its docstring states."""
    if name == "gpipe":
        return (p - 1) * (T_F + T_B + T_W), m * M_B
    if name == "1f1b":
        return (p - 1) * (T_F + T_B + T_W), min(p, m) * M_B
    if name == "1f1b-i":
        return (p - 1) * (T_F + T_B + T_W) / 2, ((3 * p - 1) / 2 if m >= 2 * p else m) * M_B
    if name == "zb-h1":
        return ((p - 1) * (T_F + T_B - T_W) if m >= p else 2 * p - 1 - m), min(p, m) * M_B
    if name == "zb-h2":
        return ((p - 1) * (T_F + T_B - 2 * T_W) if m >= 2 * p - 1 else 2 * p - 1 - m), min(2 * p - 1, m) * M_B
    raise AssertionError(name)


def random_profile(rng, p):
    """Per-stage random times and memory (M_W <= M_B) with communication latency."""
    def times(lo, hi):
        return [rng.uniform(lo, hi) for _ in range(p)]
    m_b = times(0.5, 2.0)
    return Profile.from_paper(times(0.5, 2.0), times(0.5, 2.0), times(0.2, 2.0), rng.choice([0.1, 0.5]),
                              m_b, [x * rng.uniform(0.0, 1.0) for x in m_b])


def test_import_registers_every_family():
    assert set(NAMES) <= set(FAMILIES)


@pytest.mark.parametrize("name", NAMES)
def test_closed_forms_with_unit_profile(name):
    for p, m in grid(name):
        tl = simulate(make_schedule(name, UNIT, p, m))
        bubble, peak = expected(name, p, m)
        work = m * (T_F + T_B + T_W)
        assert max(tl.work) == pytest.approx(work), (p, m)
        assert span_bubble(tl) == pytest.approx(bubble), (p, m)
        assert tl.paper_bubble == pytest.approx(bubble / (work + bubble)), (p, m)
        assert tl.peak == pytest.approx(peak), (p, m)


@pytest.mark.parametrize("name, kinds", [("gpipe", {F, BW}), ("1f1b", {F, BW}), ("1f1b-i", {F, BW}),
                                         ("zb-h1", {F, B, W}), ("zb-h2", {F, B, W})])
def test_pass_kinds_and_placement(name, kinds):
    sched = make_schedule(name, UNIT, 4, 8)
    assert {op.kind for ops in sched.devices for op in ops} == kinds
    assert sched.placement == (interleaved(4, 2) if name == "1f1b-i" else sequential(4))
    assert sched.name == name


@pytest.mark.parametrize("name, warm", [("1f1b", lambda p, s: p - s), ("zb-h1", lambda p, s: p - s),
                                        ("zb-h2", lambda p, s: 2 * p - 1 - 2 * s)])
def test_warm_up_forwards(name, warm):
    p, m = 5, 20
    sched = make_schedule(name, UNIT, p, m)
    for s, ops in enumerate(sched.devices):
        first_back = next(i for i, op in enumerate(ops) if op.kind in (B, BW))
        assert all(op.kind == F for op in ops[:first_back])
        assert first_back == warm(p, s)


def test_zb_h1_delays_w_of_stage_s_by_s():
    p, m = 4, 12
    for s, ops in enumerate(make_schedule("zb-h1", UNIT, p, m).devices):
        pos = {(op.kind, op.mb): i for i, op in enumerate(ops)}
        for j in range(m - s):
            assert pos[(B, j + s)] < pos[(W, j)]
            if j + s + 1 < m:
                assert pos[(W, j)] < pos[(B, j + s + 1)]


@pytest.mark.parametrize("seed", range(12))
def test_non_uniform_profiles(seed):
    rng = random.Random(seed)
    p = rng.randint(1, 8)
    m = rng.randint(1, 4 * p)
    prof = random_profile(rng, p)
    mem_f = [prof.memories(s)[0] for s in range(p)]
    tl = {name: simulate(make_schedule(name, prof, p, m)) for name in NAMES if name != "1f1b-i"}
    simulate(make_schedule("1f1b-i", prof, p, p * -(-m // p)))
    for d in range(p):
        assert tl["1f1b"].peak_memory[d] == pytest.approx(min(p - d, m) * mem_f[d])
        assert tl["zb-h1"].peak_memory[d] <= min(p, m) * mem_f[d] + 1e-9
        assert tl["zb-h2"].peak_memory[d] <= min(2 * p - 1, m) * mem_f[d] + 1e-9
    assert tl["zb-h1"].peak_memory[0] == pytest.approx(min(p, m) * mem_f[0])
    assert tl["gpipe"].peak_memory[0] == pytest.approx(m * mem_f[0])
    assert tl["zb-h1"].makespan <= tl["1f1b"].makespan + 1e-9


@pytest.mark.parametrize("path", ICLR, ids=stem)
def test_reproduces_the_papers_bubble_rates(path):
    problem = Problem.load(path)
    for name in ("1f1b", "zb-h1", "zb-h2"):
        tl = simulate(make_schedule(name, problem.profile, problem.num_devices, problem.num_microbatches))
        assert tl.paper_bubble == pytest.approx(problem.published[name], abs=5e-5), name


def test_zb_h2_fills_bubbles_with_communication():
    prof = Profile(t_comm=0.25)
    h1, h2 = (simulate(make_schedule(n, prof, 4, 16)) for n in ("zb-h1", "zb-h2"))
    assert h2.paper_bubble < h1.paper_bubble


@pytest.mark.parametrize("name", NAMES)
def test_deterministic(name):
    prof = random_profile(random.Random(7), 4)
    assert make_schedule(name, prof, 4, 8) == make_schedule(name, prof, 4, 8)


def test_1f1b_i_chunk_profiles():
    p = 3
    per_device = Profile(t_f=[2.0, 4.0, 6.0])
    split = make_schedule("1f1b-i", per_device, p, 6).profile
    assert split.t_f == [1.0, 1.0, 2.0, 2.0, 3.0, 3.0]
    per_chunk = Profile(t_f=[float(s + 1) for s in range(2 * p)])
    assert make_schedule("1f1b-i", per_chunk, p, 6).profile.t_f == per_chunk.t_f
    simulate(make_schedule("1f1b-i", per_chunk, p, 6))
    with pytest.raises(InputError, match="profile has 4 stages"):
        make_schedule("1f1b-i", Profile(t_f=[1.0] * 4), p, 6)


def test_1f1b_i_needs_a_multiple_of_p():
    with pytest.raises(InputError, match="microbatches = 6 must be a multiple of stages p = 4"):
        FAMILIES["1f1b-i"](UNIT, 4, 6)


@pytest.mark.parametrize("name", ("gpipe", "1f1b", "zb-h1", "zb-h2"))
def test_profile_stage_count_must_match(name):
    with pytest.raises(InputError, match="profile has 3 stages"):
        make_schedule(name, Profile(t_f=[1.0, 1.0, 1.0]), 4, 8)
