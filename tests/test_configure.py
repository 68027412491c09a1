"""``zbsolve configure``: the configurations it enumerates divide as ``predict`` needs, its bounds never exceed
``predict``'s step, its ranking is brute force's, every candidate is the ``zbsolve predict`` line it prints, and the
chosen plan is the simulator's."""

from __future__ import annotations

import concurrent.futures as cf
import itertools
import json
import re
import shlex
import threading
import time

import pytest
from conftest import ROOT, failed_cleanly, zbsolve
from typer.testing import CliRunner

from zbsolve.app.cli import app
from zbsolve.base.checks import exceeds
from zbsolve.base.errors import InfeasibleError, InputError
from zbsolve.base.units import MIB
from zbsolve.configure import choose as configure_module
from zbsolve.configure import search as configure_search
from zbsolve.configure import space as configurations
from zbsolve.configure.bounds import ModelAsOneStage, group_bound, group_fits, group_need
from zbsolve.configure.choose import configure, predicted_plan
from zbsolve.configure.predict import Configuration, configured_model, degrees, predict
from zbsolve.configure.result import predicted_memory_gib
from zbsolve.configure.search import BranchAndBound
from zbsolve.configure.space import (
    Assessed,
    Dropped,
    Group,
    Space,
    assess,
    decided_choices,
    expert_refusal,
    groups,
    shape_groups,
    shape_refusal,
    shape_size,
    shapes,
    vp_choices,
)
from zbsolve.core.simulator import simulate
from zbsolve.io.targets import TARGETS
from zbsolve.planning.result import OWN_ORDER
from zbsolve.problem.costs import check_fits
from zbsolve.problem.recompute import parse_recompute

DENSE = ROOT / "tests" / "data" / "tiny-llama.json"
"""Four blocks, four heads over two key/value heads."""
MOE = ROOT / "tests" / "data" / "tiny-moe.json"
"""Four blocks of eight experts, two a token."""
SMALL = dict(gpus=4, global_batch=16, seq_len=256, device_memory=16 * MIB, reserve=0)
"""So little memory that the fastest configurations pipeline."""
TOP = 5
NEVER = 600.0
"""A time limit the searches of these small spaces never reach (they finish within seconds, a tiny model's plan
too): their verdicts do not depend on the machine's load."""


def key(c: Configuration) -> tuple:
    return c.tp, c.pp, c.vp, c.cp, c.ep, c.microbatch_size, c.zero, c.recompute, c.partition


@pytest.fixture(scope="module")
def configured():
    with cf.ThreadPoolExecutor(1) as pool:
        return configure(DENSE, **SMALL, top=TOP, refine=1, time_limit=NEVER, executor=pool)


def test_every_configuration_enumerated_divides_as_predict_needs():
    space = Space.of(DENSE, gpus=4, global_batch=8, seq_len=256)
    found = list(groups(space))
    valid = [g for g in found if isinstance(g, Group)]
    assert valid and any(isinstance(g, Dropped) and "not a multiple" in g.why for g in found)
    for g in valid:
        c = g.configuration
        assert degrees(c) == (g.dp, g.num_microbatches)
        assert c.tp * c.pp * c.cp * g.dp == 4 and c.microbatch_size * g.dp * g.num_microbatches == 8
        assert c.tp in (1, 2) and c.cp in (1, 2, 4) and c.ep == 1 and c.zero in (0, 1, 3)  # 2 key/value heads
        assert all(c.pp * vp <= 4 for vp in g.vps) and (c.pp > 1 or g.vps == (1,))
        assert not parse_recompute(c.recompute).undecided
    assert Space.of(MOE, gpus=16, global_batch=8, seq_len=256).menus()["ep"] == (1, 2, 4, 8) and space.menus()["ep"] == (1,)
    assert Space.of(DENSE, gpus=4, global_batch=8, seq_len=256, target="torchtitan").menus()["zero"] == (3,)
    moe = Configuration(config=MOE, gpu="h100", dtype="bf16", seq_len=256, microbatch_size=1, global_batch=8,
                        gpus=8, tp=2, pp=2, ep=8)
    assert expert_refusal(moe, 2) == "ep = 8: should divide tp x cp x dp = 2 x 1 x 2 = 4, the ranks of a stage"
    assert expert_refusal(moe.replace(ep=4), 2) is None


