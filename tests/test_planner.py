"""The planner: the split bound against every partition of small models, plans that are valid, fit their memory,
never lose to a baseline that fits and never beat their bound, and `zbsolve plan` end to end."""

from __future__ import annotations

import concurrent.futures as cf
import itertools
import math
import json

import pytest
from typer.testing import CliRunner

from conftest import ROOT, heavy_head
from zbsolve.app.cli import app
from zbsolve.io.costs_section import document_costs
from zbsolve.problem.costs import check_fits
from zbsolve.io.document import from_document
from zbsolve.base.errors import InfeasibleError, InputError
from zbsolve.costmodel.model import Model
from zbsolve.problem.partition import stage_profile
from zbsolve.core.placement import interleaved, sequential, vshape
from zbsolve.planning.baselines import baselines
from zbsolve.planning.planner import plan
from zbsolve.core.simulator import simulate
from zbsolve.optimize.solve import solve
from zbsolve.planning.split_bound import split_bound
from zbsolve.base.units import GIB

runner = CliRunner()


def compositions(total: int, parts: int):
    """Every way to cut ``total`` layers into ``parts`` non-empty contiguous stages."""
    for cuts in itertools.combinations(range(1, total), parts - 1):
        ends = (0, *cuts, total)
        yield tuple(b - a for a, b in zip(ends, ends[1:]))


def brute_largest(model: Model, counts, layout, m: int) -> float:
    ends = [sum(counts[:s]) for s in range(len(counts) + 1)]
    work = [sum(x.t_f + x.t_b + x.t_w for x in model.layers[a:b]) for a, b in zip(ends, ends[1:])]
    heads = [sum(x.t_f for x in model.layers[:a]) + s * model.t_comm for s, a in enumerate(ends[:-1])]
    held = [[s for s, d in enumerate(layout.routes[0]) if d == dev] for dev in range(layout.num_devices)]
    return max(heads[st[0]] + m * sum(work[s] for s in st) for st in held)


@pytest.mark.parametrize("layout", [sequential(3), interleaved(2, 2), vshape(2, 2)], ids=["seq", "int", "v"])
def test_split_bound_is_the_least_head_plus_work_over_every_partition(layout):
    model = heavy_head(blocks=6, head=2.5, t_comm=0.25)
    found = split_bound(model, layout, 4)
    best = min(brute_largest(model, c, layout, 4) for c in compositions(len(model.layers), layout.num_stages))
    assert found.optimal and found.value == pytest.approx(best)
    assert found.bound == pytest.approx(best, rel=1e-6) and found.bound <= best
    assert brute_largest(model, found.counts, layout, 4) == pytest.approx(best)


def test_a_placement_without_any_partition_bounds_nothing():
    """An embedding without B time cannot be a stage of its own: with as many stages as layers no partition exists,
    so that placement bounds no plan (an infinite bound, not 0), and a plan's bound comes from the others."""
    model = heavy_head(blocks=2)
    model = model.model_copy(update={"layers": [model.layers[0].model_copy(update={"t_b": 0.0}), *model.layers[1:]]})
    none = split_bound(model, sequential(len(model.layers)), 4)
    assert none.bound == math.inf and none.counts is None
    assert math.isfinite(split_bound(model, sequential(2), 4).bound)


def test_split_bound_is_below_every_schedule_on_every_partition():
    """The bound holds for the heuristic's schedule (with the makespan) on every partition of a small model."""
    model, layout, m = heavy_head(blocks=4, head=2.0, t_comm=0.1), sequential(2), 4
    bound = split_bound(model, layout, m).bound
    steps = []
    for counts in compositions(len(model.layers), 2):
        steps.append(solve(model, num_devices=2, num_microbatches=m, partition=list(counts), solver="heuristic")
                     .step_time)
    assert bound <= min(steps) + 1e-9


@pytest.fixture(scope="module")
def planned():
    """Heavy with 8 blocks on 4 devices (the search's longest plan here). Its tests are marked
    ``xdist_group("planned")`` so that ``--dist loadgroup`` runs them on one worker, which plans once."""
    with cf.ThreadPoolExecutor(1) as pool:
        return plan(heavy_head(blocks=8), num_devices=4, num_microbatches=8, device_memory="16GiB", reserve=0,
                    time_limit=20, executor=pool)


