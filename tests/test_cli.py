"""The command line: a few runs as a user drives it, as a subprocess of ``python -m zbsolve`` (its exit codes and
its streams), the rest in-process (``conftest.zbsolve``)."""

import json
import subprocess
import sys

import pytest
from conftest import zbsolve
from typer.testing import CliRunner


def process(*args):
    """``python -m zbsolve`` with ``args``, as a subprocess."""
    return subprocess.run([sys.executable, "-m", "zbsolve", *map(str, args)], capture_output=True, text=True,
                          check=False)


def test_schedule_check_roundtrip(tmp_path):
    out = tmp_path / "s.json"
    run = process("schedule", "1f1b", "--devices", 4, "--microbatches", 8, "-o", out, "--json")
    assert run.returncode == 0, run.stderr
    figures = json.loads(run.stdout)["1f1b"]
    assert figures["peak_memory"] == 4
    check = zbsolve("check", out, "--json")
    assert check.exit_code == 0, check.stderr
    assert json.loads(check.stdout)["makespan"] == figures["makespan"]


def test_check_rejects_invalid_schedule(tmp_path):
    out = tmp_path / "s.json"
    assert zbsolve("schedule", "1f1b", "-p", 2, "-m", 2, "-o", out, "-q").exit_code == 0
    doc = json.loads(out.read_text())
    doc["devices"][0].pop()
    out.write_text(json.dumps(doc))
    run = process("check", out)
    assert run.returncode == 1
    assert "missing pass" in run.stderr and "Traceback" not in run.stderr


@pytest.mark.parametrize("args, needle", [
    (("schedule", "zb-h9", "-p", 4, "-m", 8), "family = 'zb-h9' is unknown"),
    (("schedule", "1f1b", "-p", 0, "-m", 8), "Invalid value"),
    (("check", "missing.json"), "cannot read missing.json"),
])
def test_bad_input_exit_2(args, needle):
    run = zbsolve(*args)
    assert run.exit_code == 2
    assert needle in run.stderr and "Traceback" not in run.stderr


def test_check_wrong_format(tmp_path):
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"format": "other", "version": 1}))
    run = process("check", path)
    assert run.returncode == 2 and "format = 'other'" in run.stderr


def test_schedule_with_profile_file(tmp_path):
    run = zbsolve("schedule", "1f1b", "-p", 8, "-m", 24, "--profile", "problems/iclr/1.5b-p8-m24.yaml", "--json")
    assert run.exit_code == 0, run.stderr
    assert json.loads(run.stdout)["1f1b"]["peak_memory"] == 8 * 201216


def test_compare_lists_every_family():
    from zbsolve.schedulers.families import FAMILIES
    run = zbsolve("compare", "--devices", 4, "--microbatches", 8, "--json")
    assert run.exit_code == 0, run.stderr
    data = json.loads(run.stdout)
    assert set(data["figures"]) | set(data["skipped"]) == set(FAMILIES)
    assert data["figures"]["1f1b"]["peak_memory"] == 4


@pytest.mark.parametrize("command", [("compare",), ("schedule", "zb-h1")])
@pytest.mark.parametrize("flag", ["--devices", "-p", "--stages"])
def test_devices_option_and_its_hidden_alias(command, flag):
    """--devices and -p give the device count; --stages, its older name, still works but is not in --help."""
    run = zbsolve(*command, flag, 3, "-m", 6, "--json")
    assert run.exit_code == 0, run.stderr
    data = json.loads(run.stdout)
    figures = data["figures"]["zb-h1"] if command[0] == "compare" else data["zb-h1"]
    assert len(figures["peak_memory_per_device"]) == 3
    if flag == "--stages":
        helped = zbsolve(*command[:1], "--help")
        assert helped.exit_code == 0 and "--devices" in helped.stdout and "--stages" not in helped.stdout


@pytest.mark.parametrize("args, needle", [
    (("compare", "-m", 4), "missing option --devices"),
    (("compare", "--devices", 4, "--stages", 3, "-m", 4), "--devices 4 and --stages 3 differ"),
    (("schedule", "1f1b", "-m", 4), "missing option --devices"),
])
def test_devices_missing_or_contradicted_exit_2(args, needle):
    run = zbsolve(*args)
    assert run.exit_code == 2 and needle in run.stderr and "Traceback" not in run.stderr


