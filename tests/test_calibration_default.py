"""``predict``'s and ``configure``'s default calibration (``auto``): the shipped fit of the setup's GPU preset and
runtime where zbsolve ships one, else none; ``none`` the cost model as stated; the line predict prints says which
applied and why, and a configuration's command line replays the same figures."""

from __future__ import annotations

import dataclasses
import inspect
import shlex
from pathlib import Path

import pytest
from conftest import ROOT, failed_cleanly, predict_read, zbsolve

from zbsolve.base.errors import InputError
from zbsolve.configure.choose import configure
from zbsolve.configure.predict import Configuration, predict
from zbsolve.costmodel.calibration import Calibration, default_fit, load_calibration, shipped
from zbsolve.costmodel.gpus import get_gpu
from zbsolve.costmodel.setup import Setup

CONFIG = ROOT / "tests" / "data" / "tiny-llama.json"
KNOBS = dict(config=CONFIG, seq_len=256, microbatch_size=1, global_batch=16, gpus=8, tp=2, pp=2)


@pytest.mark.parametrize("runtime", ["megatron", "torchtitan"])
def test_the_default_is_the_shipped_fit_of_the_gpu_and_runtime(runtime):
    c = Configuration(**KNOBS, runtime=runtime)
    assert c.calibration == "auto" and f"h100-{runtime}" in shipped()
    assert c.calibrated == load_calibration(f"h100-{runtime}") != Calibration()
    p = predict(c)
    assert p.step_time_s == predict(c.replace(calibration=f"h100-{runtime}")).step_time_s
    assert p.calibration.startswith(f"calibration: h100-{runtime} (shipped default for h100 and {runtime}: ")
    assert p.calibration.endswith("; --calibration none for the model as stated)")


@pytest.mark.parametrize("gpu", ["b200", dataclasses.replace(get_gpu("h100"), name="my H100")])
def test_the_default_is_none_where_no_fit_is_shipped(gpu):
    c = Configuration(**KNOBS, gpu=gpu)
    assert c.calibrated == Calibration()
    p = predict(c)
    assert p.step_time_s == predict(c.replace(calibration=None)).step_time_s
    where = "b200" if gpu == "b200" else "a GPU of one's own"
    assert p.calibration == f"calibration: none (no shipped fit for {where} and megatron: the cost model as stated)"


def test_none_is_the_cost_model_as_stated():
    c = Configuration(**KNOBS)
    stated = predict(c.replace(calibration=None))
    assert Configuration(**KNOBS, calibration="none").calibration is None
    assert stated.step_time_s == predict(c.replace(calibration=Calibration())).step_time_s
    assert stated.step_time_s < predict(c).step_time_s  # the shipped fit's kernels run slower than the table's
    assert stated.calibration.startswith("calibration: none (the cost model as stated")


def test_estimate_stays_on_the_stated_model_unless_told():
    setup = Setup(seq_len=256, microbatch_size=1)
    assert setup.calibration is None and setup.calibrated == Calibration()
    assert setup.replace(calibration="auto").calibrated == load_calibration("h100-megatron")


@pytest.mark.parametrize("calibration, words", [
    ("auto", []), (None, ["--calibration", "none"]), ("h100-torchtitan", ["--calibration", "h100-torchtitan"])])
def test_the_command_line_replays_the_calibration(calibration, words, monkeypatch):
    c = Configuration(**KNOBS, calibration=calibration)
    line = shlex.split(c.command())
    at = line.index("--calibration") if "--calibration" in line else len(line)
    assert line[at:at + 2] == words
    taken = predict_read(c.command(), monkeypatch)
    assert taken == [c.replace(config=Path(line[2]))]
    assert predict(taken[0]).step_time_s == predict(c).step_time_s


def test_a_setup_s_predict_line_says_none_where_it_has_no_calibration(monkeypatch):
    setup = Setup(config=CONFIG, seq_len=256, microbatch_size=1, global_batch=16, gpus=8, tp=2, pp=2)
    assert shlex.split(setup.command())[-2:] == ["--calibration", "none"]
    taken = predict_read(setup.command(), monkeypatch)
    assert len(taken) == 1 and taken[0].calibration is None and taken[0].calibrated == setup.calibrated


@pytest.mark.parametrize("value, line", [
    ("bogus", "calibration = 'bogus': no such file, nor a shipped calibration ({}), auto (the shipped default) or "
              "none"),
    (5, "calibration = 5: should be a calibration file, a shipped one's name, auto, none or a Calibration")])
def test_a_bad_calibration_is_one_line_naming_it(value, line):
    with pytest.raises(InputError) as error:
        Configuration(**KNOBS, calibration=value)
    assert str(error.value) == line.format(", ".join(shipped()))


def test_the_command_refuses_a_bad_calibration_in_one_line():
    result = zbsolve("predict", CONFIG, "--seq-len", "256", "-b", "1", "--global-batch", "16", "--gpus", "8",
                     "--calibration", "bogus")
    assert failed_cleanly(result, 2) == (f"error: --calibration = 'bogus': no such file, nor a shipped calibration "
                                         f"({', '.join(shipped())}), auto (the shipped default) or none")


def test_configure_and_its_command_default_to_the_shipped_fit():
    assert inspect.signature(configure).parameters["calibration"].default == "auto"
    for command in ("predict", "configure"):
        shown = " ".join(zbsolve(command, "--help").stdout.split())
        assert "auto (the shipped fit of the GPU and runtime" in shown and "[default: auto]" in shown
    assert default_fit("H100", "megatron") == "h100-megatron" and default_fit("h100", "none") is None
