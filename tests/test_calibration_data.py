"""The published runs of problems/calibration/ (the calibration table's input): every file carries the keys the README's schema requires,
its parallel degrees divide its GPUs and its batch, each figure names the table row it came from (a measured peak
memory too, with which figure it is), and the held-back and schedule-pair markers the calibration benchmark reads are
consistent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from conftest import PROBLEMS, ROOT

from zbsolve.base.kinds import HF_CONFIG, file_kind

RUNS = sorted((PROBLEMS / "calibration").glob("*.yaml"))
REQUIRED = {"name", "held_back", "scored", "model", "hardware", "precision", "parallelism", "batch", "recompute",
            "measured", "source"}
DEGREES = ("tp", "pp", "cp", "ep")
GPUS = {"h100-sxm-80gb", "h100-hbm2e-96gb-500w", "h200-sxm-141gb"}
GRANULARITIES = {"none", "selective", "full", "unknown"}
MEMORY_KINDS = {"reserved", "allocated", "active", "nvidia-smi"}
MEMORY_DEVICES = {"max", "logging-rank"}
MEMORY_KEYS = {"peak_memory_gib", "memory_kind", "memory_gib_per", "memory_device"}


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


@pytest.mark.parametrize("path", RUNS, ids=lambda p: p.stem)
def test_run_has_the_schema_keys(path):
    run = load(path)
    assert REQUIRED <= set(run), REQUIRED - set(run)
    assert run["name"] == path.stem
    assert isinstance(run["held_back"], bool) and isinstance(run["scored"], bool)
    assert not (run["held_back"] and not run["scored"]), "a held-back run is a scored one, reported apart"
    assert run["hardware"]["gpu"] in GPUS and run["hardware"]["gpus"] >= 1
    assert run["precision"]["dtype"] in ("bf16", "fp8")
    assert (run["precision"]["fp8_recipe"] is None) == (run["precision"]["dtype"] == "bf16")
    assert run["recompute"]["granularity"] in GRANULARITIES
    source = run["source"]
    assert source["url"].startswith("https://") and source["file"] and source["release"]
    assert source["row"].strip().startswith("|"), "the table row is quoted as published"


@pytest.mark.parametrize("path", RUNS, ids=lambda p: p.stem)
def test_degrees_divide_gpus_and_batch(path):
    run = load(path)
    par, batch, gpus = run["parallelism"], run["batch"], run["hardware"]["gpus"]
    assert all(isinstance(par[k], int) and par[k] >= 1 for k in DEGREES)
    assert par["vp"] is None or (isinstance(par["vp"], int) and par["vp"] >= 2)
    assert par["tp"] * par["pp"] * par["cp"] * par["dp"] == gpus
    assert gpus % (par["ep"] * (par["etp"] or 1) * par["pp"]) == 0, "experts do not tile the GPUs"
    assert batch["global_batch_size"] == batch["microbatch_size"] * par["dp"] * batch["microbatches"]
    if par["vp"] is not None:
        assert batch["microbatches"] % par["pp"] == 0, "interleaving needs microbatches in groups of pp"


@pytest.mark.parametrize("path", RUNS, ids=lambda p: p.stem)
def test_figures_are_published_or_marked_derived(path):
    run = load(path)
    measured, par, batch = run["measured"], run["parallelism"], run["batch"]
    assert measured["tokens_per_s_per_gpu"] > 0
    assert set(measured["derived"]) <= set(measured) - {"derived"}
    if measured["step_time_s"] is not None:
        tokens = batch["global_batch_size"] * batch["seq_len"] / (measured["step_time_s"] * run["hardware"]["gpus"])
        assert tokens == pytest.approx(measured["tokens_per_s_per_gpu"], rel=1e-3)
        assert "tokens_per_s_per_gpu" in measured["derived"]
    else:
        assert measured["derived"] == []
    assert par["dp"] >= 1


@pytest.mark.parametrize("path", RUNS, ids=lambda p: p.stem)
def test_model_config_is_a_shipped_hugging_face_config(path):
    config = load(path)["model"]["config"]
    if config is not None:
        data = json.loads((ROOT / config).read_text())
        assert file_kind(data) == HF_CONFIG


def test_held_back_runs_span_dense_moe_and_bf16():
    runs = [load(path) for path in RUNS]
    held = [run for run in runs if run["held_back"]]
    assert len(held) >= 3
    assert any(run["parallelism"]["ep"] == 1 for run in held) and any(run["parallelism"]["ep"] > 1 for run in held)
    assert any(run["precision"]["dtype"] == "bf16" for run in held)
    assert sum(run["parallelism"]["pp"] > 1 and run["scored"] for run in runs) >= 10


def test_schedule_pairs_point_at_each_other():
    runs = {path.stem: load(path) for path in RUNS}
    pairs = {name: run["schedule"]["pair"] for name, run in runs.items() if run.get("schedule", {}).get("pair")}
    assert pairs
    for name, other in pairs.items():
        assert pairs.get(other) == name
        a, b = runs[name], runs[other]
        for key in ("model", "hardware", "precision", "batch"):
            assert a[key] == b[key], key
        assert {a["schedule"]["name"], b["schedule"]["name"]} == {"1f1b", "interleaved-1f1b"}


@pytest.mark.parametrize("path", RUNS, ids=lambda p: p.stem)
def test_a_measured_peak_memory_is_a_published_device_figure(path):
    run = load(path)
    measured = run["measured"]
    assert "memory_gib" not in measured, "the peak memory is measured.peak_memory_gib"
    peak = measured.get("peak_memory_gib")
    if peak is None:
        assert not MEMORY_KEYS & set(measured), "memory keys without a peak memory"
        return
    assert MEMORY_KEYS <= set(measured), MEMORY_KEYS - set(measured)
    assert isinstance(peak, (int, float)) and not isinstance(peak, bool) and peak > 0
    assert measured["memory_kind"] is None or measured["memory_kind"] in MEMORY_KINDS
    assert measured["memory_gib_per"] == "device"
    assert measured["memory_device"] is None or measured["memory_device"] in MEMORY_DEVICES
    assert "peak_memory_gib" not in measured["derived"], "a peak memory is published, never derived"
    assert str(peak) in run["source"]["row"], "the peak memory is in the quoted row as published"


def test_memory_runs_include_held_back_and_pipeline_ones():
    runs = [load(path) for path in RUNS]
    memory = [run for run in runs if run["measured"].get("peak_memory_gib") is not None]
    assert len(memory) >= 6
    assert sum(run["held_back"] for run in memory) >= 2
    assert sum(run["parallelism"]["pp"] > 1 and run["scored"] and not run["held_back"] for run in memory) >= 2
