"""What a person reads: each figure under one name for the question it answers, times and sizes with their units,
the paper's figures only beside a solve of the paper's p and m, titles that do not contradict themselves, and tables
that fit 100 columns (``--wide`` for the rest)."""

from __future__ import annotations

import concurrent.futures as cf
import json

import pytest
from typer.testing import CliRunner

from conftest import ROOT
from zbsolve.app.cli import app
from zbsolve.base.units import GIB
from zbsolve.core.measures import BUBBLES_NOTE
from zbsolve.optimize.solve import solve
from zbsolve.planning.memory_frontier import MemoryPoint
from zbsolve.present.figures import Units, shown
from zbsolve.present.frontier_chart import plot_memory_frontier, recomputes
from zbsolve.present.plot import plot_timeline
from zbsolve.present.tables import baselines_table
from zbsolve.costmodel.model import Layer, Model
from zbsolve.problem.problem_file import Problem
from zbsolve.schedulers.families import make_schedule
from zbsolve.core.simulator import simulate
from zbsolve.core.profile import UNIT

runner = CliRunner()
LLAMA = ROOT / "problems" / "models" / "llama3-8b.yaml"
ICLR = ROOT / "problems" / "iclr" / "1.5b-p8-m24.yaml"
VSHAPE = ROOT / "problems" / "vshape" / "p16-m48.yaml"
WIDTH = 100
WIDE = 1000


def zbsolve(*args: object, columns: int = WIDTH):
    """The command line in-process on a terminal ``columns`` wide (``WIDE`` where the test reads names, so no header
    wraps)."""
    return runner.invoke(app, [str(a) for a in args], env={"COLUMNS": str(columns)})


def fits(output: str, width: int = WIDTH) -> bool:
    """Whether every line of ``output`` is at most ``width`` characters."""
    return all(len(line) <= width for line in output.splitlines())


def joined(output: str) -> str:
    """``output`` with its line breaks and runs of spaces as one space (a caption wraps)."""
    return " ".join(output.replace("│", " ").replace("┃", " ").split())


# -- point 2: one name per figure, the paper's figures said and shown only where they apply ----------------------

def test_a_solve_names_each_figure_for_its_question_once():
    """Llama-3-8B: the bubble of every device (0.33 with an unbalanced split) beside the paper's (the busiest
    device's, 0.04) read as two figures, said under the table; the makespan and the objective's value, both the step
    time with the barrier, are one row."""
    done = zbsolve("solve", LLAMA, "-p", 8, "-m", 32, "--device-memory", "80GiB", "--solver", "heuristic",
                   columns=WIDE)
    assert done.exit_code == 0, done.output
    text = joined(done.stdout)
    for name in ("step time with barrier (s)", "step time without barrier (s)", "bubble with barrier",
                 "bubble without barrier", "paper's bubble", "lower bound (s)", "solve time (s)"):
        assert name in text, name
    assert text.count("step time with barrier (s)") == 1 and "makespan (s)" not in text
    assert "bubble_rate" not in text and "paper_bubble" not in text and "value" not in text.split("figure value")[1]
    assert joined(BUBBLES_NOTE) in text


def test_the_json_keeps_its_keys_and_says_its_units():
    done = zbsolve("solve", ICLR, "--solver", "heuristic", "--json")
    figures = json.loads(done.stdout)
    assert {"step_time", "makespan", "value", "bubble_rate", "paper_bubble", "peak_memory"} <= set(figures)
    assert figures["units"] == {"time": "us", "memory": "Table 1 units"}


