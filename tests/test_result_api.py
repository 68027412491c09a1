"""What the Python API's results offer: ``plot`` (a matplotlib Figure, written when given a path) and ``export`` (the
files ``zbsolve export`` writes for the same document), ``zbsolve.export`` at the top level, the attributes their
repr names, and a baseline's memory as the device memory it needs."""

from __future__ import annotations

import concurrent.futures as cf
from pathlib import Path

import pytest
from matplotlib.figure import Figure
from typer.testing import CliRunner

from conftest import export_toy

import zbsolve
from zbsolve.app.cli import app
from zbsolve.base.errors import InputError
from zbsolve.base.units import GIB
from zbsolve.io.targets import FORMATS
from zbsolve.planning.baselines import baselines
from zbsolve.costmodel.model import Layer, Model

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def planned() -> zbsolve.PlanResult:
    """A plan of the toy model on 2 devices, 4 microbatches, two stages per device, for Megatron (so that every
    format exports it)."""
    with cf.ThreadPoolExecutor(1) as pool:
        return zbsolve.plan(export_toy(), num_devices=2, num_microbatches=4, device_memory="1GiB", reserve=0,
                            placement="interleaved", target="megatron", time_limit=5, executor=pool)


@pytest.fixture(scope="module")
def solved() -> zbsolve.SolveResult:
    return zbsolve.solve(export_toy(), num_devices=2, num_microbatches=4, solver="heuristic")


def cli(*args: object):
    return CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "100000"})


def files(path: Path) -> dict[str, bytes]:
    """The bytes of every file in the folder at ``path`` by name, or of the file at ``path`` (by "")."""
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())} if path.is_dir() else {"": path.read_bytes()}


def test_a_plans_repr_names_attributes_it_has(planned):
    assert f"partition={list(planned.partition)}" in repr(planned)
    assert planned.partition == planned.counts == tuple(planned.summary()["partition"])


@pytest.mark.parametrize("which", ["planned", "solved"])
def test_plot_returns_a_figure_and_writes_a_png(request, tmp_path, which):
    result = request.getfixturevalue(which)
    assert isinstance(result.plot(), Figure) and not list(tmp_path.iterdir())
    path = tmp_path / "chart.png"
    assert isinstance(result.plot(path), Figure)
    assert path.read_bytes().startswith(PNG)
    result.plot(tmp_path / "chart.svg")
    assert (tmp_path / "chart.svg").read_text().lstrip().startswith("<?xml")
    with pytest.raises(InputError, match=r"chart\.txt: suffix '\.txt' is not one of \.png, \.svg$"):
        result.plot(tmp_path / "chart.txt")


@pytest.mark.parametrize("fmt", FORMATS)
def test_export_writes_what_the_command_writes_for_the_same_document(planned, tmp_path, fmt):
    document = tmp_path / "plan.json"
    planned.to_json(document)
    done = cli("export", document, "--format", fmt, "-o", tmp_path / "cli", "-q")
    assert done.exit_code == 0, done.output
    want = files(tmp_path / "cli")
    text = planned.export(fmt, tmp_path / "method")
    assert files(tmp_path / "method") == want
    assert zbsolve.export(planned, fmt, tmp_path / "top") == text
    assert files(tmp_path / "top") == want
    assert zbsolve.export(document, fmt, tmp_path / "path") == text
    assert files(tmp_path / "path") == want
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cli", "method", "path", "plan.json", "top"]


def test_a_solves_export_is_the_commands(solved, tmp_path):
    document = tmp_path / "best.json"
    solved.to_json(document)
    assert cli("export", document, "-o", tmp_path / "cli.csv", "-q").exit_code == 0
    assert solved.export("torch-csv", tmp_path / "api.csv") == (tmp_path / "api.csv").read_text()
    assert (tmp_path / "api.csv").read_bytes() == (tmp_path / "cli.csv").read_bytes()
    assert solved.export("megatron") == cli("export", document, "-f", "megatron").stdout.strip()


def test_export_refuses_what_the_command_refuses(solved, tmp_path):
    with pytest.raises(InputError, match="^format = 'onnx' is unknown; choose one of torch-csv, torchtitan, megatron$"):
        solved.export("onnx", tmp_path / "x")
    with pytest.raises(InputError, match="^output is missing: format 'torch-csv' writes files$"):
        zbsolve.export(solved, "torch-csv")
    unit = zbsolve.solve(zbsolve.UNIT, 2, num_microbatches=4, num_devices=2, solver="heuristic")
    with pytest.raises(InputError, match="partition is missing; format 'torchtitan' needs the model's layers"):
        unit.export("torchtitan", tmp_path / "tt")
    assert not list(tmp_path.iterdir())


def test_a_baselines_memory_is_what_it_needs_of_the_device_so_it_fits_exactly_when_within():
    """Every row's "max GiB" holds the reserve with the static bytes and peak activations, so a row fits exactly
    when that is at most the device memory: here 1F1B's 8 GiB of use and the 2 GiB reserve do not fit 9 GiB."""
    model = Model(name="act", layers=[
        Layer(name=n, block=n.startswith("layers."), t_f=1.0, t_b=1.0, t_w=1.0, mem_f=GIB // 2, mem_b=0,
              mem_w=-(GIB // 2), static_bytes=GIB // 8, out_bytes=GIB // 64)
        for n in ("tok_embeddings", *(f"layers.{i}" for i in range(8)), "output")])
    free = {(b.split, b.schedule, b.recompute): b for b in baselines(model, 2, 8, 1000 * GIB, reserve=0)}
    used = max(free["uniform", "1F1B", "none"].memory_gib)
    rows = baselines(model, 2, 8, int((used + 1) * GIB), reserve=2 * GIB)
    one_f_one_b = next(b for b in rows if (b.split, b.schedule, b.recompute) == ("uniform", "1F1B", "none"))
    assert max(one_f_one_b.memory_gib) == pytest.approx(used + 2) and not one_f_one_b.fits
    for row in rows:
        if row.memory_gib is not None:
            assert row.fits == (max(row.memory_gib) <= used + 1 + 1e-9), row
            assert row.row()["max GiB"] == max(row.memory_gib)
