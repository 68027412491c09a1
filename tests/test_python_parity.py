"""What the command line does, Python does too: ``zbsolve.predict`` on a config's path or a ``Configuration``,
sizes as text wherever a setup takes them, ``solve`` on a problem file with what it states, and every result with
a repr that says what it is and an HTML view."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

import zbsolve
from zbsolve.app.cli import app
from zbsolve.configure.result import Counts, Ranked
from zbsolve.costmodel.setup import Setup

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "problems/models/configs/llama3-8b.json"
KNOBS = {"seq_len": 2048, "microbatch_size": 1, "global_batch": 16, "gpus": 8, "pp": 2}


def test_a_setup_reads_sizes_as_text_as_the_command_line_does() -> None:
    assert Setup(seq_len=8, microbatch_size=1, device_memory="40GiB").device_memory == 40 * 2**30
    assert Setup(seq_len=8, microbatch_size=1, reserve="0").reserve == 0
    with pytest.raises(zbsolve.InputError, match="device_memory"):
        Setup(seq_len=8, microbatch_size=1, device_memory="lots")


def test_predict_takes_a_path_or_a_configuration_and_shows_itself() -> None:
    p = zbsolve.predict(CONFIG, **KNOBS, device_memory="80GiB")
    c = zbsolve.Configuration(config=CONFIG, **KNOBS)
    assert zbsolve.predict(c, device_memory="80GiB") == p
    assert repr(p).startswith("Prediction(") and "tokens/s/GPU" in repr(p)
    assert "<table>" in p._repr_html_()
    with pytest.raises(zbsolve.InputError, match="configuration"):
        zbsolve.predict(3)  # type: ignore[arg-type]


def test_a_sequence_past_the_configs_positions_warns_and_is_predicted() -> None:
    assert zbsolve.predict(CONFIG, **{**KNOBS, "seq_len": 16384}).warnings
    assert not zbsolve.predict(CONFIG, **KNOBS).warnings
    result = CliRunner().invoke(app, ["predict", str(CONFIG), *"--seq-len 16384 -b 1 --global-batch 16 --gpus 8 "
                                      "--pp 2 --json".split()])
    warned = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warned) == 1 and "max_position_embeddings = 8192" in warned[0]


def test_predicts_schedule_help_lists_the_orders() -> None:
    shown = " ".join(CliRunner().invoke(app, ["predict", "--help"], env={"COLUMNS": "200"}).output.split())
    assert "DualPipe" in shown and "Interleaved1F1B" in shown


def test_solve_takes_a_problem_file_and_its_microbatches() -> None:
    result = zbsolve.solve(ROOT / "problems/iclr/1.5b-p8-m24.yaml", time_limit=2)
    assert (result.schedule.num_devices, result.schedule.num_microbatches) == (8, 24)
    assert isinstance(zbsolve.Problem.load(ROOT / "problems/iclr/1.5b-p8-m24.yaml"), zbsolve.Problem)
    with pytest.raises(zbsolve.InputError, match="num_microbatches"):
        zbsolve.solve(zbsolve.UNIT, 3, num_devices=4)


def test_a_configure_result_has_a_repr_of_its_choice() -> None:
    c = zbsolve.Configuration(config=CONFIG, **KNOBS)
    chosen = Ranked(c, zbsolve.predict(c), c.command())
    result = zbsolve.ConfigureResult((chosen,), Counts(1, 0, 0, 0, 1, 0, 0, 0), chosen, None, False, 1.0, "megatron")
    assert repr(result).startswith("ConfigureResult(chosen='tp/pp/vp/cp/ep/dp 1/2/1/1/1/4'")
    assert "<table" in result._repr_html_()
