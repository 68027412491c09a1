"""Tests of size: problems over ``MAX_STAGES`` or ``MAX_PASSES`` refused up front (before a schedule is built),
deadlines of the heuristic and the V-shape greedy, and large-ish schedules simulated to their closed forms (no
wall-clock assertions)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import failed_cleanly, heavy_head, span_bubble, zbsolve
from zbsolve.schedulers import heuristic as heuristic_module
from zbsolve.planning import planner
from zbsolve.base.checks import MAX_PASSES, MAX_STAGES, check_size
from zbsolve.base.errors import BudgetError, InputError
from zbsolve.schedulers.families import FAMILIES, make_schedule
from zbsolve.schedulers.heuristic import heuristic
from zbsolve.planning.planner import plan
from zbsolve.core.placement import sequential, vshape
from zbsolve.core.profile import UNIT, Profile
from zbsolve.core.simulator import simulate
from zbsolve.core.spec import make_spec
from zbsolve.schedulers.vgreedy import v_greedy

STAGES = 64
BIGGEST = MAX_PASSES // (3 * STAGES)
"""The most microbatches ``STAGES`` stages may have."""


def test_check_size_counts_passes_up_to_the_limit() -> None:
    assert check_size(STAGES, BIGGEST) == 3 * STAGES * BIGGEST <= MAX_PASSES
    with pytest.raises(InputError, match=f"would be {3 * STAGES * (BIGGEST + 1):,} passes; the limit is {MAX_PASSES:,}"):
        check_size(STAGES, BIGGEST + 1)


def test_check_size_counts_stages_up_to_the_limit() -> None:
    assert check_size(MAX_STAGES, 1) == 3 * MAX_STAGES
    with pytest.raises(InputError, match=f"^{MAX_STAGES + 1:,} stages \\(devices x stages per device\\) are more than "
                                         f"the limit of {MAX_STAGES:,}: give fewer --devices$"):
        check_size(MAX_STAGES + 1, 1)


@pytest.mark.parametrize("args", [("compare", "--devices", 100_000, "-m", 8),
                                  ("schedule", "1f1b", "-p", 100_000, "-m", 8)])
def test_a_hundred_thousand_devices_are_one_line(args: tuple) -> None:
    run = subprocess.run([sys.executable, "-m", "zbsolve", *map(str, args)], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "COLUMNS": "100000"})
    assert (run.returncode, run.stdout) == (2, "")
    assert run.stderr.splitlines() == [f"error: 100,000 stages (devices x stages per device) are more than the limit "
                                       f"of {MAX_STAGES:,}: give fewer --devices"]


@pytest.mark.parametrize("args", [("schedule", "zb-h2", "-p", MAX_STAGES + 1, "-m", 8),
                                  ("compare", "-p", MAX_STAGES + 1, "-m", 8),
                                  ("solve", "{problem}", "--time-limit", 5),
                                  ("solve", "{problem}", "--mem-factor", 1, "--time-limit", 5),
                                  ("frontier", "{problem}", "--factors", 1, "--time-limit", 5, "-j", 1)])
def test_commands_refuse_too_many_stages_before_building_a_schedule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     args: tuple) -> None:
    problem = tmp_path / "p.yaml"
    problem.write_text(f"num_devices: {MAX_STAGES + 1}\nnum_microbatches: 8\n")
    for name in FAMILIES:
        monkeypatch.setitem(FAMILIES, name, lambda *_: pytest.fail("a schedule was built"))
    line = failed_cleanly(zbsolve(*(str(a).format(problem=problem) for a in args)), 2)
    assert line == (f"error: {MAX_STAGES + 1:,} stages (devices x stages per device) are more than the limit of "
                    f"{MAX_STAGES:,}: give fewer --devices")


def test_plan_refuses_a_placement_over_the_limit_before_its_search() -> None:
    """8 stages fit; "auto" also searches 16 (interleaved and V-shape), which do not: refused before any work."""
    m = MAX_PASSES // (3 * 8)
    assert check_size(8, m)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(planner, "make_executor", lambda *_: pytest.fail("the search started"))
        with pytest.raises(InputError, match=f"^16 stages x {m} microbatches would be .* passes; the limit is"):
            plan(heavy_head(blocks=16), num_devices=8, num_microbatches=m, device_memory="80GiB")


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