@pytest.mark.parametrize("config, gpus, memory", [(DENSE, 4, 12 * MIB), (MOE, 8, 20 * MIB)], ids=["dense", "moe"])
def test_the_memory_prune_drops_what_group_fits_drops_and_estimates_less(config, gpus, memory, monkeypatch):
    """A choice pruned at a micro-batch size is pruned at the larger ones and at the less sharded ZeRO levels
    without its model: the groups kept and the configurations pruned are those of ``group_fits`` on every model."""
    space = Space.of(config, gpus=gpus, global_batch=16, seq_len=256, device_memory=memory, reserve=0)
    estimated = []

    def counting(c: Configuration, dp: int):
        model = configured_model(c, dp)
        estimated.append(c)
        return model

    monkeypatch.setattr(configurations, "configured_model", counting)
    found = list(groups(space))
    fitting, pruned, models = set(), 0, 0  # every model estimated, every choice checked
    for shape in (shape for shape in shapes(space) if shape_refusal(space, shape) is None):
        for size, zero in itertools.product(space.menus()["microbatch_size"], space.menus()["zero"]):
            c = space.configuration(microbatch_size=size, zero=zero, **shape)
            try:
                model = configured_model(c, degrees(c)[0])
            except InputError:
                continue
            models += 1
            for choice in decided_choices(space.target, model):
                if group_fits(ModelAsOneStage(model), c.replace(recompute=choice)) is None:
                    fitting.add(c.replace(recompute=choice))
                else:
                    pruned += len(vp_choices(c.pp, space.blocks()))
    assert {g.configuration for g in found if isinstance(g, Group)} == fitting
    assert sum(d.size for d in found if isinstance(d, Dropped) and d.memory) == pruned > 0
    assert len(estimated) < models


@pytest.mark.parametrize("config, gpus, degrees_, combined", [
    (DENSE, 4, dict(tp=2, pp=2, vp=2), False),
    (DENSE, 4, dict(pp=4, zero=0, recompute="full"), False),
    (DENSE, 4, dict(pp=2, vp=2, cp=2, zero=3, recompute="uniform:1", microbatch_size=2), False),
    (DENSE, 4, dict(recompute="modules:mlp"), False),
    (MOE, 8, dict(pp=2, vp=2, ep=4), True),  # Megatron's combined 1F1B: overlapped F&B pairs
    (MOE, 8, dict(pp=4, ep=2, recompute="full"), False),
    (MOE, 8, dict(ep=8), True),
], ids=["tp-interleaved", "pp4-full", "cp-zero3", "modules", "moe-combined", "moe-full", "moe-one-stage"])
def test_the_bounds_are_never_above_predict_s_step(config, gpus, degrees_, combined):
    space = Space.of(config, gpus=gpus, global_batch=8, seq_len=256, device_memory=8 * MIB, reserve=0)
    c = space.configuration(**degrees_)
    dp, m = degrees(c)
    model = configured_model(c, dp)
    bound = group_bound(ModelAsOneStage(model), m, c.pp, parse_recompute(c.recompute), combined)
    found = assess(space, Group(c.replace(vp=1), dp, m, (c.vp,), bound))  # a split each (uniform, balanced)
    assert found
    for assessed in found:
        assert isinstance(assessed, Assessed)
        p = predict(assessed.configuration)
        assert not exceeds(bound, assessed.bound) and not exceeds(assessed.bound, p.step_time_s)
        assert assessed.fits or not p.fits  # where one microbatch cannot fit, predict's order does not either
        assert (assessed.configuration.schedule == "Combined1F1B") == combined


