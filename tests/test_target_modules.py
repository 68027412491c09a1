"""A target is one module of ``zbsolve.io.targets``: a module declaring its ``EXPORT`` joins the target table,
``FORMATS``, ``export_document``, ``runs_as_planned``, ``plan --target`` and ``zbsolve export --format`` with no
edit elsewhere."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import export_toy
from typer.testing import CliRunner

from zbsolve.app.cli import app
from zbsolve.base.errors import InputError
from zbsolve.io import targets
from zbsolve.io.targets.plan import read_plan
from zbsolve.optimize.solve import solve
from zbsolve.planning.targets import recompute_choices

TINY = '''"""A runtime that builds one stage per device and writes the device count."""

from dataclasses import replace
from pathlib import Path

from zbsolve.io.targets.export import Export
from zbsolve.io.targets.zbsolve import ZBSOLVE

TINY = replace(ZBSOLVE, name="tiny", label="tiny 0.1", placements={"sequential": (1,)},
               auto_recompute=("none", "full"))


def write(request):
    plan = request.plan()
    plan.check(TINY)
    text = f"devices {plan.schedule.num_devices}"
    Path(request.output).write_text(text + "\\n")
    return [Path(request.output)], text


EXPORT = Export(target=TINY, format="tiny-text", rank=3, write=write, takes=lambda plan: plan.check(TINY))
'''


@pytest.fixture
def tiny(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The registry as it is with one more module, ``tiny.py``, in a folder of the package."""
    folder = tmp_path / "more"
    folder.mkdir()
    (folder / "tiny.py").write_text(TINY)
    monkeypatch.setattr(targets, "__path__", [*targets.__path__, str(folder)])
    try:
        exports = targets.discover()
        monkeypatch.setattr(targets, "EXPORTS", exports)
        monkeypatch.setattr(targets, "TARGETS", {e.target.name: e.target for e in exports.values()})
        monkeypatch.setattr(targets, "FORMATS", tuple(exports))
        yield exports
    finally:
        sys.modules.pop(f"{targets.__name__}.tiny", None)
        if hasattr(targets, "tiny"):
            delattr(targets, "tiny")


def _document(tmp_path: Path, placement: str) -> Path:
    path = tmp_path / f"{placement}.json"
    solve(export_toy(), num_devices=2, num_microbatches=4, placement=placement, solver="heuristic").to_json(path)
    return path


def test_the_registry_finds_the_builtin_targets() -> None:
    assert targets.FORMATS == ("torch-csv", "torchtitan", "megatron")
    assert list(targets.TARGETS) == ["zbsolve", "torchtitan", "megatron"]
    assert [e.target.name for e in targets.discover().values()] == list(targets.TARGETS)


def test_a_new_target_is_one_module(tiny, tmp_path: Path) -> None:
    assert targets.FORMATS == ("torch-csv", "torchtitan", "megatron", "tiny-text")
    assert list(targets.TARGETS) == ["zbsolve", "torchtitan", "megatron", "tiny"]
    assert targets.check_target("tiny").label == "tiny 0.1"
    assert recompute_choices("tiny", "auto") == ("none", "full")
    sequential, vshape = _document(tmp_path, "sequential"), _document(tmp_path, "vshape")
    written, text = targets.export_document(sequential, "tiny-text", tmp_path / "out.txt")
    assert (written, text) == ([tmp_path / "out.txt"], "devices 2")
    assert (tmp_path / "out.txt").read_text() == "devices 2\n"
    assert "tiny" in targets.runs_as_planned(read_plan(sequential, "tiny-text"))
    assert "tiny" not in targets.runs_as_planned(read_plan(vshape, "tiny-text"))
    with pytest.raises(InputError, match=r"^placement vshape x2: tiny 0.1 builds sequential x1 .*\(runtime table: "
                                         r"tiny\.placements\); plan with --target tiny$"):
        targets.export_document(vshape, "tiny-text", tmp_path / "v.txt")
    with pytest.raises(InputError, match=r"^microbatch_size = 2 applies to format 'torchtitan' only, not 'tiny-text'$"):
        targets.export_document(sequential, "tiny-text", tmp_path / "out.txt", microbatch_size=2)
    with pytest.raises(InputError, match=r"^output is missing: format 'tiny-text' writes files$"):
        targets.export_document(sequential, "tiny-text", None)
    result = CliRunner().invoke(app, ["export", str(sequential), "--format", "tiny-text", "-o",
                                      str(tmp_path / "cli.txt")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "cli.txt").read_text() == "devices 2\n"


def test_the_registry_leaves_no_trace(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"^format = 'tiny-text' is unknown; choose one of torch-csv, torchtitan, "
                                         r"megatron$"):
        targets.export_document(_document(tmp_path, "sequential"), "tiny-text", tmp_path / "out.txt")
