"""The training setup (``costmodel.setup``): each knob once, a bad value one line naming it, the estimate the same
from a setup as from its knobs, and a configuration's command line read back into the same configuration."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from conftest import predict_read

from zbsolve.base.errors import InputError
from zbsolve.configure.predict import Configuration
from zbsolve.costmodel.estimate import estimate
from zbsolve.costmodel.setup import PREDICT_OPTIONS, Setup

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "tests" / "data" / "tiny-llama.json"


@pytest.mark.parametrize("knobs, line", [
    ({"tp": 0}, "tp = 0 must be an integer >= 1 (smallest valid: 1)"),
    ({"zero": 2}, "zero = 2: should be 0, 1 or 3"),
    ({"gpu": "tpu"}, "gpu = 'tpu': should be one of h100, h200, a100, b200"),
    ({"dispatcher": "ring"}, "dispatcher = 'ring': should be one of alltoall, flex"),
    ({"dtype": "fp8", "gpu": "a100"}, "dtype = 'fp8': the NVIDIA A100 SXM4 80GB has no FP8 tensor cores"),
    ({"overlap_grad_reduce": "yes"}, "setup: overlap_grad_reduce = 'yes': should be a valid boolean"),
])
def test_a_bad_knob_is_one_line_naming_it(knobs, line):
    with pytest.raises(InputError) as error:
        Setup(seq_len=16, microbatch_size=1, **knobs)
    assert str(error.value) == line


def test_the_estimate_of_a_setup_is_that_of_its_knobs():
    knobs = dict(gpu="h200", seq_len=16, microbatch_size=2, tp=2, dp=2, zero=1, tp_comm_overlap=True)
    assert estimate(CONFIG, Setup(**knobs)) == estimate(CONFIG, **knobs)


@pytest.mark.parametrize("change", [{}, {"zero": 3, "cp": 2, "reserve": 0}, {"overlap_grad_reduce": False,
                                                                            "tp_comm_overlap": True, "vp": 2}])
def test_the_command_line_reads_back_as_the_configuration(change, monkeypatch):
    c = Configuration(config=CONFIG, seq_len=256, microbatch_size=1, global_batch=16, gpus=8, tp=2, pp=2, **change)
    assert predict_read(c.command(), monkeypatch) == [c.replace(config=Path(shlex.split(c.command())[2]))]


def test_a_setup_writes_the_predict_line_that_reproduces_it(monkeypatch):
    """``Setup.command()`` is the ``zbsolve predict`` line of the setup: read back by the command line, the same
    knobs, predict's own defaults written out where the setup's differ (ZeRO 0, no overlaps); what predict cannot
    take is refused."""
    setup = Setup(config=CONFIG, seq_len=256, microbatch_size=1, global_batch=16, gpus=8, tp=2, pp=2,
                  recompute="full")
    words = shlex.split(setup.command())
    assert {"--no-overlap-grad-reduce", "--no-overlap-param-gather"} <= set(words) and "--zero" in words
    taken = predict_read(setup.command(), monkeypatch)
    assert len(taken) == 1
    assert all(getattr(taken[0], name) == getattr(setup, name) for name in PREDICT_OPTIONS)
    with pytest.raises(InputError, match=r"^efficiency = 0.5: zbsolve predict takes no such option"):
        setup.replace(efficiency=0.5).command()
    with pytest.raises(InputError, match=r"^gpus = None: zbsolve predict needs it"):
        Setup(config=CONFIG, seq_len=8, microbatch_size=1, global_batch=8).command()
