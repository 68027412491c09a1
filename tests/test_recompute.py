"""Activation recomputation: a recomputing block's costs, a stage's peak inside its B, the memory rule that holds
that peak, baselines with every block recomputed, and documents that `zbsolve check` verifies."""

from __future__ import annotations

import json

import pytest
from conftest import act_heavy
from typer.testing import CliRunner

from zbsolve.app.cli import app
from zbsolve.base.errors import InputError, MemoryLimitError
from zbsolve.base.units import GIB
from zbsolve.core.placement import sequential
from zbsolve.core.profile import Profile
from zbsolve.core.schedule import Pass, build
from zbsolve.core.simulator import simulate
from zbsolve.costmodel.model import Layer, Model
from zbsolve.io.costs_section import costs_section
from zbsolve.io.document import to_document
from zbsolve.planning.baselines import baseline_plan, baselines
from zbsolve.problem.costs import check_fits, model_costs
from zbsolve.problem.recompute import FULL, NONE, PER_STAGE, Recompute, described, parse_recompute
from zbsolve.problem.recompute_costs import layer_costs, stage_costs
from zbsolve.schedulers.families import make_schedule

runner = CliRunner()


def toy(blocks: int = 2) -> Model:
    """An embedding of output 4 bytes, then blocks of F = 1, B = 2, W = 1, M_B = 64, M_W = 32, output 4 bytes."""
    def layer(name: str, block: bool = True) -> Layer:
        return Layer(name=name, block=block, t_f=1.0, t_b=2.0, t_w=1.0, mem_f=64, mem_b=-32, mem_w=-32,
                     static_bytes=100, out_bytes=4)
    return Model(name="toy", layers=[layer("tok_embeddings", False), *(layer(f"layers.{i}") for i in range(blocks))])


def test_recompute_choices_are_read_or_refused_by_name():
    assert parse_recompute("none") == NONE and parse_recompute("full") == FULL
    assert parse_recompute("uniform:3") == Recompute("uniform", 3) and str(Recompute("uniform", 3)) == "uniform:3"
    for bad in ("uniform:0", "half", "uniform:x", "", "per-stage:", "per-stage:1,,2", "per-stage:-1"):
        with pytest.raises(InputError, match=f"recompute = {bad!r}: should be one of none, full, uniform:N"):
            parse_recompute(bad)
    assert parse_recompute("per-stage") == PER_STAGE and str(PER_STAGE) == "per-stage"
    assert parse_recompute("per-stage:2,0,1") == Recompute("per-stage", per_stage=(2, 0, 1))
    assert str(parse_recompute("per-stage:2,0,1")) == "per-stage:2,0,1"


def test_per_stage_counts_choose_the_first_blocks_of_each_stage_and_read_back():
    model, ranges = toy(5), [(0, 3), (3, 4), (4, 6)]  # stages hold blocks [1, 2], [3], [4, 5]
    assert Recompute("per-stage", per_stage=(1, 0, 2)).layers(model, ranges) == {1, 4, 5}
    for chosen, text in (({1, 4, 5}, "per-stage:1,0,2"), (set(), "none"), ({1, 2, 3, 4, 5}, "full"),
                         ({1, 3, 4}, "uniform:1"), ({1, 2, 3, 4}, "per-stage:2,1,1"), ({2}, "layers")):
        assert described(model, ranges, chosen) == text
        if text != "layers":
            assert parse_recompute(text).layers(model, ranges) == chosen
    longer = [(0, 3), (3, 4), (4, 7)]  # blocks [1, 2], [3], [4, 5, 6]: uniform:2 recomputes the middle one whole
    assert described(toy(6), longer, {1, 2, 3, 4, 5}) == "uniform:2"
    assert Recompute("uniform", 2).layers(toy(6), longer) == {1, 2, 3, 4, 5}
    with pytest.raises(InputError, match=r"recompute = 'per-stage:1,0': 2 counts for 3 stages"):
        Recompute("per-stage", per_stage=(1, 0)).layers(model, ranges)
    with pytest.raises(InputError, match=r"recompute = 'per-stage:1,2,0': stage 1 has 1 blocks, fewer than 2"):
        Recompute("per-stage", per_stage=(1, 2, 0)).layers(model, ranges)


def test_uniform_recomputes_the_first_blocks_of_every_stage():
    model = toy(blocks=5)
    ranges = [(0, 3), (3, 6)]
    assert Recompute("uniform", 1).layers(model, ranges) == {1, 3}
    assert FULL.layers(model, ranges) == {1, 2, 3, 4, 5} and NONE.layers(model, ranges) == set()