def test_the_paper_s_figures_say_what_they_hold_and_what_was_minimised():
    """A V-shape solve of the step time beside ZB-V's published paper's bubble: each row says it is the paper's
    bubble from the paper's table, and the note says the solve minimised another figure."""
    done = zbsolve("solve", VSHAPE, "--placement", "vshape", "--mem-factor", 1, "--solver", "heuristic", columns=WIDE)
    assert done.exit_code == 0, done.output
    text = joined(done.stdout)
    assert "paper's bubble of zb-v (paper's table) 0.0697" in text and "published" not in text
    assert ("paper's table: the paper's bubble of each schedule at p=16, m=48; this solve minimised the step time "
            "with barrier, not the paper's bubble") in text
    spanned = joined(zbsolve("solve", VSHAPE, "--placement", "vshape", "--mem-factor", 1, "--solver", "heuristic",
                             "--objective", "span").stdout)
    assert "paper's bubble of zb-v (paper's table)" in spanned and "this solve minimised" not in spanned


def test_the_paper_s_figures_are_not_shown_beside_another_p():
    done = zbsolve("solve", ICLR, "--devices", 4, "--solver", "heuristic")
    assert done.exit_code == 0, done.output
    text = joined(done.stdout)
    assert "paper's bubble of" not in text and "0.0433" not in text
    assert "the paper's table is for p=8, m=24: its figures are not shown beside p=4, m=24" in text
    same = joined(zbsolve("solve", ICLR, "--devices", 8, "--solver", "heuristic").stdout)
    assert "paper's bubble of zb-2p (paper's table) 0.0433" in same


# -- point 3: units ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("profile, time, memory", [
    (ICLR, "us", "Table 1 units"),
    (ROOT / "problems" / "moe" / "deepseek-v3-stage.yaml", "ms", "GiB"),
    (None, "units of T_F", "units of M_B"),
])
def test_compare_names_the_units_its_profile_states(profile, time, memory):
    done = zbsolve("compare", "-p", 4, "-m", 8, *(("--profile", profile) if profile else ()), columns=WIDE)
    assert done.exit_code == 0, done.output
    text = joined(done.stdout)
    assert f"step time with barrier ({time})" in text and f"peak activations ({memory})" in text, done.stdout
    assert "makespan" not in text


@pytest.mark.parametrize("profile, time, memory", [
    (None, "units of T_F", "units of M_B"),
    (ICLR, "us", "Table 1 units"),
])
def test_one_document_is_in_one_unit_in_schedule_check_plot_and_solve(profile, time, memory, tmp_path,
                                                                       monkeypatch):
    """The document states its profile's units as a problem file does (``time_unit``, ``memory_unit``): ``check``
    and ``plot`` name them as ``schedule`` and ``solve`` did; a document that states none is in "profile's unit"."""
    import zbsolve.present.plot as plot_module

    given = ("--profile", profile) if profile else ()
    doc, solved = tmp_path / "s.json", tmp_path / "solved.json"
    shown = joined(zbsolve("schedule", "zb-h1", "-p", 4, "-m", 8, *given, "-o", doc, columns=WIDE).stdout)
    checked = joined(zbsolve("check", doc, columns=WIDE).stdout)
    for text in (shown, checked):
        assert f"step time with barrier ({time})" in text and f"peak activations ({memory})" in text, text
        assert "profile's unit" not in text
    drawn = []
    monkeypatch.setattr(plot_module, "save_figure", lambda figure, path: drawn.append(figure))
    assert zbsolve("plot", doc, "-o", tmp_path / "s.png").exit_code == 0
    assert drawn[0].axes[0].get_xlabel() == f"time ({time})"
    if profile is not None:  # solve takes a problem file (the unit profile has none)
        assert zbsolve("solve", profile, "--solver", "heuristic", "-o", solved, "-q").exit_code == 0
        assert f"step time with barrier ({time})" in joined(zbsolve("check", solved, columns=WIDE).stdout)
    data = json.loads(doc.read_text())
    doc.write_text(json.dumps({k: v for k, v in data.items() if not k.endswith("_unit")}))
    assert "step time with barrier (profile's unit)" in joined(zbsolve("check", doc, columns=WIDE).stdout)


