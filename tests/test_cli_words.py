"""What the commands say where a user's first runs go wrong: the cause and the shortfall, the exit codes the docs
state, one unit for one document."""

from __future__ import annotations

import concurrent.futures as cf
from pathlib import Path

import pytest
from conftest import ROOT, zbsolve

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
