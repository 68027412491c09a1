"""``zbsolve calibrate`` and ``--calibration``: a fit recovers the multipliers that made synthetic measurements, stays
within its bounds, refuses bad input in one line, and its file changes predict's figure as its multipliers say."""

from __future__ import annotations

import dataclasses
import math

import pytest
import yaml
from conftest import ROOT
from typer.testing import CliRunner

from zbsolve.app.cli import app
from zbsolve.base.errors import InputError
from zbsolve.configure.calibrate import fit, leave_one_out, predicted
from zbsolve.configure.measured_runs import MeasuredRun, read_run
from zbsolve.configure.predict import Configuration, predict
from zbsolve.costmodel.calibration import TERMS, Calibration, load_calibration

CONFIG = ROOT / "problems" / "models" / "configs" / "llama3-8b.json"
SHAPES = [dict(seq_len=256, microbatch_size=8), dict(seq_len=8192, microbatch_size=1),
          dict(seq_len=1024, microbatch_size=2, pp=2), dict(seq_len=2048, microbatch_size=4)]


def synthetic(truth: Calibration) -> list[MeasuredRun]:
    """Runs whose "measured" step is predict's under ``truth``."""
    runs = []
    for i, shape in enumerate(SHAPES):
        c = Configuration(config=CONFIG, global_batch=16, gpus=shape.get("pp", 1), **shape)
        step, _ = predicted(MeasuredRun(f"r{i}", c, 1.0, None, "h100-megatron"), truth)
        runs.append(MeasuredRun(f"r{i}", c, step, None, "h100-megatron"))
    return runs


def test_the_fit_recovers_known_multipliers():
    truth = Calibration({"gemm": 1.2, "memory_bound": 1.5})
    result = fit(synthetic(truth), ["gemm", "memory_bound"])
    assert result.multipliers["gemm"] == pytest.approx(1.2, rel=0.05)
    assert 1.1 < result.multipliers["memory_bound"] < 1.6  # few memory-bound seconds: the prior pulls it toward 1
    assert all(abs(r.residual) < 0.02 for r in result.runs) and not result.stopped_early
    assert all(set(r.sensitivity) == {"gemm", "memory_bound"} for r in result.runs)


def test_leave_one_out_is_a_full_fit_without_the_run():
    """Synthetic runs (a step of a * gemm + b): each left-out calibration is the fit of the others alone."""
    slopes = {"r0": (1.0, 0.0), "r1": (1.0, 0.2), "r2": (1.0, 0.5), "r3": (0.5, 0.5)}

    def linear(run: MeasuredRun, calibration: Calibration) -> tuple[float, float]:
        a, b = slopes[run.name]
        return a * calibration.scale("gemm") + b, 1.0

    c = Configuration(config=CONFIG, seq_len=256, microbatch_size=1, global_batch=8, gpus=1)
    truth = {"r0": 1.2, "r1": 1.3, "r2": 1.55, "r3": 1.0}
    runs = [MeasuredRun(n, c, truth[n], None, "h100-megatron") for n in slopes]
    full = fit(runs, ["gemm"], predictor=linear)
    left = leave_one_out(runs, full, predictor=linear)
    assert set(left) == set(slopes)
    for name in slopes:
        alone = fit([r for r in runs if r.name != name], ["gemm"], predictor=linear)
        assert left[name].scale("gemm") == pytest.approx(alone.multipliers["gemm"], abs=2e-3)
    assert left["r0"].scale("gemm") < full.multipliers["gemm"] < left["r3"].scale("gemm")


def test_a_run_alone_in_its_fit_is_left_out_to_the_model_as_stated():
    """A fit of one run has no other run to predict it by: its leave-one-out calibration is none, never the fit that
    saw it."""
    c = Configuration(config=CONFIG, seq_len=256, microbatch_size=1, global_batch=8, gpus=1)

    def linear(run: MeasuredRun, calibration: Calibration) -> tuple[float, float]:
        return calibration.scale("gemm"), 1.0

    runs = [MeasuredRun("alone", c, 1.2, None, "h100-megatron")]
    full = fit(runs, ["gemm"], predictor=linear)
    assert full.multipliers["gemm"] > 1.1
    assert leave_one_out(runs, full, predictor=linear) == {"alone": Calibration()}