def test_compare_same_devices_under_both_names():
    run = zbsolve("compare", "--devices", 4, "--stages", 4, "-m", 8, "--json")
    assert run.exit_code == 0, run.stderr
    assert json.loads(run.stdout) == json.loads(zbsolve("compare", "-p", 4, "-m", 8, "--json").stdout)


def test_every_command_has_help_with_an_example():
    from zbsolve.app.cli import app
    names = [c.name or c.callback.__name__ for c in app.registered_commands]
    assert {"schedule", "check", "compare", "plot", "solve", "export", "run", "profile", "grid", "summarize",
            "frontier"} <= set(names)
    for name in names:  # in this process: the command line's start-up is test_schedule_check_roundtrip's
        run = CliRunner().invoke(app, [name, "--help"])
        assert run.exit_code == 0 and "Example: zbsolve " + name in " ".join(run.output.split()), name


def test_solve_plot_export_chain(tmp_path):
    doc, chart, csv = tmp_path / "s.json", tmp_path / "s.svg", tmp_path / "s.csv"
    run = zbsolve("solve", "problems/iclr/1.5b-p8-m24.yaml", "--mem-factor", 1, "--time-limit", 10, "-o", doc, "--json")
    assert run.exit_code == 0, run.stderr
    figures = json.loads(run.stdout)
    assert figures["status"] == "optimal" and round(figures["paper_bubble"], 4) == 0.1585
    assert zbsolve("check", doc, "-q").exit_code == 0
    assert zbsolve("plot", doc, "-o", chart, "--memory", "-q").exit_code == 0 and chart.read_text().startswith("<?xml")
    assert zbsolve("export", doc, "--format", "torch-csv", "-o", csv, "-q").exit_code == 0
    assert len(csv.read_text().splitlines()) == 8


@pytest.mark.parametrize("args, code, needle", [
    (("solve", "problems/iclr/1.5b-p8-m24.yaml", "--mem-limit", 1000), 1, "smallest feasible"),
    (("solve", "problems/iclr/1.5b-p8-m24.yaml", "--solver", "gurobi"), 2, "solver = 'gurobi'"),
    (("solve", "problems/iclr/1.5b-p8-m24.yaml", "--time-limit", 0), 2, "time_limit"),
    (("solve", "problems/iclr/1.5b-p8-m24.yaml", "--mem-factor", 1, "--mem-limit", 5), 2, "not both"),
    (("export", "problems/iclr/1.5b-p8-m24.yaml", "-f", "torch-csv", "-o", "x.csv"), 2,
     "is a problem file; zbsolve export takes a schedule document"),
    (("summarize", "missing.jsonl", "-o", "x.csv"), 2, "missing.jsonl"),
])
def test_solve_and_friends_bad_input(args, code, needle, tmp_path):
    run = zbsolve(*args)
    assert run.exit_code == code, run.stderr
    assert needle in run.stderr and "Traceback" not in run.stderr


def test_frontier_factors_match_the_library_with_limits(tmp_path):
    """The command passes --factors straight through: its rows are the library's at the same limits."""
    from zbsolve import UNIT
    from zbsolve.optimize.frontier import frontier
    from zbsolve.problem.memory_factor import reference_peak

    problem = tmp_path / "p.yaml"
    problem.write_text("num_devices: 2\nnum_microbatches: 4\n")
    run = zbsolve("frontier", problem, "--factors", "0.75,1.5", "--placements", "sequential", "--time-limit", 2,
                  "--jobs", 1, "--json")
    assert run.exit_code == 0, run.stderr
    rows = json.loads(run.stdout)["rows"]
    assert [r["factor"] for r in rows] == [0.75, 1.5]
    peak = reference_peak(UNIT, 2, 4)
    expected = frontier(UNIT, [0.75 * peak, 1.5 * peak], num_microbatches=4, num_devices=2,
                        placements=("sequential",), time_limit=2, jobs=1)
    assert len(rows) == len(expected.rows) == 2
    for got, want in zip(rows, expected.rows):
        assert got["mem_limit"] == pytest.approx(want.mem_limit) and got["factor"] == pytest.approx(want.factor)
        assert got["paper_bubble"] == pytest.approx(want.paper_bubble) and got["status"] == want.status