def test_the_ranking_is_brute_force_s(configured):
    """Every configuration enumerated, predicted: the fastest that fit are the ones configure ranks."""
    space = Space.of(DENSE, gpus=SMALL["gpus"], global_batch=SMALL["global_batch"], seq_len=SMALL["seq_len"])  # nothing pruned for memory
    fitting = []
    for group in groups(space):
        for one in assess(space, group) if isinstance(group, Group) else ():
            if isinstance(one, Assessed):
                c = one.configuration.replace(device_memory=SMALL["device_memory"], reserve=0)
                try:
                    p = predict(c)
                except Exception:  # predict's refusal: invalid
                    continue
                if p.fits:
                    fitting.append((p.step_time_s, key(c)))
    ranked = sorted((r.prediction.step_time_s, key(r.configuration)) for r in configured.candidates)
    assert ranked == sorted(fitting)[:TOP]
    counts = configured.counts
    assert counts.enumerated == (counts.invalid + counts.pruned_memory + counts.pruned_bound + counts.timed
                                 + counts.untimed) and counts.pruned_memory and counts.pruned_bound
    assert counts.untimed == 0 and counts.refined == 1 and not configured.interrupted


def test_every_candidate_is_its_predict_command_line(configured):
    for r in configured.candidates:
        assert predict(r.configuration) == r.prediction
        args = shlex.split(r.command)
        assert args[:2] == ["zbsolve", "predict"]
        done = CliRunner().invoke(app, [*args[1:], "--json"])
        assert done.exit_code == 0, done.output
        assert json.loads(done.output)["step_time_s"] == r.prediction.step_time_s


def test_the_chosen_plan_is_the_simulator_s_and_exports_for_megatron(configured, tmp_path):
    chosen, planned = configured.chosen, configured.plan
    assert planned is not None and chosen.configuration.pp > 1
    assert planned.step_time == (chosen.planned_step_s if chosen.planned else chosen.prediction.step_time_s)
    timeline = simulate(planned.timeline.schedule)
    assert timeline.makespan == planned.step_time
    check_fits(planned.costs, timeline)
    assert chosen.step_s == min(planned.step_time, chosen.prediction.step_time_s)
    assert all(chosen.step_s <= r.step_s for r in configured.candidates)
    assert [r.why == "" for r in configured.candidates] == [True] + [False] * (len(configured.candidates) - 1)
    text = configured.export(tmp_path / "megatron.txt")
    assert "--pipeline-model-parallel-layout" in text and (tmp_path / "megatron.txt").read_text() == text + "\n"
    assert f"--pipeline-model-parallel-size {chosen.configuration.pp}" in text


@pytest.mark.parametrize("refine", [0, 1])
def test_a_chosen_configuration_not_refined_has_its_predicted_order_as_its_plan(refine, monkeypatch):
    """Without refining, or where its plan finds nothing that fits, the chosen configuration's plan is its order as
    ``predict`` simulated it: the same step, within its memory, its bound unknown."""
    def no_plan(*args, **kwargs):
        raise configure_module.InfeasibleError("nothing fits in this share")

    monkeypatch.setattr(configure_module, "plan", no_plan)
    with cf.ThreadPoolExecutor(1) as pool:
        done = configure(DENSE, **SMALL, top=2, refine=refine, time_limit=NEVER, executor=pool)
    chosen, planned = done.chosen, done.plan
    assert chosen.configuration.pp > 1 and planned is not None and done.counts.refined == 0
    assert planned.step_time == chosen.prediction.step_time_s == chosen.step_s and planned.lower_bound is None
    assert planned.source == TARGETS["megatron"].label + OWN_ORDER and planned.target == "megatron"
    timeline = simulate(planned.timeline.schedule)
    assert timeline.makespan == planned.step_time
    check_fits(planned.costs, timeline)
    assert planned.counts == chosen.prediction.counts and planned.chunks == chosen.configuration.vp
    assert "--pipeline-model-parallel-layout" in done.export()
    assert any("no plan" in note for note in done.notes) == bool(refine)