def test_the_fit_stays_within_its_bounds():
    runs = [dataclasses.replace(r, step_time_s=r.step_time_s * 100) for r in synthetic(Calibration())]
    result = fit(runs, ["gemm"])
    assert result.multipliers["gemm"] == pytest.approx(TERMS["gemm"].high, rel=1e-3)
    assert result.calibration.at_bound == ("gemm",)


@pytest.mark.parametrize("terms, line", [(["flops"], "terms = 'flops': should be among"),
                                         (["gemm", "gemm"], "give one or more terms, each once")])
def test_bad_terms_are_one_line(terms, line):
    with pytest.raises(InputError, match=line):
        fit(synthetic(Calibration()), terms)


def test_held_back_runs_are_never_fitted():
    runs = [dataclasses.replace(r, held_back=True) for r in synthetic(Calibration())]
    with pytest.raises(InputError, match="none to fit"):
        fit(runs)


@pytest.mark.parametrize("text, line", [
    ("multipliers: {gemm: 9}", "calibration.gemm = 9: should be a number in [0.9, 1.3]"),
    ("multipliers: {flops: 1}", "'flops' should be one of"),
    ("[1, 2]", "should be a mapping with 'multipliers'"),
    ("{{", "not a readable YAML file")])
def test_a_bad_calibration_file_is_one_line_naming_the_field(tmp_path, text, line):
    path = tmp_path / "cal.yaml"
    path.write_text(text)
    with pytest.raises(InputError, match="^calibration = ") as error:
        Configuration(config=CONFIG, seq_len=256, microbatch_size=1, global_batch=8, gpus=1, calibration=path)
    assert line in str(error.value)
    with pytest.raises(InputError, match="no such file, nor a shipped calibration"):
        load_calibration("no-such-calibration")


def test_calibrate_then_predict_with_its_file(tmp_path):
    runs = synthetic(Calibration({"gemm": 1.25}))
    files = []
    for run in runs[:2]:
        c = run.configuration
        data = yaml.safe_load((ROOT / "problems" / "calibration" / "llama3-8b-h100-8-fp8-fsdp.yaml").read_text())
        data.update(name=run.name, held_back=False, scored=True)
        data["model"]["config"] = str(CONFIG)
        data["hardware"].update(gpu="h100-sxm-80gb", gpus=c.gpus)
        data["precision"]["dtype"] = "bf16"
        data["parallelism"].update(tp=1, pp=1, vp=None, cp=1, ep=1, dp=1)
        data["batch"].update(seq_len=c.seq_len, microbatch_size=c.microbatch_size, global_batch_size=16)
        data["recompute"] = {"granularity": "none"}
        data["optimizer"] = {"zero": 1}
        data["measured"] = {"tokens_per_s_per_gpu": 16 * c.seq_len / run.step_time_s / c.gpus, "step_time_s": None,
                            "derived": []}
        path = tmp_path / f"{run.name}.yaml"
        path.write_text(yaml.safe_dump(data))
        files.append(str(path))
        assert read_run(path).configuration.replace(config=CONFIG) == c.replace(zero=1)
    out = tmp_path / "cal.yaml"
    result = CliRunner().invoke(app, ["calibrate", *files, "-o", str(out), "--terms", "gemm", "-q"])
    assert result.exit_code == 0, result.output
    written = yaml.safe_load(out.read_text())
    assert written["multipliers"]["gemm"] == pytest.approx(1.25, rel=0.02)
    assert {"runs", "residuals", "date", "zbsolve_version", "command"} <= set(written)
    c = runs[0].configuration
    plain = predict(c.replace(calibration=None)).step_time_s  # the cost model as stated
    scaled = predict(c.replace(calibration=out)).step_time_s
    assert scaled == pytest.approx(runs[0].step_time_s, rel=0.05) and scaled > plain
    shown = CliRunner().invoke(app, ["predict", str(CONFIG), "--seq-len", "256", "-b", "8", "--global-batch", "16",
                                     "--gpus", "1", "--calibration", str(out)])
    # exit 1: an 8B model's Adam states do not fit one H100, which predict reports as it prints the figures
    assert shown.exit_code in (0, 1) and f"calibration: {out}" in " ".join(shown.output.split())
    bad = CliRunner().invoke(app, ["predict", str(CONFIG), "--seq-len", "256", "-b", "8", "--global-batch", "16",
                                   "--gpus", "1", "--calibration", "nowhere"])
    assert bad.exit_code == 2 and "--calibration = 'nowhere'" in bad.output
    assert math.isfinite(scaled)