@pytest.mark.xdist_group("planned")
def test_a_plan_is_valid_fits_and_never_loses_to_a_fitting_baseline(planned):
    timeline = simulate(planned.timeline.schedule)
    assert timeline.makespan == planned.step_time
    assert sum(planned.counts) == len(planned.costs.model.layers) == 11 and len(planned.counts) == 4 * planned.chunks
    for static, peak in zip(planned.costs.static_bytes, timeline.peak_memory):
        assert static + peak <= 16 * GIB
    fitting = [b.step_time for b in planned.baselines if b.fits and b.step_time is not None]
    assert fitting and planned.step_time <= min(fitting) * (1 + 1e-9)
    assert planned.lower_bound <= planned.step_time and 0 <= planned.gap < 1
    assert planned.step_time <= min(c.step_time for c in planned.candidates) * (1 + 1e-9)  # never slower than timed
    # The head weighs three blocks: moving blocks off the last stage beats the uniform split.
    assert planned.step_time < planned.best_baseline("uniform").step_time
    profile = stage_profile(planned.costs.model, planned.costs.ranges)
    assert planned.timeline.schedule.profile.t_f == profile.t_f


@pytest.mark.xdist_group("planned")
def test_baselines_cover_every_split_and_builtin(planned):
    names = {(b.split, b.schedule, b.recompute) for b in planned.baselines}
    assert {(s, r) for s, _, r in names} == {("uniform", "none"), ("torchtitan", "none"), ("megatron", "none"),
                                              ("uniform", "full"), ("torchtitan", "full")}
    assert len(names) == 30
    layers = planned.costs.model.layers
    for b in planned.baselines:
        if b.step_time is not None:
            # A recomputing block's B runs its forward again: its F time counts twice.
            work = sum(x.t_f + x.t_b + x.t_w + (x.t_f if b.recompute == "full" and x.block else 0) for x in layers)
            assert b.bubble == pytest.approx(1 - work * 8 / (4 * b.step_time), rel=1e-6)
        else:
            assert b.note and not b.fits


def test_gpipe_does_not_fit_where_1f1b_does():
    model = heavy_head()
    rows = {(b.split, b.schedule): b for b in baselines(model, 4, 8, int(6.5 * GIB), reserve=0)
            if b.recompute == "none"}
    assert rows["uniform", "1F1B"].fits and not rows["uniform", "GPipe"].fits


def test_plan_refuses_bad_input_and_names_what_does_not_fit():
    model = heavy_head()
    with pytest.raises(InputError, match="placement = 'ring' is unknown"):
        plan(model, num_devices=4, num_microbatches=8, device_memory="16GiB", placement="ring")
    with pytest.raises(InputError, match="device_memory = None: give the memory per device"):
        plan(model, num_devices=4, num_microbatches=8)
    with pytest.raises(InfeasibleError, match="no partition of heavy over 4 devices fits device_memory 2.00 GiB"):
        with cf.ThreadPoolExecutor(1) as pool:
            plan(model, num_devices=4, num_microbatches=8, device_memory="2GiB", reserve=0, time_limit=5,
                 executor=pool)


def test_a_plan_that_cannot_fit_names_the_closest_candidate_and_what_would_help():
    """Each of the 15 layers holds 1 GiB for the step and 64 MiB per microbatch: some device holds four, and at
    4.1 GiB their static bytes fit and one microbatch's activations (0.25 GiB) do not; at 3.1 GiB not even the
    static bytes fit."""
    with cf.ThreadPoolExecutor(1) as pool, pytest.raises(InfeasibleError) as error:
        plan(heavy_head(), num_devices=4, num_microbatches=8, device_memory="4.1GiB", reserve=0, time_limit=5,
             placement="sequential", executor=pool)
    line = str(error.value)
    assert "; the closest, sequential x1 [" in line and " does not fit: static 4.00 GiB + one microbatch's " \
           "activations 0.25 GiB + reserve 0.00 GiB exceed device_memory 4.10 GiB by 0.15 GiB" in line, line
    assert line.endswith("what would help: more devices, a smaller microbatch or a shorter sequence (every candidate "
                         "already runs one microbatch at a time where it must, and no baseline fits with every block "
                         "recomputed)")
    with cf.ThreadPoolExecutor(1) as pool, pytest.raises(InfeasibleError) as error:
        plan(heavy_head(), num_devices=4, num_microbatches=8, device_memory="3.1GiB", reserve=0, time_limit=5,
             placement="sequential", executor=pool)
    assert str(error.value).endswith("what would help: more devices, or weights and optimizer states sharded further "
                                     "(zbsolve estimate --tp, --zero)")


