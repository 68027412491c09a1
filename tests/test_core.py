"""Profile, placements, schedule text form and simulator checks (the schedule document: test_document.py)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import one_f_one_b, span_bubble
from zbsolve import InputError, MemoryLimitError, Profile, ScheduleError, simulate
from zbsolve.core.placement import bidirectional, interleaved, make_placement, sequential, vshape
from zbsolve.core.profile import UNIT
from zbsolve.core.schedule import Pair, Pass, build


# -- profile -----------------------------------------------------------------------
def test_profile_broadcast_and_expand():
    prof = Profile(t_f=[1, 2, 3], t_b=2.0)
    assert prof.num_stages == 3
    assert prof.expand(3).t_b == [2.0, 2.0, 2.0]
    assert prof.durations(1) == (2.0, 2.0, 1.0)
    with pytest.raises(InputError, match="3 stages"):
        prof.expand(4)


def test_profile_from_paper():
    prof = Profile.from_paper(1.0, 1.0, 0.5, 0.1, M_B=3.0, M_W=1.0)
    assert prof.memories(0) == (3.0, -2.0, -1.0)


@pytest.mark.parametrize("fields, needle", [
    ({"t_f": 0}, "t_f = 0.0 must be a positive finite duration"),
    ({"t_w": [1, -1]}, "t_w[1] = -1"),
    ({"t_f": [1, 1], "t_b": [1, 1, 1]}, "disagree in length"),
    ({"mem_f": 1, "mem_b": -0.2, "mem_w": -0.5}, "must be 0"),
    ({"t_comm": -1}, "t_comm"),
    ({"overlap_saving": 1.0}, "overlap_saving"),
    ({"t_x": 1}, "t_x"),
])
def test_profile_rejects_bad_fields(fields, needle):
    with pytest.raises(InputError) as exc:
        Profile(**fields)
    assert needle in str(exc.value)


def test_profile_roundtrip_yaml(tmp_path):
    prof = Profile(t_f=[1, 2], t_b=[2, 3], t_w=1, t_comm=0.25)
    for name in ("p.yaml", "p.json"):
        prof.save(tmp_path / name)
        assert Profile.load(tmp_path / name) == prof


def test_profile_load_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("t_f: [1, 2\n")
    with pytest.raises(InputError, match="not valid YAML"):
        Profile.load(bad)
    with pytest.raises(InputError, match="cannot read"):
        Profile.load(tmp_path / "missing.yaml")


# -- placement and pass text ----------------------------------------------------------
def test_placements():
    assert vshape(3).routes == ((0, 1, 2, 2, 1, 0),)
    assert interleaved(2, 2).routes == ((0, 1, 0, 1),)
    assert bidirectional(4).routes == ((0, 1, 2, 3), (3, 2, 1, 0))
    assert vshape(2).stages_of(1) == [(0, 1), (0, 2)]
    with pytest.raises(InputError, match="even"):
        bidirectional(3)
    with pytest.raises(InputError, match="'diagonal'"):
        make_placement("diagonal", 4)


@given(st.sampled_from(["F", "B", "W", "BW"]), st.integers(0, 999), st.integers(0, 99))
def test_pass_str_roundtrip(kind, mb, stage):
    p = Pass(kind, mb, stage)
    assert Pass.from_str(str(p)) == p
    pair = Pair(Pass("F", mb, stage), Pass("B", mb + 1, stage))
    assert Pair.from_str(str(pair)) == pair


def test_pass_from_str_rejects():
    with pytest.raises(InputError, match="'3X1'"):
        Pass.from_str("3X1")


# -- simulator -------------------------------------------------------------------------
@pytest.mark.parametrize("p, m", [(1, 1), (2, 3), (4, 8), (8, 24)])
def test_1f1b_closed_form(p, m):
    t = simulate(one_f_one_b(p, m))
    assert span_bubble(t) == pytest.approx(3 * (p - 1))
    assert t.makespan == pytest.approx(3 * m + 3 * (p - 1))
    assert t.peak == pytest.approx(min(p, m))
    assert t.bubble_rate == pytest.approx((p - 1) / (m + p - 1))
    assert t.paper_bubble == pytest.approx((p - 1) / (m + p - 1))


def test_communication_latency_delays_cross_device_passes():
    prof = Profile(t_comm=0.5)
    base, late = simulate(one_f_one_b(2, 1)), simulate(one_f_one_b(2, 1, prof))
    assert late.makespan == pytest.approx(base.makespan + 2 * 0.5)


def test_memory_trace_and_limit():
    t = simulate(one_f_one_b(4, 8, mem_limit=4))
    assert t.peak_memory == (4.0, 3.0, 2.0, 1.0)
    assert t.memory[0][-1][1] == pytest.approx(0.0)
    with pytest.raises(MemoryLimitError, match=r"device 0 position 3 \(0F3\): memory 4 exceeds the limit 3"):
        simulate(one_f_one_b(4, 8, mem_limit=3))
    with pytest.raises(MemoryLimitError, match="device 1"):
        simulate(one_f_one_b(4, 8, mem_limit=[4, 2, 4, 4]))


def _edit(schedule, device, ops):
    devices = list(schedule.devices)
    devices[device] = tuple(ops)
    return build("edited", schedule.placement, schedule.num_microbatches, schedule.profile, devices)


def test_rejects_missing_duplicate_misplaced():
    s = one_f_one_b(2, 2)
    with pytest.raises(ScheduleError, match="missing pass 0B1 or 0BW1"):
        simulate(_edit(s, 0, s.devices[0][:-1]))
    with pytest.raises(ScheduleError, match="duplicate of 0F0"):
        simulate(_edit(s, 0, s.devices[0] + (Pass("F", 0, 0),)))
    with pytest.raises(ScheduleError, match="belongs on device 1"):
        simulate(_edit(s, 0, s.devices[0] + (Pass("F", 0, 1),)))
    with pytest.raises(ScheduleError, match="microbatch 5 out of range"):
        simulate(_edit(s, 0, s.devices[0] + (Pass("F", 5, 0),)))
    with pytest.raises(ScheduleError, match="stage 7 out of range"):
        simulate(_edit(s, 0, s.devices[0] + (Pass("F", 0, 7),)))
    split = [Pass("B", 0, 1) if op == Pass("BW", 0, 1) else op for op in s.devices[1]]
    with pytest.raises(ScheduleError, match="missing pass 1W0"):
        simulate(_edit(s, 1, split))
    with pytest.raises(ScheduleError, match="1W0 is extra"):
        simulate(_edit(s, 1, s.devices[1] + (Pass("W", 0, 1),)))


def test_rejects_deadlock_naming_each_blocked_pass():
    s = one_f_one_b(2, 2)
    swapped = (s.devices[0][2], s.devices[0][0], s.devices[0][1], s.devices[0][3])  # 0BW0 first
    with pytest.raises(ScheduleError) as exc:
        simulate(_edit(s, 0, swapped))
    msg = str(exc.value)
    assert "deadlock" in msg and "device 0 position 0 (0BW0) waits for 1BW0" in msg
    assert "device 1 position 0 (1F0) waits for 0F0" in msg


def test_pair_overlap_saving():
    prof = Profile(overlap_saving=0.25)
    devices = [[Pass("F", 0, 0), Pass("F", 1, 0), Pass("BW", 0, 0), Pass("BW", 1, 0)],
               [Pass("F", 0, 1), Pair(Pass("F", 1, 1), Pass("BW", 0, 1)), Pass("BW", 1, 1)]]
    t = simulate(build("pair", sequential(2), 2, prof, devices))
    assert t.end[1][1] - t.start[1][1] == pytest.approx(0.75 * 3)
    bad = [devices[0], [Pass("F", 0, 1), Pair(Pass("F", 1, 1), Pass("W", 0, 1)), Pass("BW", 1, 1)]]
    with pytest.raises(ScheduleError, match="F&B pair needs"):
        simulate(build("pair", sequential(2), 2, prof, bad))


def test_bidirectional_routes():
    p, m = 2, 2
    devices = [[Pass("F", 0, 0), Pass("F", 1, 1), Pass("BW", 1, 1), Pass("BW", 0, 0)],
               [Pass("F", 1, 0), Pass("F", 0, 1), Pass("BW", 0, 1), Pass("BW", 1, 0)]]
    t = simulate(build("bi", bidirectional(p), m, UNIT, devices, microbatch_route=[0, 1]))
    assert t.makespan == pytest.approx(6.0)