def test_a_pipelined_configuration_s_plan_exports_for_torchtitan_and_torchtitan_takes_it(tmp_path):
    """For torchtitan, a pipelined configuration of the space (this tiny model's fastest does not pipeline) has its
    order as predicted as its plan (``predicted_plan``, what configure plans a choice with when it does not refine),
    which exports a folder whose arguments torchtitan's own ConfigManager parses, its checks run, into its
    degrees."""
    from conftest import load_torchtitan_config

    space = Space.of(DENSE, target="torchtitan", **{**SMALL, "global_batch": 64, "device_memory": 64 * MIB},
                     calibration=None)
    chosen = space.configuration(pp=2)
    assert chosen.runtime == "torchtitan" and predict(chosen).fits
    planned, _ = predicted_plan(chosen, "torchtitan")
    assert planned.target == "torchtitan" and planned.step_time == predict(chosen).step_time_s
    check_fits(planned.costs, simulate(planned.timeline.schedule))
    planned.export("torchtitan", tmp_path / "tt")
    parsed = load_torchtitan_config(shlex.split((tmp_path / "tt" / "torchtitan-args.txt").read_text()))
    config = json.loads((tmp_path / "tt" / "torchtitan.json").read_text())
    assert parsed.parallelism.pipeline_parallel_degree == chosen.pp == config["parallelism"]["pipeline_parallel_degree"]
    assert parsed.parallelism.tensor_parallel_degree == chosen.tp


def test_the_chart_draws_every_configuration_timed_and_marks_the_chosen(configured, tmp_path):
    """Every configuration timed is a point at its predicted memory and throughput, those that do not fit apart, the
    chosen one at the table's figures, the device memory a line; ``plot`` writes it where asked."""
    timed = configured.timed
    assert len(timed) == configured.counts.timed and sum(not t.fits for t in timed) == configured.counts.unfit
    ranked = {key(r.configuration): r.prediction for r in configured.candidates}
    for t in timed:
        if key(t.configuration) in ranked:
            p = ranked[key(t.configuration)]
            assert (t.tokens_per_s_per_gpu, t.memory_gib, t.fits) == (p.tokens_per_s_per_gpu,
                                                                      predicted_memory_gib(p), True)
    fig = configured.plot(tmp_path / "candidates.png")
    assert (tmp_path / "candidates.png").stat().st_size > 0
    [ax] = fig.axes
    points = {c.get_label().split(" (")[0]: c.get_offsets() for c in ax.collections}
    unfit = points.get("timed, does not fit", [])
    assert len(points["timed, fits"]) + len(unfit) == len(timed)
    assert sorted(map(tuple, unfit)) == sorted((t.memory_gib, t.tokens_per_s_per_gpu)
                                                                       for t in timed if not t.fits)
    chosen = configured.chosen
    named = "chosen" if configured.complete else "best found"
    assert [tuple(xy) for xy in points[named]] == [(chosen.memory_gib, chosen.tokens_per_s_per_gpu)]
    [line] = ax.get_lines()
    assert line.get_xdata()[0] == chosen.prediction.device_memory_gib  # reserve 0: no second line
    assert ax.get_xlabel() == "peak memory per device (GiB)" and ax.get_ylabel() == "tokens/s/GPU"
    assert "<table>" in configured._repr_html_() and ": zbsolve predict" in configured._repr_html_()


def test_an_interrupt_ranks_what_was_timed(monkeypatch):
    """An interrupt once three configurations that fit are timed: the result ranks what was timed, and nothing is
    planned."""
    timed, fitting = [], []

    def stopping(c: Configuration):
        if len(fitting) == 3:
            raise KeyboardInterrupt
        timed.append(c)
        figures = predict(c)
        fitting.extend([c] * figures.fits)
        return figures

    monkeypatch.setattr(configure_search, "time_configuration", stopping)
    with cf.ThreadPoolExecutor(1) as pool:
        result = configure(DENSE, **SMALL, top=TOP, refine=1, executor=pool)
    assert result.interrupted and result.plan is None and result.counts.untimed
    assert {key(r.configuration) for r in result.candidates} <= {key(c) for c in timed}


