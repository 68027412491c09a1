"""frontier(): the memory-bubble frontier per placement, with the handcrafted families."""

from __future__ import annotations

import itertools
import json

import pytest
from typer.testing import CliRunner

from zbsolve import UNIT, InputError, Profile, simulate
from zbsolve.cli import app
from zbsolve.frontier import frontier, stage_profile
from zbsolve.problem import reference_peak

SKEWED_3 = Profile(t_f=[1.0, 1.5, 1.2], t_b=[1.1, 2.0, 1.3], t_w=[0.6, 1.0, 0.9], t_comm=0.2)


def test_frontier_is_non_increasing_and_every_schedule_is_valid():
    limits = [1.0, 1.5, 2.0, 3.0, 4.5]
    result = frontier(SKEWED_3, limits, num_microbatches=5, time_limit=3, jobs=2)
    assert {r.placement for r in result.rows} == {"sequential", "vshape"} and len(result.rows) == 10
    assert result.reference_peak == reference_peak(SKEWED_3, 3, 5)
    for placement in ("sequential", "vshape"):
        rows = [r for r in result.rows if r.placement == placement]
        assert [r.mem_limit for r in rows] == limits
        bubbles = [r.paper_bubble for r in rows]
        assert all(b is not None for b in bubbles)
        assert all(later <= earlier + 1e-9 for earlier, later in itertools.pairwise(bubbles))
        for r in rows:
            timeline = simulate(r.schedule)
            assert timeline.paper_bubble == r.paper_bubble and timeline.peak <= r.mem_limit + 1e-9
            assert r.factor == pytest.approx(r.mem_limit / result.reference_peak)
            assert r.schedule.placement.num_stages == (3 if placement == "sequential" else 6)
    names = {f.name for f in result.families}
    assert {"1f1b", "zb-h1", "zb-v", "v-half", "v-min"} <= names
    for f in result.families:
        assert f.factor == pytest.approx(f.peak_memory / result.reference_peak)
    json.dumps(result.to_json())


def test_stage_profile_merges_chunk_stages():
    chunked = SKEWED_3.per_chunk(3, 2)
    merged = stage_profile(chunked, 3)
    assert merged.num_stages == 3
    for s in range(3):
        assert merged.durations(s) == pytest.approx(SKEWED_3.durations(s))
    assert stage_profile(SKEWED_3, 3) is SKEWED_3


@pytest.mark.parametrize("kwargs, message", [
    ({"mem_limits": [0.0]}, "mem_limit = 0.0"), ({"mem_limits": []}, "mem_limits"),
    ({"placements": ("bidirectional",)}, "placement"), ({"jobs": 0}, "jobs = 0"),
])
def test_bad_input(kwargs, message):
    args = {"mem_limits": [2.0], "num_microbatches": 4, "num_devices": 2, **kwargs}
    with pytest.raises(InputError, match=message):
        frontier(UNIT, args.pop("mem_limits"), **args)


def test_cli_writes_json_and_chart(tmp_path):
    problem = tmp_path / "p.yaml"
    problem.write_text("num_devices: 2\nnum_microbatches: 4\n")
    out, chart = tmp_path / "f.json", tmp_path / "f.png"
    run = CliRunner().invoke(app, ["frontier", str(problem), "--factors", "0.5,1", "--time-limit", "2", "--jobs", "1",
                                   "-o", str(out), "--chart", str(chart), "--json"])
    assert run.exit_code == 0, run.output
    doc = json.loads(out.read_text())
    assert json.loads(run.stdout) == doc and len(doc["rows"]) == 4
    assert [r["factor"] for r in doc["rows"]] == pytest.approx([0.5, 1.0, 0.5, 1.0])
    assert chart.read_bytes()[:4] == b"\x89PNG"
    bad = CliRunner().invoke(app, ["frontier", str(problem), "--factors", "0,1"])
    assert bad.exit_code == 2 and "0" in bad.output


def test_progress_counts_every_solve():
    calls = []
    frontier(UNIT, [2.0, 4.0], num_microbatches=4, num_devices=2, time_limit=2, jobs=2,
             progress=lambda done, total: calls.append((done, total)))
    assert calls == [(1, 4), (2, 4), (3, 4), (4, 4)]


def test_interrupt_keeps_the_finished_solves():
    """Ctrl-C (here raised by the progress callback after the first solve) returns that solve's row; the
    unfinished rows are "interrupted", or "carried" when a smaller limit's schedule fits."""
    def stop(done, total):
        raise KeyboardInterrupt

    result = frontier(SKEWED_3, [1.5, 3.0, 4.5], num_microbatches=5, time_limit=5, jobs=1, progress=stop)
    assert result.interrupted and result.to_json()["interrupted"]
    solved = [r for r in result.rows if r.status not in ("interrupted", "carried")]
    assert len(solved) == 1
    assert {r.status for r in result.rows} - {"interrupted", "carried"} == {solved[0].status}
    for r in result.rows:
        if r.schedule is not None:
            assert simulate(r.schedule).peak <= r.mem_limit + 1e-9
        else:
            assert r.status == "interrupted" and r.paper_bubble is None
