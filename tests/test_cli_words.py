"""What the commands say where a user's first runs go wrong: the cause and the shortfall, the exit codes the docs
state, one unit for one document."""

from __future__ import annotations

import concurrent.futures as cf
from pathlib import Path

import pytest
from conftest import ROOT, failed_cleanly, zbsolve

from zbsolve.base.units import MIB
from zbsolve.configure import choose as configure_module
from zbsolve.configure import search as configure_search
from zbsolve.configure.predict import Configuration, predict

DENSE = ROOT / "tests" / "data" / "tiny-llama.json"
"""Four blocks, four heads over two key/value heads."""


def test_an_interrupt_in_configure_with_an_output_exits_130(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C once a configuration that fits is timed: the ranking so far, nothing planned, so nothing written, and
    the interrupt's exit code, not a refusal of the output."""
    fitting: list[Configuration] = []

    def stopping(c: Configuration):
        if fitting:
            raise KeyboardInterrupt
        figures = predict(c)
        fitting.extend([c] * figures.fits)
        return figures

    searched = configure_module.configure

    def in_threads(*args, **kwargs):
        with cf.ThreadPoolExecutor(1) as pool:
            return searched(*args, **{**kwargs, "executor": pool})

    monkeypatch.setattr(configure_search, "time_configuration", stopping)
    monkeypatch.setattr(configure_module, "configure", in_threads)
    result = zbsolve("configure", DENSE, "--gpus", 4, "--global-batch", 16, "--seq-len", 256, "--device-memory",
                     f"{20 * MIB}", "--reserve", 0, "--time-limit", 30, "-o", tmp_path / "plan.json")
    assert result.exit_code == 130, (result.stdout, result.stderr, result.exception)
    assert "interrupted" in result.stderr and "nothing written" in result.stderr
    assert not (tmp_path / "plan.json").exists()


def test_configure_on_more_gpus_than_the_batch_spreads_over_blames_the_global_batch() -> None:
    result = zbsolve("configure", DENSE, "--gpus", 1_000_000, "--global-batch", 16, "--seq-len", 256,
                     "--time-limit", 5)
    line = failed_cleanly(result, 2)
    assert "the global batch of 16 sequences spreads over at most" in line and "not a multiple" not in line


def test_run_refuses_a_bad_model_before_any_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight ranks on two cores: the refusal of the model comes alone, before the warning of crowded cores."""
    pytest.importorskip("torch", reason="zbsolve run needs torch")
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    document = tmp_path / "zb-h1.json"
    assert zbsolve("schedule", "zb-h1", "-p", 8, "-m", 8, "-o", document).exit_code == 0
    line = failed_cleanly(zbsolve("run", document, "--model", "llama"), 2)
    assert line == "error: model = 'llama' must be 'gpt' or 'module:function'"
