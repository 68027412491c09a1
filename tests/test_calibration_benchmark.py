"""benchmarks/calibration.py's pure parts: every calibration file maps to a ``zbsolve predict`` configuration or a
stated reason, its printed command line parses back to that configuration, and a row's and the targets' arithmetic
(no prediction is run)."""

from __future__ import annotations

import importlib.util
import math
import shlex
import sys
from pathlib import Path

import pytest
from conftest import ROOT, predict_read

from zbsolve.base.errors import InputError

_spec = importlib.util.spec_from_file_location("benchmark_calibration", ROOT / "benchmarks" / "calibration.py")
calibration = sys.modules["benchmark_calibration"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(calibration)
RUNS = calibration.runs()


def row(measured: float, predicted: float | None, **kw) -> calibration.Row:
    fields = dict(name="run", parallelism="8 GPUs", dtype="bf16", pipeline=True, held_back=False, scored=True,
                  step_time_s=None, command=None)
    return calibration.Row(**{**fields, **kw}, measured=measured, predicted=predicted)


@pytest.mark.parametrize("run", RUNS, ids=lambda run: run["name"])
def test_each_file_maps_to_a_configuration_or_a_reason(run):
    m = calibration.mapped(run)
    assert (m.configuration is None) == bool(m.reason)
    if m.configuration is not None:
        c, par = m.configuration, run["parallelism"]
        assert (c.gpus, c.tp, c.pp, c.cp, c.ep, c.vp) == (run["hardware"]["gpus"], par["tp"], par["pp"], par["cp"],
                                                            par["ep"], par["vp"] or 1)
        assert (c.seq_len, c.microbatch_size, c.global_batch) == (run["batch"]["seq_len"],
                                                                  run["batch"]["microbatch_size"],
                                                                  run["batch"]["global_batch_size"])
        assert (ROOT / c.config).is_file() and c.dtype == run["precision"]["dtype"]


@pytest.mark.parametrize("run", [r for r in RUNS if calibration.mapped(r).configuration is not None],
                         ids=lambda run: run["name"])
def test_the_command_line_is_the_configuration(run, monkeypatch):
    c = calibration.mapped(run).configuration
    assert shlex.split(c.command())[:2] == ["zbsolve", "predict"]
    taken = predict_read(c.command(), monkeypatch)
    assert len(taken) == 1
    assert Path(taken[0].config) == Path(c.config)
    assert taken[0].replace(config=c.config) == c


def test_recompute_forms_of_the_files():
    assert calibration.recompute_choice({"granularity": "full", "method": "block", "num_layers": 5}) == "uniform:5"
    assert calibration.recompute_choice({"granularity": "full", "method": "every layer"}) == "full"
    assert calibration.recompute_choice({"granularity": "selective", "modules": ["mlp", "layernorm"]}) \
        == "modules:mlp,layernorm"
    assert isinstance(calibration.recompute_choice({"granularity": "selective", "modules": None}), InputError)
    assert isinstance(calibration.recompute_choice({"granularity": "unknown"}), InputError)


def test_a_row_is_its_ratio_and_a_missing_prediction_a_miss():
    over = row(200.0, 250.0)
    assert over.ratio == pytest.approx(1.25) and over.error == pytest.approx(0.25) and over.within
    assert not row(200.0, 251.0).within
    missing = row(200.0, None)
    assert missing.ratio is None and math.isinf(missing.error) and not missing.within


def test_targets_count_unpredicted_runs_and_leave_held_back_and_records_out():
    rows = [row(100.0, 105.0), row(100.0, 95.0), row(100.0, 300.0, held_back=True),
            row(100.0, None, scored=False), row(100.0, 130.0, pipeline=False)]
    median, every, *_ = calibration.targets(rows, [])
    assert median["value"] == pytest.approx(0.05) and median["met"]
    assert not every["met"] and every["value"] == 2
    median, *_ = calibration.targets(rows + [row(100.0, None), row(100.0, None), row(100.0, None)], [])
    assert median["value"] is None and not median["met"]


def test_alternatives_more_than_ten_percent_apart_must_keep_their_order():
    fast, slow, near = (row(200.0, 150.0, name="a", model="m", cluster="c"),
                        row(100.0, 160.0, name="b", model="m", cluster="c"),
                        row(195.0, 100.0, name="d", model="m", cluster="c"))
    ranked = calibration.ranking([fast, slow, near])
    assert [(p["pair"], p["met"]) for p in ranked] == [("a > b", False), ("d > b", False)]
    assert calibration.ranking([fast, row(100.0, 100.0, name="e", model="m", cluster="other")]) == []
