"""frontier(): the memory-bubble frontier per placement, with the handcrafted families."""

from __future__ import annotations

import itertools
import json

import pytest
from typer.testing import CliRunner

from zbsolve import UNIT, InputError, Profile, simulate
from zbsolve.app.cli import app
from zbsolve.optimize.frontier import frontier
from zbsolve.problem.memory_factor import reference_peak

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
    merged = chunked.merge_chunks(3, 2)
    assert merged.num_stages == 3
    for s in range(3):
        assert merged.durations(s) == pytest.approx(SKEWED_3.durations(s))
    assert SKEWED_3.merge_chunks(3, 2) is SKEWED_3


def test_factors_equal_the_corresponding_limits():
    """factors=[k] solves at k x 1F1B's peak and reports k itself; the rows match those of mem_limits."""
    peak = reference_peak(UNIT, 2, 4)
    args = {"num_microbatches": 4, "num_devices": 2, "placements": ("sequential",), "time_limit": 2, "jobs": 1}
    by_factor = frontier(UNIT, factors=[1.5, 0.75], **args)
    by_limit = frontier(UNIT, [0.75 * peak, 1.5 * peak], **args)
    assert by_factor.reference_peak == by_limit.reference_peak == peak
    assert [r.factor for r in by_factor.rows] == [0.75, 1.5]
    for a, b in zip(by_factor.rows, by_limit.rows, strict=True):
        assert a.mem_limit == pytest.approx(b.mem_limit) and a.factor == pytest.approx(b.factor)
        assert (a.placement, a.paper_bubble, a.bubble_rate, a.status) == (b.placement, b.paper_bubble, b.bubble_rate,
                                                                          b.status)
        assert simulate(a.schedule).peak <= a.mem_limit + 1e-9


@pytest.mark.parametrize("kwargs, message", [
    ({"mem_limits": [0.0]}, "mem_limit = 0.0"), ({"mem_limits": []}, "mem_limits is empty"),
    ({"placements": ("bidirectional",)}, "placement"), ({"jobs": 0}, "jobs = 0"),
    ({"mem_limits": None, "factors": [0.0]}, "factor = 0.0"), ({"mem_limits": None, "factors": []}, "factors is empty"),
    ({"factors": [1.0]}, "exactly one"), ({"mem_limits": None}, "exactly one"),
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
    assert [r["factor"] for r in doc["rows"]] == [0.5, 1.0, 0.5, 1.0]
    assert chart.read_bytes()[:4] == b"\x89PNG"
    bad = CliRunner().invoke(app, ["frontier", str(problem), "--factors", "0,1"])
    assert bad.exit_code == 2 and "factor = 0.0 must be a positive number" in bad.output
    bad = CliRunner().invoke(app, ["frontier", str(problem), "--factors", "1,x"])
    assert bad.exit_code == 2 and "--factors = '1,x' must be comma-separated numbers" in bad.output


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


def test_reference_peak_merges_chunk_stages():
    """A memory factor means the same memory for a profile given per stage or per chunk."""
    assert reference_peak(SKEWED_3.per_chunk(3, 2), 3, 5) == reference_peak(SKEWED_3, 3, 5)


def test_a_status_whose_schedule_meets_the_bound_reads_so_in_the_table():
    """A warm start within the rounding of times of its bound reads "heuristic (bound met)" beside its gap (and
    "bound_met" in the JSON); one further off stays "heuristic", and "optimal" is not qualified."""
    from rich.console import Console

    from zbsolve.optimize.frontier import Frontier, FrontierRow
    from zbsolve.present.tables import frontier_table

    rows = (FrontierRow("sequential", 4.0, 1.0, 0.1, 0.2, "heuristic", 7e-7, None),
            FrontierRow("sequential", 6.0, 1.5, 0.1, 0.2, "heuristic", 0.05, None),
            FrontierRow("sequential", 8.0, 2.0, 0.1, 0.2, "optimal", 0.0, None))
    result = Frontier(rows, (), 4.0)
    console = Console(width=200, record=True)
    console.print(frontier_table(result, "t"))
    statuses = [line.split("│")[6].strip() for line in console.export_text().splitlines() if "sequential" in line]
    assert statuses == ["heuristic (bound met)", "heuristic", "optimal"]
    assert [row["bound_met"] for row in result.to_json()["rows"]] == [True, False, True]