def test_a_plan_cut_short_says_what_it_did_not_time_and_claims_nothing_of_the_rest(monkeypatch):
    """Where the time limit left choices untimed, the refusal names them and what a longer limit does, and claims
    nothing of what would help: an untimed choice might fit."""
    from zbsolve.planning.search import Search

    monkeypatch.setattr(Search, "starts", lambda self, stop_at, running=False: not running and not self.timed)
    with cf.ThreadPoolExecutor(1) as pool, pytest.raises(InfeasibleError) as error:
        plan(heavy_head(), num_devices=4, num_microbatches=8, device_memory="3.1GiB", reserve=0, time_limit=5,
             placement="sequential", recompute="auto", executor=pool)
    line = str(error.value)
    assert line.startswith("no partition of heavy over 4 devices timed fits device_memory 3.10 GiB"), line
    assert " placement and recomputation choices (sequential x1 recompute " in line and "what would help" not in line
    assert line.endswith("not timed within the time limit: a longer one times them"), line


@pytest.mark.parametrize("args, needle", [
    (["--device-memory", "80"], "device_memory = '80' is 80 bytes (a size without a unit is in bytes): did you mean "
                                "80GiB?"),
    (["--device-memory", "16GiB", "--reserve", "16GiB"], "reserve = '16GiB' (16.00 GiB) leaves nothing of "
                                                         "device_memory = '16GiB' (16.00 GiB)"),
    (["--device-memory", "16GiB", "--zero-times"], "heavy: t_f = 0 on every layer: a model needs positive F, B and "
                                                   "W times"),
])
def test_plan_refuses_sizes_and_times_that_cannot_be_meant(tmp_path, args, needle):
    """Bad input, each one line and exit 2, not "does not fit"."""
    model = heavy_head()
    if "--zero-times" in args:
        args.remove("--zero-times")
        model = model.model_copy(update={"layers": [layer.model_copy(update={"t_f": 0.0, "t_b": 0.0, "t_w": 0.0})
                                                    for layer in model.layers]})
    path = tmp_path / "heavy.yaml"
    model.save(path)
    done = runner.invoke(app, ["plan", str(path), "-p", "4", "-m", "8", "--jobs", "1", *args])
    assert done.exit_code == 2 and needle in " ".join(done.output.split()), done.output


SCRIPT = """
import zbsolve
result = zbsolve.plan({path!r}, num_devices=2, num_microbatches=4, device_memory="16GiB", placement="sequential",
                      time_limit=10, jobs=2)
print("planned", result.step_time)
"""


def test_plan_runs_from_a_script_without_a_main_guard(tmp_path):
    """Worker processes do not import the script again (a spawn would, and each would plan in turn or fail)."""
    import subprocess
    import sys

    path = tmp_path / "heavy.yaml"
    heavy_head(blocks=6).save(path)
    script = tmp_path / "script.py"
    script.write_text(SCRIPT.format(path=str(path)))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.count("planned") == 1 and not run.stderr, run.stdout + run.stderr


def test_plan_command_writes_a_document_that_checks(tmp_path):
    out, chart = tmp_path / "plan.json", tmp_path / "plan.png"
    path = tmp_path / "heavy.yaml"
    heavy_head().save(path)
    done = runner.invoke(app, ["plan", str(path), "-p", "2", "-m", "4", "--device-memory", "16GiB", "--placement",
                               "sequential", "--time-limit", "10", "--jobs", "1", "-o", str(out), "--chart",
                               str(chart)])
    assert done.exit_code == 0, done.output
    assert "baselines on the same costs" in done.output and "ZBVZeroBubble" in done.output
    doc = json.loads(out.read_text())
    assert doc["plan"]["placement"] == "sequential" and doc["partition"]["stages"][0][0] == 0
    stages = doc["plan"]["stage_layers"]  # the model's module names, one stage a device
    assert stages[0].startswith("tok_embeddings, layers.0") and stages[-1].endswith("-11, norm, output")
    assert doc["plan"]["device_layers"] == stages
    schedule, _ = from_document(doc)
    check_fits(document_costs(doc, schedule, "plan"), simulate(schedule))
    assert runner.invoke(app, ["check", str(out), "-q"]).exit_code == 0
    assert chart.read_bytes()[:4] == b"\x89PNG"


def test_plan_of_a_real_model_file():
    """Llama-3-8B's estimate on 4 devices: the plan fits its H100s and beats the uniform split."""
    model = Model.load(ROOT / "problems" / "models" / "llama3-8b.yaml")
    with cf.ThreadPoolExecutor(1) as pool:
        result = plan(model, num_devices=4, num_microbatches=8, placement="sequential", time_limit=10,
                      executor=pool)
    assert result.costs.device_memory == 81559 * 2**20
    assert result.step_time <= result.best_baseline("uniform").step_time