def test_a_preset_s_device_memory_reads_in_gib_and_gb():
    """The h100 preset's 81,559 MiB (what the device reports): 79.65 GiB, 85.52 GB; the tour's 80GiB likewise."""
    preset = joined(zbsolve("solve", LLAMA, "-p", 8, "-m", 16, "--solver", "heuristic").stdout)
    assert "device memory 79.65 GiB (85.52 GB)" in preset and "device_memory_gib" not in preset
    given = joined(zbsolve("solve", LLAMA, "-p", 8, "-m", 16, "--solver", "heuristic", "--device-memory",
                           "80GiB").stdout)
    assert "device memory 80 GiB (85.9 GB)" in given


def test_a_chart_from_python_has_the_command_s_units():
    """A solve's result drawn as it is: seconds and GiB, as ``zbsolve solve --chart`` draws it, never raw bytes; a
    problem's timeline drawn with its units names them."""
    result = solve(LLAMA, num_devices=4, num_microbatches=8, solver="heuristic")
    gantt, panel = plot_timeline(result, memory=True).axes
    title = gantt.get_title(loc="left")
    assert f"peak activations {max(result.peak_memory) / GIB:.2f} GiB" in title and "profile's unit" not in title
    assert panel.get_xlabel() == "time (s)" and panel.get_ylabel() == "activation\nmemory (GiB)"
    timeline = simulate(make_schedule("zb-h1", UNIT, 4, 8))
    ax = plot_timeline(timeline, units=Units("us", "Table 1 units")).axes[0]
    assert ax.get_xlabel() == "time (us)" and "Table 1 units" in ax.get_title(loc="left")
    assert plot_timeline(timeline).axes[0].get_xlabel() == "time (profile's unit)"


def test_the_notebook_forms_name_figures_as_the_command_does():
    result = solve(LLAMA, num_devices=8, num_microbatches=16, solver="heuristic")
    html = result._repr_html_()
    assert "<th>step time with barrier (s)</th>" in html and "<th>paper&#x27;s bubble</th>" in html
    assert "bubble_rate" not in html and "device memory" in html


def test_run_names_the_plan_s_peak_with_its_unit():
    from zbsolve.present.run_report import memory_table, report_table

    row = {"rank": 0, "stages": [0], "pass_ms": {"F": 1.0}, "bubble": 0.1, "sim_bubble": 0.1,
           "sim_bubble_measured": 0.1, "makespan_ms": 10.0, "sim_makespan_ms": 9.0, "plan_makespan_ms": None,
           "peak_saved_mib": 1.0, "sim_peak_mib": 1.0, "sim_peak": 3185664.0, "plan_peak_mib": None,
           "grad_check": "passed"}
    units = Units("us", "Table 1 units")
    assert memory_table([row], units)[0][-1] == "3185664 (Table 1 units)"
    assert report_table([row], units)[0][-2] == "3185664 (Table 1 units)"
    assert "e+06" not in " ".join(report_table([row])[0])


# -- point 4: titles -----------------------------------------------------------------------------------------------

def test_a_solve_s_title_says_what_was_minimised_and_whose_schedule_was_kept():
    """The warm start kept by CP-SAT and proven optimal: no "cpsat, optimal; the schedule is zb-h1's"."""
    result = solve(Problem.load(ICLR).profile, num_devices=4, num_microbatches=24, mem_factor=1.0, time_limit=10)
    maker = result.schedule.name
    assert result.status == "optimal" and maker != "cpsat"
    assert result.title("1.5b") == (f"1.5b: the step time with barrier minimised by cpsat; the schedule kept is "
                                    f"{maker}'s (cpsat found none shorter), proven optimal")


def test_a_solve_chart_is_titled_so(tmp_path):
    chart = tmp_path / "c.svg"
    done = zbsolve("solve", ICLR, "-p", 4, "--time-limit", 10, "--chart", chart, "-q")
    assert done.exit_code == 0, done.output
    text = chart.read_text()  # the SVG names each text in a comment
    assert ("1.5b-p8-m24: the step time with barrier minimised by cpsat; the schedule kept is zb-h1's (cpsat found "
            "none shorter), proven optimal") in text and "the schedule is" not in text
    assert "time (us)" in text and "Table 1 units" in text