def test_without_a_fit_by_its_share_the_timing_goes_on_until_one_fits(monkeypatch):
    """The whole time left kept for refining: nothing is timed within the timing's share, so the timing goes on into
    the refining share until a configuration timed fits (those in flight then finish), and that one is planned."""
    monkeypatch.setattr(configure_module, "REFINE_SHARE", 1.0)
    with cf.ThreadPoolExecutor(1) as pool:
        result = configure(DENSE, **SMALL, top=TOP, refine=1, time_limit=20, jobs=1, executor=pool)
    assert 1 <= len(result.candidates) <= 1 + configure_module.IN_FLIGHT and result.counts.untimed
    assert result.plan is not None and result.counts.refined == 1


def test_the_enumeration_stops_at_its_time_and_counts_the_shapes_left(monkeypatch):
    """The shapes left when the enumeration's time is up are counted as not enumerated, outside the others."""
    space = Space.of(DENSE, gpus=4, global_batch=16, seq_len=256, target="zbsolve", device_memory=20 * MIB,
                     reserve=0)  # its choices need no model
    search = BranchAndBound(space, TOP, time.monotonic() + 60, lambda line: None)
    done = []

    def enumerating(space: Space, shape: dict[str, int]):
        done.append(shape)
        if len(done) == 3:
            search.enumerate_by = 0.0  # its time is up
        return shape_groups(space, shape)

    monkeypatch.setattr(configure_search, "shape_groups", enumerating)
    with cf.ThreadPoolExecutor(1) as pool:
        search.run(pool, 1)
    counts = search.counts(0)
    assert len(done) == 3 and counts.unenumerated and "not enumerated" in counts.line()
    assert counts.enumerated + counts.unenumerated == sum(shape_size(space, shape) for shape in shapes(space))
    assert counts.enumerated == (counts.invalid + counts.pruned_memory + counts.pruned_bound + counts.timed
                                 + counts.untimed)


def test_the_jobs_running_at_the_deadline_are_left_untimed(monkeypatch):
    """The search returns at its deadline without waiting for the job still running (here every timing is stuck
    until released): what it held is counted untimed, or not enumerated."""
    release = threading.Event()

    def stuck(c: Configuration):
        release.wait(60)
        return predict(c)

    monkeypatch.setattr(configure_search, "time_configuration", stuck)
    search = BranchAndBound(Space.of(DENSE, **SMALL), TOP, time.monotonic() + 1, lambda line: None)
    with cf.ThreadPoolExecutor(1) as pool:
        search.run(pool, 2)
        left = search.counts(0)
        release.set()
    assert search.abandoned and left.timed == 0 and (left.untimed or left.unenumerated)


def test_no_job_starts_that_would_still_run_at_the_deadline_were_it_as_long_as_the_longest(monkeypatch):
    """Each job's seconds are measured where it ran: once one has taken longer than the time left, no other starts,
    and none is left running."""
    ran = []

    def long(work, *args):
        ran.append(work)
        return work(*args), 100.0  # as if it took 100 s

    monkeypatch.setattr(configure_search, "_job", long)
    search = BranchAndBound(Space.of(DENSE, **SMALL), TOP, time.monotonic() + 60, lambda line: None)
    with cf.ThreadPoolExecutor(1) as pool:
        search.run(pool, 1)
    assert len(ran) == 1 and search.job_seconds == 100.0 and not search.abandoned and search.counts(0).unenumerated


def _cli(*args: object, monkeypatch: pytest.MonkeyPatch):
    """``zbsolve configure`` on the small space, its configurations timed in this process."""
    pool = cf.ThreadPoolExecutor(1)
    monkeypatch.setattr(configure_module, "make_executor", lambda spec, jobs: (pool, lambda finished: None))
    return CliRunner().invoke(app, ["configure", str(DENSE), "--gpus", "4", "--global-batch", "16", "--seq-len",
                                    "256", "--device-memory", "16MiB", "--reserve", "0", *map(str, args)])


