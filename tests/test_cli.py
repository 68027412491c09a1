"""The command line, driven as a user drives it: as a subprocess."""

import json
import subprocess
import sys

import pytest


def zbsolve(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "zbsolve", *map(str, args)], capture_output=True, text=True, cwd=cwd)


def test_schedule_check_roundtrip(tmp_path):
    out = tmp_path / "s.json"
    run = zbsolve("schedule", "1f1b", "--stages", 4, "--microbatches", 8, "-o", out, "--json")
    assert run.returncode == 0, run.stderr
    figures = json.loads(run.stdout)["1f1b"]
    assert figures["peak_memory"] == 4
    check = zbsolve("check", out, "--json")
    assert check.returncode == 0, check.stderr
    assert json.loads(check.stdout)["makespan"] == figures["makespan"]


def test_check_rejects_invalid_schedule(tmp_path):
    out = tmp_path / "s.json"
    assert zbsolve("schedule", "1f1b", "-p", 2, "-m", 2, "-o", out, "-q").returncode == 0
    doc = json.loads(out.read_text())
    doc["devices"][0].pop()
    out.write_text(json.dumps(doc))
    run = zbsolve("check", out)
    assert run.returncode == 1
    assert "missing pass" in run.stderr and "Traceback" not in run.stderr


@pytest.mark.parametrize("args, needle", [
    (("schedule", "zb-h9", "-p", 4, "-m", 8), "family = 'zb-h9' is unknown"),
    (("schedule", "1f1b", "-p", 0, "-m", 8), "Invalid value"),
    (("check", "missing.json"), "cannot read missing.json"),
])
def test_bad_input_exit_2(args, needle):
    run = zbsolve(*args)
    assert run.returncode == 2
    assert needle in run.stderr and "Traceback" not in run.stderr


def test_check_wrong_format(tmp_path):
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"format": "other", "version": 1}))
    run = zbsolve("check", path)
    assert run.returncode == 2 and "format = 'other'" in run.stderr


def test_schedule_with_profile_file(tmp_path):
    run = zbsolve("schedule", "1f1b", "-p", 8, "-m", 24, "--profile", "problems/iclr/1.5b-p8-m24.yaml", "--json")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["1f1b"]["peak_memory"] == 8 * 201216


def test_compare_lists_every_family():
    from zbsolve.families import FAMILIES
    run = zbsolve("compare", "--stages", 4, "--microbatches", 8, "--json")
    assert run.returncode == 0, run.stderr
    data = json.loads(run.stdout)
    assert set(data["figures"]) | set(data["skipped"]) == set(FAMILIES)


def test_every_command_has_help_with_an_example():
    from zbsolve.cli import app
    names = [c.name or c.callback.__name__ for c in app.registered_commands]
    assert {"schedule", "check", "compare", "plot", "solve", "export", "run", "profile", "grid", "summarize", "frontier"} <= set(names)
    for name in names:
        run = zbsolve(name, "--help")
        assert run.returncode == 0 and "Example: zbsolve " + name in " ".join(run.stdout.split()), name


def test_solve_plot_export_chain(tmp_path):
    doc, chart, csv = tmp_path / "s.json", tmp_path / "s.svg", tmp_path / "s.csv"
    run = zbsolve("solve", "problems/iclr/1.5b-p8-m24.yaml", "--mem-factor", 1, "--time-limit", 10, "-o", doc, "--json")
    assert run.returncode == 0, run.stderr
    figures = json.loads(run.stdout)
    assert figures["status"] == "optimal" and round(figures["paper_bubble"], 4) == 0.1585
    assert zbsolve("check", doc, "-q").returncode == 0
    assert zbsolve("plot", doc, "-o", chart, "--memory", "-q").returncode == 0 and chart.read_text().startswith("<?xml")
    assert zbsolve("export", doc, "--format", "torch-csv", "-o", csv, "-q").returncode == 0
    assert len(csv.read_text().splitlines()) == 8


@pytest.mark.parametrize("args, code, needle", [
    (("solve", "problems/iclr/1.5b-p8-m24.yaml", "--mem-limit", 1000), 1, "smallest feasible"),
    (("solve", "problems/iclr/1.5b-p8-m24.yaml", "--solver", "gurobi"), 2, "solver = 'gurobi'"),
    (("solve", "problems/iclr/1.5b-p8-m24.yaml", "--time-limit", 0), 2, "time_limit"),
    (("solve", "problems/iclr/1.5b-p8-m24.yaml", "--mem-factor", 1, "--mem-limit", 5), 2, "not both"),
    (("export", "problems/iclr/1.5b-p8-m24.yaml", "-f", "torch-csv", "-o", "x.csv"), 2, "not valid JSON"),
    (("summarize", "missing.jsonl", "-o", "x.csv"), 2, "missing.jsonl"),
])
def test_solve_and_friends_bad_input(args, code, needle, tmp_path):
    run = zbsolve(*args, cwd=None)
    assert run.returncode == code, run.stderr
    assert needle in run.stderr and "Traceback" not in run.stderr


def test_grid_and_summarize(tmp_path):
    results, table = tmp_path / "r.jsonl", tmp_path / "r.csv"
    run = zbsolve("grid", "problems/grids/smoke.yaml", "--jobs", 2, "-o", results, "--summary", table)
    assert run.returncode == 0, run.stderr
    assert "8 jobs" in run.stdout
    assert zbsolve("summarize", results, "-o", tmp_path / "again.csv", "-q").returncode == 0
    assert (tmp_path / "again.csv").read_text() == table.read_text()


def test_profile_and_run(tmp_path):
    pytest.importorskip("torch")
    prof, doc = tmp_path / "prof.yaml", tmp_path / "s.json"
    run = zbsolve("profile", "--model", "gpt", "--stages", 2, "--repeats", 2, "--no-latency", "-o", prof, "-q")
    assert run.returncode == 0, run.stderr
    assert zbsolve("schedule", "zb-h1", "-p", 2, "-m", 4, "--profile", prof, "-o", doc, "-q").returncode == 0
    run = zbsolve("run", doc, "--steps", 2, "--check", "--json")
    assert run.returncode == 0, run.stderr
    rows = json.loads(run.stdout)
    assert len(rows) == 2