def test_the_frontier_chart_says_the_plan_recomputes():
    points = [MemoryPoint(48 * GIB, 9.0, "interleaved x2, recompute per-stage:2,1", None, None, 10.0,
                          "per-stage:2,1"),
              MemoryPoint(64 * GIB, 8.0, "interleaved x2, recompute full", None, None, 9.0, "full"),
              MemoryPoint(80 * GIB, 7.0, "vshape x2, recompute none", None, 7.5, 8.0, "none")]
    assert recomputes(points) == "the plan recomputes: per-stage at 48 GiB; full at 64 GiB; none at 80 GiB"
    title = plot_memory_frontier(points, [], "llama3-70b").axes[0].get_title()
    assert title == "llama3-70b\nthe plan recomputes: per-stage at 48 GiB; full at 64 GiB; none at 80 GiB"


def small_model() -> Model:
    def layer(name: str, t: float, block: bool = True) -> Layer:
        return Layer(name=name, block=block, t_f=t, t_b=t, t_w=t, mem_f=2**26, mem_b=-2**25, mem_w=-2**25,
                     static_bytes=2**30, out_bytes=2**20)
    return Model(name="small", layers=[layer("tok_embeddings", 0.01, False), *(layer(f"layers.{i}", 1.0)
                                                                                for i in range(6)),
                                       layer("norm", 0.01, False), layer("output", 2.0, False)])


def test_a_plan_s_title_says_it_recomputes_and_whose_schedule_it_is():
    from zbsolve.planning.planner import plan

    with cf.ThreadPoolExecutor(1) as pool:  # candidates timed in this process: a worker's start costs more
        result = plan(small_model(), num_devices=2, num_microbatches=4, device_memory="16GiB", recompute="full",
                      time_limit=5, executor=pool, placement="sequential")
    title = result.title()
    assert title.startswith("small: plan for the step time with barrier: sequential x1, recompute full, partition")
    assert "source" not in title and "the schedule kept is" in title


# -- point 5: widths -----------------------------------------------------------------------------------------------

def test_megatron_rows_without_a_figure_are_one_line_each_under_the_table():
    rows = [{"split": "megatron", "recompute": "none", "schedule": name, "step_time": None, "bubble": None,
             "max GiB": None, "fits": False, "recomputed": None,
             "note": f"num_stages = {stages} does not divide Megatron's 34 layers"}
            for name, stages in (("GPipe", 8), ("1F1B", 8), ("Interleaved1F1B", 16), ("ZBVZeroBubble", 16))]
    rows.append({"split": "uniform", "recompute": "full", "schedule": "1F1B", "step_time": 9.7, "bubble": 0.35,
                 "max GiB": 29.1, "fits": True, "recomputed": "4*8", "note": ""})
    from rich.console import Console

    console = Console(width=WIDTH, record=True)
    console.print(baselines_table(rows, "baselines"))
    text = console.export_text()
    assert text.count("does not divide") == 2 and fits(text)
    assert "no figure for megatron GPipe, 1F1B: num_stages = 8" in text
    assert "full (4*8)" in text
    console = Console(width=WIDE, record=True)
    console.print(baselines_table(rows, "baselines"))
    assert "step time with barrier (s)" in console.export_text()


def test_plan_fits_100_columns_and_wide_prints_every_column(tmp_path):
    path = tmp_path / "small.yaml"
    small_model().save(path)
    args = ("plan", path, "-p", 2, "-m", 4, "--device-memory", "16GiB", "--placement", "sequential",
            "--time-limit", 5, "--jobs", 1)
    done = zbsolve(*args)
    assert done.exit_code == 0, done.output
    assert fits(done.stdout) and "baselines on the same costs" in done.stdout
    assert "note" not in done.stdout.split("baselines on the same costs")[1]
    whole = zbsolve(*args, "--wide")
    assert whole.exit_code == 0 and "note" in whole.stdout.split("baselines on the same costs")[1]


