"""The step's tail (``costmodel.step_tail``) and ``zbsolve predict``: one configuration in, figures that agree with
each other and with the simulator, refusals in one line naming the numbers."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from zbsolve.app.cli import app
from zbsolve.base.errors import InputError
from zbsolve.configure.predict import Configuration, configured_model, degrees, predict
from zbsolve.core.placement import make_placement
from zbsolve.costmodel import nccl
from zbsolve.costmodel.model import Interference, Link, StepEnd
from zbsolve.costmodel.step_tail import OPTIMIZER_STEP_BYTES, Window, device_params, device_tail, device_tails, exposed
from zbsolve.problem.costs import model_costs

CONFIG = "problems/models/configs/llama3-8b.json"
SMALL = Configuration(config=CONFIG, gpu="h100", dtype="bf16", seq_len=512, microbatch_size=1, global_batch=16, gpus=16,
                      tp=2, pp=4, vp=2)
"""dp = 16 / (2 x 4) = 2, m = 16 / (1 x 2) = 8."""
ARGS = [CONFIG, "--gpu", "h100", "--seq-len", "512", "--microbatch-size", "1", "--global-batch", "16", "--gpus", "16",
        "--tp", "2", "--pp", "4", "--vp", "2"]
LINK = Link(name="network", bytes_per_s=50e9, latency_s=1e-5)
P = 10**9
"""25 buckets of 40e6 parameters, each its own collective (NCCL's ring over the 4 replicas of one node)."""


def rs(params: float) -> float:
    """A reduce-scatter or all-gather of ``params`` 2-byte parameters over LINK's 4 ranks."""
    return nccl.ring(params * 2, 4, 50e9)


def ar(params: float) -> float:
    """An all-reduce so."""
    return nccl.ring(params * 2, 4, 50e9, factor=2)


def step_end(**kw) -> StepEnd:
    return StepEnd(**{"dp": 4, "zero": 0, "link": LINK, "hbm_bytes_per_s": 3e12, **kw})


def test_one_replica_leaves_the_optimizer_step_alone():
    tail = device_tail(P, step_end(dp=1, zero=1))
    assert tail.sync == 0 and tail.optimizer == pytest.approx(P * OPTIMIZER_STEP_BYTES / 3e12)


def test_ddp_all_reduces_every_gradient_after_the_last_pass_without_overlap():
    tail = device_tail(P, step_end())
    assert tail.sync == pytest.approx(25 * ar(40e6))
    long = device_tail(P, step_end(overlap_grad_reduce=True), Window(1.0, 1.0))  # the backward outlasts it
    assert long.sync == pytest.approx(ar(40e6))
    assert long.optimizer == tail.optimizer


def test_the_overlapped_reduction_shows_what_outlasts_the_backward_left():
    """The reduction hides behind the backward still to run: the shorter it is, the more shows, down to all of
    it with none, and at least the last bucket however long."""
    whole = 25 * ar(40e6)
    syncs = [device_tail(P, step_end(overlap_grad_reduce=True), Window(0.0, b)).sync for b in (0.0, 0.02, 0.05)]
    assert syncs[0] == pytest.approx(whole) and syncs == sorted(syncs, reverse=True)
    assert syncs[1] == pytest.approx(whole - 0.02)
    assert exposed(1.0, 0.1, 0.5) == 0.5 and exposed(1.0, 0.1, 2.0) == 0.1


def test_the_overlapped_gather_hides_behind_the_forward_alone():
    step = step_end(zero=1, overlap_grad_reduce=True, overlap_param_gather=True)
    gather = 25 * rs(40e6)
    backward_only = device_tail(P, step, Window(0.0, 1.0))
    assert backward_only.sync == pytest.approx(rs(40e6) + gather)
    both = device_tail(P, step, Window(1.0, 1.0))
    assert both.sync == pytest.approx(2 * (rs(40e6)))


def test_the_distributed_optimizer_shards_the_step_and_gathers_the_parameters():
    plain, sharded = device_tail(P, step_end()), device_tail(P, step_end(zero=1))
    assert sharded.optimizer == pytest.approx(plain.optimizer / 4)
    assert sharded.sync == pytest.approx(2 * (25 * rs(40e6)))  # reduce-scatter, then all-gather
    both = device_tail(P, step_end(zero=1, overlap_grad_reduce=True, overlap_param_gather=True), Window(1.0, 1.0))
    assert both.sync == pytest.approx(2 * (rs(40e6)))
    assert device_tail(P, step_end(zero=3)).sync == pytest.approx(both.sync)  # FSDP's passes hide the rest


def test_every_stage_carries_its_share_of_its_device_s_tail():
    dp, _ = degrees(SMALL)
    model = configured_model(SMALL, dp)
    placement = make_placement("interleaved", 4, 2)
    profile, costs = model_costs(model, placement)
    assert model.step is not None and all(layer.params for layer in model.layers)
    tails = [tail.seconds for tail in device_tails(model, costs.ranges, placement)]
    assert profile.device_tails(placement) == pytest.approx(tails)
    assert min(tails) > 0


def test_predicted_figures_agree_with_each_other():
    p = predict(SMALL)
    assert (p.dp, p.num_microbatches, p.schedule) == (2, 8, "Interleaved1F1B") and len(p.counts) == 8
    assert p.tokens_per_s_per_gpu * p.step_time_s * SMALL.gpus == pytest.approx(16 * 512)
    assert p.mfu == pytest.approx(p.model_tflops_per_gpu * 1e12 / p.peak_flops)
    assert sum(p.breakdown.values()) == pytest.approx(p.step_time_s)
    assert p.breakdown["dp_sync"] > 0 and p.breakdown["optimizer"] > 0 and p.breakdown["bubble"] > 0
    assert len(p.peak_memory_gib) == 4 and p.fits
    assert not predict(SMALL.replace(device_memory=int(min(p.peak_memory_gib) * 2**30))).fits


@pytest.mark.parametrize("change, line", [
    (dict(gpus=12), "gpus = 12 is not a multiple of tp x pp x cp = 2 x 4 x 1 = 8"),
    (dict(global_batch=15), "global_batch = 15 is not a multiple of microbatch_size x dp = 1 x 2 = 2"),
    (dict(cp=4), "gpus = 16 is not a multiple of tp x pp x cp = 2 x 4 x 4 = 32"),
])
def test_a_configuration_that_does_not_divide_is_refused_naming_the_numbers(change, line):
    with pytest.raises(InputError, match="^" + line.replace("(", r"\(").replace(")", r"\)") + "$"):
        degrees(SMALL.replace(**change))


def test_the_command_prints_exactly_its_json_keys():
    run = CliRunner().invoke(app, ["predict", *ARGS, "--json"])
    assert run.exit_code == 0, run.output
    figures = json.loads(run.output)
    assert set(figures) == {"step_time_s", "tokens_per_s_per_gpu", "model_tflops_per_gpu", "mfu", "peak_memory_gib",
                            "fits", "breakdown", "calibration", "memory_gib", "shortfall_gib", "warnings"}
    assert set(figures["breakdown"]) == {"compute", "bubble", "exposed_comm", "dp_sync", "optimizer"}
    assert figures["step_time_s"] == pytest.approx(predict(SMALL).step_time_s)


@pytest.mark.parametrize("change", [dict(zero=3), dict(cp=2), dict(cp=2, zero=3)])
def test_fsdp_and_context_parallelism_are_predicted(change):
    """FSDP and context parallelism run end to end: the figures still agree, the data-parallel degree leaves room
    for cp, and the tail shards the optimizer over the dp x cp replicas."""
    c = SMALL.replace(**change)
    dp, m = degrees(c)
    p, model = predict(c), configured_model(c, dp)
    assert (p.dp, p.num_microbatches) == (dp, m) == (16 // (2 * 4 * c.cp), 16 // dp)
    assert model.step is not None and model.step.dp == dp * c.cp and model.step.zero == c.zero
    assert sum(p.breakdown.values()) == pytest.approx(p.step_time_s) and p.breakdown["optimizer"] > 0


def test_the_command_takes_zero_3_and_cp():
    run = CliRunner().invoke(app, ["predict", *ARGS, "--zero", "3", "--cp", "2", "--json"])
    assert run.exit_code == 0, run.output
    assert json.loads(run.output)["step_time_s"] == pytest.approx(predict(SMALL.replace(zero=3, cp=2)).step_time_s)


@pytest.mark.parametrize("extra, line", [
    (["--global-batch", "15"], "error: global_batch = 15 is not a multiple of microbatch_size x dp = 1 x 2 = 2"),
    (["--zero", "2"], "error: --zero = 2: should be 0, 1 or 3"),
    (["--layout", "Et|tL", "--partition", "uniform"], "error: --layout and --partition: give one"),
])
def test_the_command_refuses_bad_input_in_one_line(extra, line):
    run = CliRunner().invoke(app, ["predict", *ARGS, *extra])
    assert run.exit_code == 2 and run.output.strip() == line


@pytest.mark.parametrize("given", ["DualPipe", "dualpipe", "DUALPIPE"])
def test_dualpipe_is_predicted_with_two_stages_on_every_rank(given):
    """DualPipe (any case) runs the bidirectional placement: rank r holds stages r and pp - 1 - r, so every
    stage's parameters are held twice and each rank holds about twice a 1F1B rank's."""
    c = SMALL.replace(vp=1, schedule=given)
    p, one = predict(c), predict(c.replace(schedule="1f1b"))
    assert (p.schedule, one.schedule, len(p.counts)) == ("DualPipe", "1F1B", 4)
    assert sum(p.breakdown.values()) == pytest.approx(p.step_time_s)
    model = configured_model(c, p.dp)
    ranges = [(sum(p.counts[:s]), sum(p.counts[:s + 1])) for s in range(4)]
    dual = device_params(model, ranges, make_placement("bidirectional", 4))
    single = device_params(model, ranges, make_placement("sequential", 4))
    assert [dual[r] for r in range(4)] == [single[r] + single[3 - r] for r in range(4)]
    assert p.breakdown["bubble"] < one.breakdown["bubble"]


def test_dualpipe_takes_one_virtual_stage_and_an_unknown_order_is_named():
    with pytest.raises(InputError, match="^vp = 2: DualPipe runs pp stages"):
        predict(SMALL.replace(schedule="DualPipe"))
    with pytest.raises(InputError, match="^schedule = 'Dual': should be one of .*DualPipeV.*DualPipe"):
        predict(SMALL.replace(schedule="Dual"))
    run = CliRunner().invoke(app, ["predict", *ARGS[:-2], "--schedule", "dualpipev", "--vp", "2", "--json"])
    assert run.exit_code == 0, run.output


def test_the_overlapped_synchronisation_slows_the_backward_beside_it():
    """Beside the backward, the reduction runs slower and the backward loses time while they overlap: the tail
    counts the loss apart, and a bound's tail leaves it out."""
    felt = Interference(compute=0.2, collective=0.3)
    whole = 25 * ar(40e6)
    tail = device_tail(P, step_end(overlap_grad_reduce=True, interference=felt), Window(0.0, 0.02))
    assert tail.sync == pytest.approx(whole * 1.3 - 0.02) and tail.slowed == pytest.approx(0.2 * 0.02)
    assert tail.unslowed == pytest.approx(tail.sync + tail.optimizer)
    assert tail.seconds > device_tail(P, step_end(overlap_grad_reduce=True), Window(0.0, 0.02)).seconds


@pytest.mark.parametrize("columns", [80, 120])
def test_the_tables_read_at_80_and_120_columns(columns):
    """Each table under a plain line naming it: no line wider than the terminal, every header word whole on one
    line."""
    from zbsolve.app.cli.predict import MEMORY_COLUMNS

    run = CliRunner().invoke(app, ["predict", *ARGS], env={"COLUMNS": str(columns)})
    assert run.exit_code == 0, run.output
    lines = run.stdout.splitlines()
    assert lines and all(len(line) <= columns for line in lines), run.stdout
    assert lines[0].startswith("llama3-8b: 16 x h100") and not any(c in run.stdout for c in "┏┃│")
    for header in (["figure", "value"], list(MEMORY_COLUMNS), ["part", "seconds", "share"]):
        assert header in [line.split() for line in lines], header


@pytest.mark.parametrize("memory, said", [
    (None, r"yes: {need} of 79\.65 GiB \(device {device}\)$"),
    ("3GiB", r"no: {need} of 3\.00 GiB \(device {device}\), {short} GiB short$"),
])
def test_the_fits_line_gives_the_busiest_device_s_need_and_configure_prints_the_same(memory, said):
    """The fits line names the busiest device, what it needs (every part, the reserve included) of the device
    memory and its shortfall; configure's table prints that same need for the configuration."""
    from zbsolve.configure.result import Ranked
    from zbsolve.present.configure_table import shown

    c = SMALL if memory is None else SMALL.replace(device_memory=memory)
    p = predict(c)
    device, need = p.busiest()
    assert need == pytest.approx(max(m.total for m in p.memory) / 2**30)
    assert need > max(p.peak_memory_gib)  # the reserve's outside bytes included: not the allocator's peak
    extra = [] if memory is None else ["--device-memory", memory]
    run = CliRunner().invoke(app, ["predict", *ARGS, *extra])
    assert run.exit_code == (0 if memory is None else 1), run.output
    line = next(line for line in run.stdout.splitlines() if line.split()[:1] == ["fits"])
    pattern = said.format(need=f"{need:.1f}", device=device, short=f"{need - 3:.1f}")
    assert re.search(pattern, line), line
    assert shown("peak GiB", Ranked(c, p, c.command()).row()["peak GiB"]) == f"{need:.1f}"