@pytest.mark.xdist_group("dask")
def test_candidates_are_timed_on_a_dask_cluster(dask_address):
    result = plan(heavy_head(blocks=6), num_devices=2, num_microbatches=4, device_memory="16GiB",
                  placement="sequential", time_limit=10, executor=dask_address)
    assert any(c.origin == "split bound" for c in result.candidates)
    assert simulate(result.timeline.schedule).makespan == result.step_time


def test_a_plan_keeps_to_the_placement_asked_for():
    with cf.ThreadPoolExecutor(1) as pool:
        result = plan(heavy_head(blocks=6), num_devices=4, num_microbatches=8, device_memory="16GiB",
                      reserve="0GiB", placement="sequential", time_limit=5, executor=pool)
    assert result.placement == "sequential" and result.chunks == 1
    assert {c.placement for c in result.candidates} == {"sequential"}
    with pytest.raises(InputError, match="num_devices = 8: 16 stages need at least as many layers, and the model "
                                         "has 9"):
        plan(heavy_head(blocks=6), num_devices=8, num_microbatches=8, device_memory="16GiB", placement="vshape")


def test_chunks_auto_searches_two_to_eight_stages_per_device_that_the_layers_allow():
    from zbsolve.planning.placement_choices import search_placements

    assert search_placements("interleaved", "auto", 2, 20, 8) == [("interleaved", c) for c in range(2, 9)]
    assert search_placements("vshape", "auto", 2, 20, 8) == [("vshape", c) for c in (2, 4, 6, 8)]
    assert search_placements("auto", "auto", 4, 15, 8) == [("sequential", 1), ("interleaved", 2),
                                                            ("interleaved", 3), ("vshape", 2)]
    with pytest.raises(InputError, match="chunks = 'many' must be a whole number >= 1 or 'auto'"):
        search_placements("interleaved", "many", 2, 20, 8)


def test_a_plan_with_chunks_auto_picks_a_searched_count_and_is_valid():
    """Whatever the time limit let the search time (every count is timed once before any twice:
    ``test_every_option_is_timed_once_before_any_is_timed_twice``), the plan is one of the counts searched, no slower
    than any candidate timed."""
    with cf.ThreadPoolExecutor(1) as pool:
        result = plan(heavy_head(blocks=16), num_devices=2, num_microbatches=4, device_memory="32GiB", reserve=0,
                      placement="interleaved", chunks="auto", time_limit=2, executor=pool)
    assert {c.chunks for c in result.candidates} <= set(range(2, 9)) and result.chunks in range(2, 9)
    assert result.step_time <= min(c.step_time for c in result.candidates) * (1 + 1e-9)
    assert result.placement == "interleaved" and len(result.counts) == 2 * result.chunks
    assert simulate(result.timeline.schedule).makespan == result.step_time
    assert result.lower_bound <= result.step_time


@pytest.mark.parametrize("chunks", ["many", "0", "-2"])
def test_plan_command_refuses_chunks_that_are_no_count(chunks):
    run = runner.invoke(app, ["plan", str(ROOT / "problems" / "models" / "llama3-8b.yaml"), "-p", "4", "-m", "8",
                              "--chunks", chunks])
    assert run.exit_code == 2
    assert f"error: --chunks = '{chunks}' must be a whole number >= 1 or auto" in " ".join(run.output.split())