def test_run_fits_100_columns(tmp_path):
    doc = tmp_path / "s.json"
    assert zbsolve("schedule", "1f1b", "-p", 2, "-m", 2, "-o", doc, "-q").exit_code == 0
    done = zbsolve("run", doc, "--model", "gpt", "--hidden", 16, "--seq-len", 8, "--steps", 1, "--timeout", 30)
    assert done.exit_code == 0, done.output
    text = joined(done.stdout)
    assert fits(done.stdout) and "peak memory per rank" in text and "step (makespan): measured" in text
    assert "e+0" not in done.stdout


@pytest.mark.parametrize("args", [
    ("solve", VSHAPE, "--placement", "vshape", "--mem-factor", 1, "--solver", "heuristic"),
    ("compare", "-p", 8, "-m", 24, "--profile", ICLR),
    ("estimate", ROOT / "problems" / "models" / "configs" / "llama3-8b.json", "--seq-len", 8192, "-b", 1),
])
def test_tables_fit_100_columns(args, tmp_path):
    if args[0] == "estimate":
        args = (*args, "-o", tmp_path / "m.yaml")
    done = zbsolve(*args)
    assert done.exit_code == 0, done.output
    tables = [line for line in done.stdout.splitlines() if line[:1] in "┏┃┡│└" or not line.strip()]
    assert tables and fits("\n".join(tables))


def test_estimate_help_reads_at_80_columns():
    """No option name cut, three lines an option (its help and default) on average, none over five."""
    done = zbsolve("estimate", "--help", columns=80)
    assert done.exit_code == 0 and "…" not in done.stdout and "--no-flash-attention" in done.stdout
    options = done.stdout.split("Options")[1].splitlines()[1:-1]
    starts = [i for i, line in enumerate(options) if line[1:].lstrip(" *").startswith("--")]
    heights = [b - a for a, b in zip(starts, [*starts[1:], len(options)])]
    assert max(heights) <= 5 and sum(heights) <= 3 * len(heights), done.stdout


def test_estimate_keeps_its_flash_attention_flag(tmp_path):
    config = ROOT / "problems" / "models" / "configs" / "llama3-8b.json"
    both = zbsolve("estimate", config, "--seq-len", 1024, "-b", 1, "--flash-attention", "--no-flash-attention",
                   "-o", tmp_path / "a.yaml")
    assert both.exit_code == 2 and "give one" in both.stderr
    eager = zbsolve("estimate", config, "--seq-len", 1024, "-b", 1, "--no-flash-attention", "-o", tmp_path / "b.yaml",
                    "-q")
    flash = zbsolve("estimate", config, "--seq-len", 1024, "-b", 1, "--flash-attention", "-o", tmp_path / "c.yaml",
                    "-q")
    assert eager.exit_code == flash.exit_code == 0
    assert "--no-flash-attention" in (tmp_path / "b.yaml").read_text()
    assert (tmp_path / "b.yaml").read_text() != (tmp_path / "c.yaml").read_text()


def test_grid_says_it_wrote_its_summary(tmp_path):
    results, summary = tmp_path / "r.jsonl", tmp_path / "r.csv"
    done = zbsolve("grid", ROOT / "problems" / "grids" / "smoke.yaml", "-o", results, "--summary", summary,
                   "--jobs", 2)
    assert done.exit_code == 0, done.output
    assert f"results in {results}, summary in {summary}" in joined(done.stdout) and summary.exists()


def test_shown_keeps_each_figure_once():
    figures = {"objective": "makespan", "value": 5.0, "lower_bound": 4.0, "step_time": 5.0, "makespan": 5.0,
               "bound_met": False, "device_memory_gib": 80e9 / GIB}
    assert shown(figures, Units("s")) == {"minimised": "step time with barrier", "step time with barrier (s)": 5.0,
                                          "lower bound (s)": 4.0, "device memory": "74.51 GiB (80 GB)"}
    spanned = shown({**figures, "objective": "span"}, Units("us"))
    assert spanned["minimised"] == "longest span" and spanned["longest span (us)"] == 5.0
    assert spanned["step time with barrier (us)"] == 5.0
