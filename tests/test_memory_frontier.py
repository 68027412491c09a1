"""plan --frontier: the plan at each device memory, never rising as memory grows, never worse than a baseline
that fits there, beside the V-shape building blocks; the chart and the JSON."""

from __future__ import annotations

import dataclasses
import json

from typer.testing import CliRunner

from conftest import act_heavy

from zbsolve.app.cli import app
from zbsolve.base.units import GIB
from zbsolve.core.placement import vshape
from zbsolve.core.simulator import simulate
from zbsolve.planning.memory_frontier import building_blocks, parse_memories
from zbsolve.problem.costs import model_costs
from zbsolve.problem.recompute import FULL
from zbsolve.schedulers.families import make_schedule

runner = CliRunner()




def test_memories_are_read_sorted_and_bad_ones_named():
    assert parse_memories("8GiB, 4GiB,8GiB") == [4 * GIB, 8 * GIB]
    out = runner.invoke(app, ["plan", "x.yaml", "-p", "2", "-m", "4", "--frontier", "4GiB,lots"])
    assert out.exit_code == 2 and "frontier = 'lots' is not a size" in out.output


def test_the_frontier_never_rises_and_is_never_worse_than_a_fitting_baseline(tmp_path):
    path, chart = tmp_path / "act.yaml", tmp_path / "frontier.png"
    act_heavy().save(path)
    out = runner.invoke(app, ["plan", str(path), "-p", "2", "-m", "8", "--frontier", "5GiB,7GiB,9GiB,16GiB",
                              "--reserve", "0", "--recompute", "auto", "--time-limit", "16", "--jobs", "1",
                              "--chart", str(chart), "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    steps = [row["plan step (s)"] for row in data["frontier"]]
    assert all(s is not None for s in steps[1:])
    found = [s for s in steps if s is not None]
    assert found == sorted(found, reverse=True)
    for row in data["frontier"]:
        for key in ("best baseline (s)", "best baseline recomputing (s)"):
            if row[key] is not None:
                assert row["plan step (s)"] <= row[key] * (1 + 1e-9)
    assert chart.stat().st_size > 0
    assert {b["block"] for b in data["building blocks"]} <= {"v-min", "v-half", "zb-v"}


def test_building_blocks_are_the_families_simulated_with_their_memory():
    blocks = building_blocks(act_heavy(), 2, 8, reserve=GIB)
    profile, costs = model_costs(act_heavy(), vshape(2), "uniform", None, 0, FULL)
    zbv = simulate(make_schedule("zb-v", profile, 2, 8))
    point = next(b for b in blocks if b.name == "zb-v" and b.recompute == "full")
    assert point.step_time == zbv.makespan
    assert point.memory == max(s + a for s, a in zip(costs.static_bytes, zbv.peak_memory)) + GIB


def test_an_interrupted_plan_is_the_frontier_last_point(monkeypatch):
    from zbsolve.planning import memory_frontier
    from zbsolve.planning.planner import plan

    calls: list[int] = []

    def interrupted_plan(model, **kwargs):
        calls.append(kwargs["device_memory"])
        result = plan(model, **{**kwargs, "time_limit": 2, "jobs": 1})
        return dataclasses.replace(result, interrupted=True)

    monkeypatch.setattr(memory_frontier, "plan", interrupted_plan)
    points = memory_frontier.plan_frontier(act_heavy(), [16 * GIB, 24 * GIB, 32 * GIB], num_devices=2,
                                           num_microbatches=8, time_limit=6)
    assert calls == [16 * GIB] and len(points) == 1 and points[0].step_time is not None