def test_a_recomputing_block_keeps_its_input_and_holds_its_forward_inside_b():
    """F keeps the 4-byte input; B runs F again (1 + 2 s), holds M_B = 64 while it runs (60 above the input it
    keeps) and leaves M_W = 32 less the input; W frees M_W."""
    assert layer_costs(toy(), 1, True) == {"t_f": 1.0, "t_b": 3.0, "t_w": 1.0, "mem_f": 4, "mem_b": 28,
                                            "mem_w": -32, "mem_r": 60, "mem_rw": 60, "comm_f": 0.0,
                                            "comm_b": 0.0}
    assert layer_costs(toy(), 1, False)["mem_r"] == 0


def test_a_stage_holds_most_inside_b_where_its_first_block_recomputes():
    """Two recomputing blocks: the last block's B holds 60 above the start; then it leaves 28, and the first
    block's B holds 28 + 60 = 88; the stage's B ends 56 above its start."""
    stage = stage_costs(toy(), 1, 3, {1, 2})
    assert stage["mem_f"] == 8 and stage["mem_b"] == 56 and stage["mem_w"] == -64 and stage["mem_r"] == 88
    assert stage_costs(toy(), 1, 3, set())["mem_r"] == 0


def test_a_fused_backward_recomputes_block_by_block():
    """B and W fused (a BW): the last block holds 60 above the start and frees its input (4) at its end; the first
    holds 60 above -4: the stage's BW holds one block's forward, 60, not both blocks' (88) as B alone does."""
    stage = stage_costs(toy(), 1, 3, {1, 2})
    assert stage["mem_rw"] == 60 and stage["mem_r"] == 88
    profile, _ = model_costs(toy(), sequential(1), [3], recompute=FULL)
    assert profile.held_in("BW", 0) == 60 and profile.held_in("B", 0) == 88
    assert Profile(t_f=1, t_b=1, t_w=1, mem_f=4, mem_b=28, mem_w=-32, mem_r=60).held_in("BW", 0) == 60


def test_a_layer_s_own_held_bytes_count_inside_its_backward():
    """A layer whose B holds bytes while it runs (``Layer.held_b``: the loss's gradients) holds them in B and BW."""
    layer = toy().layers[1].model_copy(update={"held_b": 10})
    model = toy().model_copy(update={"layers": [*toy().layers[:1], layer, *toy().layers[2:]]})
    assert layer_costs(model, 1, False)["mem_r"] == 10 and layer_costs(model, 1, False)["mem_rw"] == 10
    assert layer_costs(model, 1, True)["mem_r"] == 70


def test_the_memory_rule_counts_the_peak_inside_a_recomputing_b():
    """One stage of the embedding (F keeps 64, B frees 32) and both blocks, one microbatch, F B W: memory 72 from
    F's start (t=0), 72 + 88 from B's start (t=3), 72 + 56 - 32 from B's end (t=3+8), 0 from W's end (t=14); a
    limit one below the peak is refused at B."""
    model = toy()
    profile, _ = model_costs(model, sequential(1), [3], recompute=FULL)
    assert profile.stage_value("mem_r", 0) == 88
    order = [[Pass.from_str(x) for x in ("0F0", "0B0", "0W0")]]
    timeline = simulate(build("by hand", sequential(1), 1, profile, order))
    # The embedding does not recompute: it keeps 64 from F to B and frees 32 at B's end, 32 at W's end.
    assert list(timeline.memory[0]) == [(0.0, 0.0), (0.0, 72.0), (3.0, 160.0), (11.0, 96.0), (14.0, 0.0)]
    assert timeline.peak_memory == (160.0,)
    with pytest.raises(MemoryLimitError, match="memory 160 exceeds the limit 159"):
        simulate(build("by hand", sequential(1), 1, profile, order, 159.0))