def test_the_command_prints_the_table_the_counts_and_megatron_s_arguments(tmp_path, monkeypatch):
    done = _cli("--top", 3, "--refine", 1, "--time-limit", NEVER, "-o", tmp_path / "plan.json", "--export",
                tmp_path / "args.txt", "--chart", tmp_path / "chart.svg", monkeypatch=monkeypatch)
    assert done.exit_code == 0, done.output
    assert " timed, " in (tmp_path / "chart.svg").read_text()
    assert "why it" in done.output and " enumerated: " in done.output
    assert "best: zbsolve predict " in done.output  # the search finished
    assert "torchrun --nproc-per-node" in done.output
    assert json.loads((tmp_path / "plan.json").read_text())["launch"]["gpus"] > 0  # what to launch travels along
    assert json.loads((tmp_path / "plan.json").read_text())["plan"]["target"] == "megatron"
    assert {"--pipeline-model-parallel-layout", "pretrain_gpt.py", "--num-layers"} <= set(
        shlex.split((tmp_path / "args.txt").read_text()))
    listed = _cli("--top", 3, "--refine", 0, "--json", monkeypatch=monkeypatch)
    assert listed.exit_code == 0, listed.output
    summary = json.loads(listed.output)
    assert {"candidates", "counts", "chosen"} <= set(summary) and len(summary["candidates"]) == 3
    assert summary["chosen"]["command"] == summary["candidates"][0]["command"]


@pytest.mark.parametrize("args, needle", [
    (["--gpus", "7"], "gpus = 7, global_batch = 8: no valid configuration of tiny-llama.json"),
    (["--gpus", "4", "--target", "nope"], "target = 'nope' is unknown"),
    (["--gpus", "4", "--chart", "chart.pdf"], "--chart = chart.pdf: suffix '.pdf' is not one of .png, .svg"),
])
def test_bad_input_is_one_line_and_exit_2(args, needle):
    done = CliRunner().invoke(app, ["configure", str(DENSE), "--global-batch", "8", "--seq-len", "256", *args])
    assert done.exit_code == 2 and needle in " ".join(done.output.split()), done.output


@pytest.mark.parametrize("memory_mib", [16, 20, 28])
def test_the_order_memory_test_never_prunes_what_predict_fits(memory_mib):
    """``order_fits`` (the activations the configuration's own order holds, 1F1B's first rank p microbatches' F)
    never prunes a configuration ``predict`` says fits: over every small configuration of the space it assesses."""
    space = Space.of(DENSE, **{**SMALL, "device_memory": memory_mib * MIB})
    pruned = kept = 0
    for group in configurations.groups(space):
        if not isinstance(group, configurations.Group):
            continue
        for one in configurations.assess(space, group):
            if isinstance(one, configurations.Dropped):
                continue
            fits = predict(one.configuration).fits
            assert one.fits or not fits, one.configuration
            pruned += not one.fits
            kept += one.fits
    assert kept and pruned  # both sides met


def test_a_search_cut_short_says_best_found_and_its_gap():
    """A search stopped by its time limit is incomplete: the result, its table, JSON and repr say "best found" with
    the counts and the gap to the best bound among the untimed; a finished one says "best"."""
    from zbsolve.configure.result import ConfigureResult, Counts

    counts = Counts(enumerated=10, invalid=1, pruned_memory=2, pruned_bound=1, timed=3, unfit=0, untimed=3,
                    refined=0, untimed_bound_s=0.8)
    assert not counts.complete and "3 timed, 3 untimed, 3 pruned" in counts.completeness()
    assert ConfigureResult.gap_of(counts, 1.0, False) == (False, pytest.approx(0.2))
    assert ConfigureResult.gap_of(counts, 0.5, False) == (False, 0.0)
    done = Counts(enumerated=10, invalid=1, pruned_memory=2, pruned_bound=4, timed=3, unfit=0, untimed=0, refined=0)
    assert done.complete and ConfigureResult.gap_of(done, 1.0, False) == (True, 0.0)
    assert ConfigureResult.gap_of(done, 1.0, True)[0] is False