def test_render_formats_figures():
    from zbsolve.present.tables import figures_html, figures_table, fmt, records_table

    assert [fmt(x) for x in (1310405.0, 0.158496, 1.5, 0.0, 2.5e-5, None, 3, "optimal", [4.0, 3.5])] == \
        ["1310405", "0.1585", "1.5", "0", "2.5e-05", "-", "3", "optimal", "4, 3.5"]
    # labels that hold commas themselves stay told apart
    assert fmt(["tok_embeddings, layers.0-3", "layers.4-7"]) == "tok_embeddings, layers.0-3; layers.4-7"
    figures = {"status": "optimal", "gap": 0.0, "peak_memory": [4.0, 3.5], "name": "<a&b>"}
    assert figures_html(figures) == ("<table><tr><th>status</th><td>optimal</td></tr><tr><th>gap</th><td>0</td></tr>"
                                     "<tr><th>peak_memory</th><td>4, 3.5</td></tr>"
                                     "<tr><th>name</th><td>&lt;a&amp;b&gt;</td></tr></table>")
    table = figures_table(figures, "t")
    assert table.title == "t" and table.row_count == 4 and list(table.columns[1].cells) == ["optimal", "0", "4, 3.5",
                                                                                            "<a&b>"]
    records = records_table([{"schedule": "1f1b", "makespan": 27.0}, {"schedule": "zb-h1"}], "r")
    assert [c.header for c in records.columns] == ["schedule", "step time with barrier (profile's unit)"]
    assert [c.justify for c in records.columns] == ["left", "right"]
    assert list(records.columns[1].cells) == ["27", "-"]


def test_grid_and_summarize(tmp_path):
    results, table = tmp_path / "r.jsonl", tmp_path / "r.csv"
    run = zbsolve("grid", "problems/grids/smoke.yaml", "--jobs", 2, "-o", results, "--summary", table)
    assert run.exit_code == 0, run.stderr
    assert "8 jobs" in run.stdout
    assert zbsolve("summarize", results, "-o", tmp_path / "again.csv", "-q").exit_code == 0
    assert (tmp_path / "again.csv").read_text() == table.read_text()


def test_profile_and_run(tmp_path):
    pytest.importorskip("torch", reason="torch is not installed (the torch extra)")
    prof, doc = tmp_path / "prof.yaml", tmp_path / "s.json"
    profiled = zbsolve("profile", "--model", "gpt", "--stages", 2, "--repeats", 2, "--no-latency", "-o", prof, "-q")
    assert profiled.exit_code == 0, profiled.stderr
    assert zbsolve("schedule", "zb-h1", "-p", 2, "-m", 4, "--profile", prof, "-o", doc, "-q").exit_code == 0
    run = process("run", doc, "--steps", 2, "--check", "--json")
    assert run.returncode == 0, run.stderr
    rows = json.loads(run.stdout)
    assert len(rows) == 2


@pytest.mark.parametrize("ended, code, said", [(None, 0, ""), (0, 0, ""), (2, 2, ""), ("why", 1, "why\n")])
def test_the_entry_point_ends_the_process_with_the_command_s_code_once_its_output_is_flushed(monkeypatch, capsys,
                                                                                             ended, code, said):
    import zbsolve.app.cli
    import zbsolve_cli as entry
    from zbsolve.base import clock

    done = []

    class Ended(Exception):
        pass

    def exit_now(value):
        done.append(("exit", value))
        raise Ended

    def command():
        assert clock.started is not None and clock.command_began() == clock.started  # the limit counts from the start
        print("printed")
        raise SystemExit(ended)

    monkeypatch.setattr(zbsolve.app.cli, "app", command)
    monkeypatch.setattr(entry.atexit, "_run_exitfuncs", lambda: done.append(("handlers", None)))
    monkeypatch.setattr(entry.os, "_exit", exit_now)
    with pytest.raises(Ended):
        entry.main()
    assert done == [("handlers", None), ("exit", code)] and clock.started is None
    assert capsys.readouterr() == ("printed\n", said)