def test_placements_dropped_from_the_search_are_named_with_why():
    """``--chunks 100`` over 8 devices of 83 layers leaves the sequential placement alone, and says so; an odd count
    drops the V-shape alone (``auto`` takes it for the interleaved placement too); counts of ``--chunks auto`` over
    the layers or the size limit are named together."""
    from zbsolve.planning.placement_choices import search_placements

    def searched(*args):
        notes: list[str] = []
        return search_placements(*args, notes.append), notes

    assert searched("auto", 100, 8, 83, 64) == ([("sequential", 1)], [
        "interleaved x100: not searched: 800 stages over 8 devices, more than the model's 83 layers",
        "vshape x100: not searched: 800 stages over 8 devices, more than the model's 83 layers"])
    assert searched("auto", 3, 8, 83, 64) == ([("sequential", 1), ("interleaved", 3)], [
        "vshape x3: not searched: the V-shape needs an even number of stages per device"])
    kept, notes = searched("auto", "auto", 16, 83, 64)
    assert ("interleaved", 5) in kept and ("interleaved", 6) not in kept and ("vshape", 6) not in kept
    assert notes == ["interleaved x6, x7, x8: not searched: 96 or more stages over 16 devices, more than the "
                     "model's 83 layers",
                     "vshape x6, x8: not searched: 96 or more stages over 16 devices, more than the model's 83 layers"]
    kept, notes = searched("interleaved", "auto", 8, 83, 100_000)
    assert kept == [("interleaved", c) for c in (2, 3, 4)]
    assert notes == ["interleaved x5, x6, x7, x8: not searched: 40 or more stages over 8 devices are over the size "
                     "limit (40 stages x 100000 microbatches would be 12,000,000 passes; the limit is 10,000,000: "
                     "give fewer --devices or --microbatches)"]
    assert searched("auto", None, 4, 15, 8) == ([("sequential", 1), ("interleaved", 2), ("vshape", 2)], [])


def test_chunks_asked_for_with_a_placement_that_cannot_take_them_is_refused_naming_chunks(tmp_path):
    from zbsolve.planning.placement_choices import search_placements

    with pytest.raises(InputError, match=r"^chunks = 100: interleaved over 8 devices with 100 stages per device is "
                                         r"800 stages, and the model has 83 layers \(at most 10 stages per device\)$"):
        search_placements("interleaved", 100, 8, 83, 64)
    path = tmp_path / "heavy.yaml"
    heavy_head().save(path)
    done = runner.invoke(app, ["plan", str(path), "-p", "4", "-m", "8", "--device-memory", "16GiB", "--placement",
                               "vshape", "--chunks", "4", "--jobs", "1"])
    assert done.exit_code == 2
    assert done.output.strip().splitlines() == ["error: chunks = 4: vshape over 4 devices with 4 stages per device is "
                                                "16 stages, and the model has 15 layers (at most 3 stages per device)"]


def test_a_plan_says_which_placements_it_did_not_search(tmp_path):
    """The log of the plan and, on the command line, a note on stderr; an odd --chunks plans without the V-shape
    (it was refused whole)."""
    with cf.ThreadPoolExecutor(1) as pool:
        result = plan(heavy_head(blocks=4), num_devices=2, num_microbatches=4, device_memory="32GiB", reserve=0,
                      chunks=3, time_limit=5, executor=pool)
    assert "vshape x3: not searched: the V-shape needs an even number of stages per device" in result.log.splitlines()
    assert {(c.placement, c.chunks) for c in result.candidates} == {("sequential", 1), ("interleaved", 3)}
    path = tmp_path / "heavy.yaml"
    heavy_head(blocks=4).save(path)
    done = runner.invoke(app, ["plan", str(path), "-p", "4", "-m", "8", "--device-memory", "16GiB", "--chunks", "100",
                               "--time-limit", "5", "--jobs", "1", "--json"])
    assert done.exit_code == 0, done.output
    assert done.stderr.splitlines() == [
        "note: interleaved x100: not searched: 400 stages over 4 devices, more than the model's 7 layers",
        "note: vshape x100: not searched: 400 stages over 4 devices, more than the model's 7 layers"]
    assert json.loads(done.stdout)["placement"] == "sequential"


def test_every_option_is_timed_once_before_any_is_timed_twice():
    """The first candidates the search times cover every (placement, stages per device, recomputation) option, so
    that a deadline that stops the timing early leaves none of them untimed."""
    import concurrent.futures as cf
    import time

    from conftest import act_heavy
    from zbsolve.planning.search import Search, bounds
    from zbsolve.problem.request import Request

    options = [(name, c, rc) for name, c in (("sequential", 1), ("interleaved", 2), ("vshape", 2))
               for rc in ("none", "full")]
    request = Request(num_microbatches=8, num_devices=2, device_memory=80 * 2**30, reserve=0)
    with cf.ThreadPoolExecutor(1) as pool:
        search = Search(act_heavy(), request, time.monotonic() + 60, pool, 1, [], None)
        asked: list[list[tuple]] = []
        search.time_all = lambda jobs, stop_at: asked.append(jobs) or []
        bounds(search, options, 2.0, time.monotonic() + 60)
    early, jobs = asked
    assert len(early) == 1 and early[0][:3] == options[0]  # timed while the bound models run
    assert len(jobs) > len(options)  # several partitions an option
    assert {job[:3] for job in jobs[:len(options)]} == set(options)