def test_baselines_with_every_block_recomputed_are_judged_by_the_simulator():
    """Three blocks of 1 GiB activations on 2 devices: with recomputation each microbatch in flight keeps 16 MiB
    instead of 1 GiB, so a 1F1B that does not fit 7 GiB without it fits with it."""
    model = Model(name="act", layers=[
        Layer(name=n, block=n.startswith("layers."), t_f=1.0, t_b=1.0, t_w=1.0, mem_f=GIB, mem_b=0, mem_w=-GIB,
              static_bytes=GIB // 8, out_bytes=GIB // 64)
        for n in ("tok_embeddings", *(f"layers.{i}" for i in range(8)), "output")])
    rows = {(b.split, b.schedule, b.recompute): b for b in baselines(model, 2, 8, 7 * GIB, reserve=0)}
    assert not rows["uniform", "1F1B", "none"].fits and rows["uniform", "1F1B", "full"].fits
    full = rows["uniform", "1F1B", "full"]
    # B of a recomputing block runs its forward again: 8 blocks add 8 s per microbatch to the 30 s of work.
    assert full.bubble == pytest.approx(1 - (30 + 8) * 8 / (2 * full.step_time))
    timeline, costs, (placement, chunks) = baseline_plan(model, 2, 8, 7 * GIB, 0, full)
    assert (placement, chunks) == ("sequential", 1) and costs.recomputed == tuple(range(1, 9))
    check_fits(costs, timeline)
    assert max(s + a for s, a in zip(costs.static_bytes, timeline.peak_memory)) / GIB == \
        pytest.approx(max(full.memory_gib))


def test_check_verifies_a_recomputing_document_and_its_peak(tmp_path):
    model = toy(blocks=4)
    profile, costs = model_costs(model, sequential(2), [3, 2], device_memory=10_000, reserve=0, recompute=FULL)
    timeline = simulate(make_schedule("1f1b", profile, 2, 4))
    doc = to_document(timeline, **costs_section(costs))
    assert doc["partition"]["recompute"] == [1, 2, 3, 4] and doc["profile"]["mem_r"] == [88.0, 88.0]
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    run = runner.invoke(app, ["check", str(path), "--json"])
    assert run.exit_code == 0, run.output
    assert json.loads(run.stdout)["peak_memory_per_device"] == list(timeline.peak_memory)
    doc["profile"]["mem_r"] = [0.0, 88.0]
    path.write_text(json.dumps(doc))
    run = runner.invoke(app, ["check", str(path)])
    assert run.exit_code == 2
    assert "profile.mem_r[0] = 0, but its layers [0, 3) hold 88" in " ".join(run.output.split())
    tight = {**json.loads(json.dumps(doc)), "device_memory": int(max(s + a for s, a in zip(
        costs.static_bytes, timeline.peak_memory))) - 1}
    tight["profile"]["mem_r"] = [88.0, 88.0]
    path.write_text(json.dumps(tight))
    assert runner.invoke(app, ["check", str(path)]).exit_code == 1




def test_solve_with_recomputation_returns_a_checked_schedule_that_fits():
    """The integer form, not only a warm start, bounds the result: its bound, 157 s (the last device's work after the
    first F of stage 0, 5 s), is above the devices' work (8 x (5 + 9 + 5) = 152 s: five layers a stage, four of them
    blocks that run their F again in B)."""
    from zbsolve import solve
    from zbsolve.optimize.bound import lower_bound
    from zbsolve.optimize.formulation import formulate

    result = solve(act_heavy(), num_devices=2, num_microbatches=8, device_memory=7 * GIB, reserve=0,
                   recompute="full", time_limit=10, workers=1)
    assert result.costs.recomputed == tuple(range(1, 9))
    timeline = simulate(result.schedule)
    assert timeline.makespan == result.step_time and timeline.peak_memory == result.timeline.peak_memory
    check_fits(result.costs, timeline)
    form = formulate(result.schedule.profile, sequential(2), 8, result.schedule.mem_limit, "makespan")
    assert max(timeline.work) == 152 and form.to_time(lower_bound(form)) == 157
    assert 157 <= result.lower_bound <= result.step_time
    counts = [b - a for a, b in result.costs.ranges]
    profile, costs = model_costs(act_heavy(), sequential(2), counts, 7 * GIB, 0)
    with pytest.raises(MemoryLimitError):  # the same order does not fit without recomputation
        check_fits(costs, simulate(build("again", sequential(2), 8, profile, result.schedule.devices)))


def test_recompute_is_refused_by_name_where_it_cannot_apply():
    from zbsolve import UNIT, solve

    with pytest.raises(InputError, match="recompute = 'half': should be one of none, full, uniform:N"):
        solve(act_heavy(), num_devices=2, num_microbatches=8, device_memory=7 * GIB, recompute="half")
    with pytest.raises(InputError, match="recompute = 'full': recomputation chooses a model's blocks"):
        solve(UNIT, num_devices=2, num_microbatches=4, recompute="full")


def test_a_plan_that_may_recompute_times_both_choices_and_fits():
    import concurrent.futures as cf

    from zbsolve.planning.planner import plan

    plans = {}
    for choice in ("none", "auto"):
        with cf.ThreadPoolExecutor(1) as pool:
            plans[choice] = plan(act_heavy(), num_devices=2, num_microbatches=8, device_memory=7 * GIB, reserve=0,
                                 placement="sequential", recompute=choice, time_limit=10, executor=pool)
    auto = plans["auto"]
    assert {c.recompute for c in auto.candidates} == {"none", "full", "per-stage"}
    assert {c.recompute for c in plans["none"].candidates} == {"none"}
    timeline = simulate(auto.timeline.schedule)
    assert timeline.makespan == auto.step_time
    check_fits(auto.costs, timeline)
    assert auto.recompute == described(act_heavy(), auto.costs.ranges, auto.costs.recomputed)
    assert parse_recompute(auto.recompute).layers(act_heavy(), auto.costs.ranges) == set(auto.costs.recomputed)
    fitting = [b.step_time for b in auto.baselines if b.fits and b.step_time is not None
               and b.schedule in ("GPipe", "1F1B")]
    assert auto.step_time <= min(fitting) * (1 + 1e-9)
    assert auto.lower_bound <= auto.step_time


@pytest.mark.parametrize("placement, chunks", [("sequential", 1), ("interleaved", 2), ("vshape", 2)])
def test_the_integer_form_counts_memory_as_the_simulator_does_inside_a_recomputing_b(placement, chunks):
    from zbsolve.core.memory import fits, levels
    from zbsolve.core.placement import make_placement
    from zbsolve.optimize.formulation import formulate
    from zbsolve.schedulers.heuristic import heuristic

    layout = make_placement(placement, 2, chunks)
    counts = [1] + [2] * (layout.num_stages - 2) + [2]
    counts[-1] += 10 - sum(counts)
    profile, _ = model_costs(act_heavy(), layout, counts, None, 0, Recompute("uniform", 1))
    assert profile.backward_allocates()
    schedule = heuristic(profile, layout, 6)
    form = formulate(profile, layout, 6)
    order = form.order_of(schedule)
    # Every level the simulator's rule reaches, inside a B or after a pass, is a limit just met or just missed.
    for d in range(2):
        for *_, level, _ in levels(schedule, d):
            for limit in (level, level * (1 - 1e-6)):
                limits = [limit if e == d else 1e30 for e in range(2)]
                checked = formulate(profile, layout, 6, limits)
                assert checked.memory_ok(order) == fits(schedule, limits), (d, level, limit)
    assert form.memory_ok(order)


def test_cpsat_keeps_the_peak_inside_a_recomputing_b_within_the_limit():
    from zbsolve import solve

    found = {}
    for solver in ("heuristic", "cpsat"):
        result = solve(act_heavy(), num_devices=2, num_microbatches=6, device_memory=6 * GIB, reserve=0,
                       placement="vshape", recompute="uniform:1", solver=solver, time_limit=20, workers=1, seed=0)
        timeline = simulate(result.schedule)
        assert timeline.makespan == result.step_time
        check_fits(result.costs, timeline)  # with the peak inside every recomputing B
        assert result.costs.recomputed
        found[solver] = result.step_time
    assert found["cpsat"] <= found["heuristic"]


def test_per_stage_recomputes_only_where_a_device_needs_it():
    from zbsolve import solve

    # Blocks of 1 GiB of activations a microbatch, a quarter of which W reads. Stage 0 holds 6 of them and the
    # embedding (1 GiB): within 6 GiB less its 7/8 GiB of static bytes, not even one microbatch fits there without
    # recomputation. A fused backward recomputes block by block, so with its first five blocks recomputed an order
    # of least memory fits there, and stage 0 recomputes five, stage 1 none. With 64 GiB every order fits as it is.
    model = Model(name="w-light", layers=[
        Layer(name=n, block=n.startswith("layers."), t_f=1.0, t_b=1.0, t_w=1.0, mem_f=GIB, mem_b=-3 * GIB // 4,
              mem_w=-GIB // 4, static_bytes=GIB // 8, out_bytes=GIB // 64)
        for n in ("tok_embeddings", *(f"layers.{i}" for i in range(8)), "output")])
    chosen = {}
    for memory in (6 * GIB, 64 * GIB):
        result = solve(model, num_devices=2, num_microbatches=8, device_memory=memory, reserve=0, partition=[7, 3],
                       recompute="per-stage", solver="heuristic", time_limit=30, workers=1)
        timeline = simulate(result.schedule)
        assert timeline.makespan == result.step_time
        check_fits(result.costs, timeline)
        chosen[memory] = described(model, result.costs.ranges, result.costs.recomputed)
    assert chosen == {6 * GIB: "per-stage:5,0", 64 * GIB: "none"}
    assert parse_recompute(chosen[6 * GIB]).layers(model, [(0, 7), (7, 10)]) == set(range(1, 6))