def test_configure_states_its_completeness(configured):
    """The result's fields, repr, JSON, table and chart title say whether the search finished."""
    from zbsolve.present.configure_table import lines, title

    word = "best" if configured.complete else "best found"
    assert f"{word}: " in repr(configured) and configured.summary()["complete"] == configured.complete
    assert ("complete" if configured.complete else "best found") in title(configured)
    assert "timed" in lines(configured)[0] and "pruned" in lines(configured)[0]
    fig = configured.plot()
    assert ("complete" if configured.complete else "best found") in fig.axes[0].get_title()


def test_rows_show_the_split_and_predicts_memory(configured):
    """Each row names its split, and its memory is the figure ``predict`` prints (every part, the reserve too)."""
    for r in configured.candidates:
        assert r.row()["split"] == r.configuration.partition
        assert r.memory_gib == pytest.approx(max(m.total for m in predict(r.configuration).memory) / 2**30)


def test_megatron_rules_refuse_or_warn_in_the_space():
    """Megatron-LM's argument rules: Megatron-FSDP beside tensor parallelism is kept with the warning and its
    source; a sequence not a multiple of 2 x cp is refused."""
    from zbsolve.configure.runtime_rules import runtime_refusal, runtime_warnings

    space = Space.of(DENSE, **SMALL)
    warned = runtime_warnings("megatron", space.configuration(tp=2, zero=3))
    assert any("FSDP beside" in w and "validate_args" in w for w in warned)
    assert runtime_warnings("megatron", space.configuration(tp=1, zero=1)) == ()
    assert runtime_warnings("torchtitan", space.configuration(tp=2, zero=3)) == ()
    odd = Space.of(DENSE, **{**SMALL, "seq_len": 250})
    assert "Megatron-LM refuses" in (runtime_refusal("megatron", odd.configuration(cp=4)) or "")


def test_recipe_shaped_configurations_are_timed_first():
    """The search's first heap holds the recipe-shaped ones: no context parallelism, one sequence a microbatch,
    sharded optimizer states, no or selective recomputation."""
    space = Space.of(DENSE, **SMALL)
    assert configurations.recipe_shaped(space.configuration(tp=2, pp=2, zero=1, recompute="selective"))
    assert not configurations.recipe_shaped(space.configuration(tp=2, cp=2, zero=1))
    assert not configurations.recipe_shaped(space.configuration(tp=2, microbatch_size=2, zero=1))


def test_a_search_with_nothing_timed_that_fits_says_whether_it_finished():
    """Stopped before anything was timed, the refusal says so, what it left and that a longer time limit times it;
    finished with nothing that fits, it says that none fits."""
    from zbsolve.base.errors import InfeasibleError

    stopped = BranchAndBound(Space.of(DENSE, **SMALL), TOP, time.monotonic(), lambda line: None)  # its time is up
    with cf.ThreadPoolExecutor(1) as pool:
        stopped.run(pool, 1)
    with pytest.raises(InfeasibleError, match=r"^nothing was timed before the time limit \(\d+ not enumerated; "
                                              r".*a longer time limit \(--time-limit\) times them$"):
        stopped.ranked()
    finished = BranchAndBound(Space.of(DENSE, **{**SMALL, "device_memory": 8 * MIB}), TOP,
                              time.monotonic() + NEVER, lambda line: None)
    with cf.ThreadPoolExecutor(1) as pool:
        finished.run(pool, 1)
    with pytest.raises(InfeasibleError, match=r"^no configuration fits device_memory 8\.00 MiB a device \(as given\): "
                                              r"the \d+ pruned for memory need at least .*try more GPUs"):
        finished.ranked()


def test_a_pool_starts_its_workers_while_the_progress_display_is_paused(monkeypatch):
    """The command line's progress display redraws in a thread of its own, with which workers would spawn (each
    importing torch again, ``start_method``): a pool forks all its workers at once while it is stopped, and it
    redraws again after."""
    import multiprocessing
    import operator
    from contextlib import contextmanager

    from rich.progress import Progress

    from zbsolve.app.cli.common import _Redraw
    from zbsolve.base import parallel

    redraw, seen, before = _Redraw(Progress(disable=True)), [], len(multiprocessing.active_children())

    @contextmanager
    def pause():
        with redraw.paused():
            seen.append(any(t.name == "progress" for t in threading.enumerate()))
            yield
            seen.append(len(multiprocessing.active_children()) - before)

    monkeypatch.setattr(parallel, "start_method", lambda: "fork")
    redraw.start()
    with parallel.paused_for_pools(pause):
        pool = parallel.ProcessPool(2)
    try:
        assert seen == [False, 2] and redraw.thread.is_alive()
        assert pool.submit(operator.add, 1, 2).result() == 3
    finally:
        parallel.shutdown_pool(pool, True)
        redraw.stop()
    assert not parallel._PAUSES


def _least_group_need(space: Space) -> float:
    """The least ``group_need`` of every group ``group_fits`` prunes, every model estimated (no size skipped)."""
    needs = []
    for shape in (shape for shape in shapes(space) if shape_refusal(space, shape) is None):
        for size, zero in itertools.product(space.menus()["microbatch_size"], space.menus()["zero"]):
            c = space.configuration(microbatch_size=size, zero=zero, **shape)
            try:
                whole = ModelAsOneStage(configured_model(c, degrees(c)[0]))
            except InputError:
                continue
            needs += [group_need(whole, c.replace(recompute=choice)) for choice in decided_choices(space.target,
                                                                                                      whole.model)
                      if group_fits(whole, c.replace(recompute=choice)) is not None]
    return min(needs)


def test_a_search_that_prunes_everything_for_memory_names_the_memory_and_the_least_need(monkeypatch):
    """The refusal names the device memory used, as given, not the GPU preset, and the least a configuration needs
    by the bound that pruned it, with the shortfall."""
    pool = cf.ThreadPoolExecutor(1)
    monkeypatch.setattr(configure_module, "make_executor", lambda spec, jobs: (pool, lambda finished: None))
    done = zbsolve("configure", DENSE, "--gpus", 4, "--global-batch", 16, "--seq-len", 256, "--device-memory",
                   "8MiB", "--reserve", 0)
    line = failed_cleanly(done, 1)
    assert "fits device_memory 8.00 MiB a device (as given): the 810 pruned for memory need at least " in line
    assert "h100" not in line and "0 timed" in line
    need = float(re.search(r"need at least ([\d.]+) MiB a device by the bound that pruned them", line)[1])
    assert f"{need - 8:.2f} MiB short" in line
    least = _least_group_need(Space.of(DENSE, gpus=4, global_batch=16, seq_len=256, device_memory=8 * MIB,
                                       reserve=0))
    assert need == pytest.approx(least / MIB, abs=0.005)


def test_where_what_is_timed_does_not_fit_the_refusal_gives_the_closest_s_need_and_shortfall(monkeypatch):
    """With the order's memory test let through, ``predict`` times configurations that do not fit: the refusal
    names the one needing the least on its busiest device (``Prediction.busiest``), and what it lacks."""
    monkeypatch.setattr(configurations, "order_fits", lambda *args: True)
    space = Space.of(DENSE, **{**SMALL, "device_memory": int(11.5 * MIB)})
    with cf.ThreadPoolExecutor(1) as pool, pytest.raises(InfeasibleError) as refused:
        configure(DENSE, **{**SMALL, "device_memory": int(11.5 * MIB)}, top=TOP, refine=0, time_limit=60,
                  executor=pool)
    line = str(refused.value)
    found = re.search(r"the closest timed, (.+?), needs ([\d.]+) MiB on its busiest device, ([\d.]+) MiB short", line)
    assert found and "device_memory 11.50 MiB a device (as given)" in line, line
    assert float(found[2]) - float(found[3]) == pytest.approx(11.5, abs=0.011)
    timed = [predict(one.configuration) for group in groups(space) if isinstance(group, Group)
             for one in assess(space, group) if isinstance(one, Assessed)]
    assert timed and not any(p.fits for p in timed)
    assert float(found[2]) == pytest.approx(min(p.busiest()[1] for p in timed) * 1024, abs=0.005)
