"""Bad input, through the command line and the Python API: one ``InputError`` line naming the file, the field
and the value (exit 2), an invalid schedule exits 1, output paths are checked before the work, and no output file
is ever left half-written. The last tests mutate valid problem files, grid files and schedule documents and run
the commands on them in-process."""

from __future__ import annotations

import copy
import importlib
import json
import math
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import ICLR, ROOT, failed_cleanly, zbsolve
from zbsolve.app.grid import Grid, expand
from zbsolve.io.document import from_document, load_document, read_document, to_document
from zbsolve import InfeasibleError, InputError, Model, ScheduleError, ZbsolveError
from zbsolve.io.torch_csv import checked_csv, torch_csv
from zbsolve.optimize.result import SolveResult
from zbsolve.optimize.solve import solve_request
from zbsolve.problem.costs import check_fits
from zbsolve.problem.request import Request
from zbsolve.problem.problem_file import load_input
from zbsolve.schedulers.families import make_schedule
from zbsolve.problem.problem_file import Problem
from zbsolve.base.inputs import load_mapping
from zbsolve.core.profile import UNIT, Profile
from zbsolve.core.simulator import simulate

DOCUMENT = json.loads(json.dumps(to_document(simulate(make_schedule("zb-h1", UNIT, 4, 8)))))
"""The document ``zbsolve schedule zb-h1 -p 4 -m 8 -o x.json`` writes."""
SMOKE = ROOT / "problems" / "grids" / "smoke.yaml"


def write_doc(path: Path, edit) -> Path:
    """The zb-h1 document after ``edit`` (a function of the document, returning nothing or a new document)."""
    doc = copy.deepcopy(DOCUMENT)
    doc = edit(doc) or doc
    path.write_text(json.dumps(doc))
    return path


# -- files that are not UTF-8 text ----------------------------------------------------------------------------
def test_non_utf8_problem(tmp_path):
    path = tmp_path / "l.yaml"
    path.write_bytes(b"num_devices: 4\nname: caf\xe9\n")
    line = failed_cleanly(zbsolve("solve", path), 2)
    assert line == f"error: {path} is not UTF-8 text: byte 0xe9 at offset 24 (a binary file?)"
    with pytest.raises(InputError, match="not UTF-8 text"):
        Problem.load(path)


@pytest.mark.parametrize("command", [("check",), ("plot", "-o", "x.png"), ("export", "-o", "x.csv"),
                                     ("schedule", "1f1b", "-p", 2, "-m", 2, "--profile")])
def test_binary_files(tmp_path, monkeypatch, command):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "blob.json"
    path.write_bytes(bytes(range(256)))
    args = (*command, path) if command[0] == "schedule" else (command[0], path, *command[1:])
    assert "blob.json is not UTF-8 text: byte 0x80" in failed_cleanly(zbsolve(*args), 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blob.json"]


@pytest.mark.parametrize("text, needle", [
    ("t_f: [1, 2\n", "is not valid YAML: expected ',' or ']', but got '<stream end>' at line 2, column 1"),
    ("when: 2001-13-45\n", "is not valid YAML: month must be in 1..12"),
    ("- 1\n", "must hold a mapping at the top level, got list"),
])
def test_unreadable_yaml(tmp_path, text, needle):
    path = tmp_path / "p.yaml"
    path.write_text(text)
    with pytest.raises(InputError, match=f"^{path}") as exc:
        load_mapping(path)
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_yaml_reads_exponents_as_numbers(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("num_devices: 4\nnum_microbatches: 8\nmem_limit: 1e9\n")
    assert Problem.load(path).mem_limit == 1e9


# -- zbsolve check: impossible documents are bad input ------------------------------------------------------
@pytest.mark.parametrize("edit, message", [
    (lambda d: d["devices"][0][2].update(start=9.0, end=3.0), "devices.0.2: start = 9.0 is after end = 3.0"),
    (lambda d: d["devices"][0][2].update(start=math.nan), "devices.0.2.start = nan: should be a finite number"),
    (lambda d: d["devices"][1][0].update(end=math.inf), "devices.1.0.end = inf: should be a finite number"),
    (lambda d: d["devices"][0][3].update(start=-0.5), "devices.0.3.start = -0.5: should be greater than or equal to 0"),
    (lambda d: d["devices"][0][1].update(mb="0"), "devices.0.1.mb = '0': should be a valid integer"),
    (lambda d: d.update(mem_limit=-1), "mem_limit = -1: should be greater than or equal to 0"),
    (lambda d: d.update(mem_limit=[1, 2, math.nan, 4]), "mem_limit.2 = nan: should be a finite number"),
    (lambda d: d.pop("profile") and None, "profile is missing"),
    (lambda d: [d], "the top level is a list, not a schedule document (a JSON object)"),
    (lambda d: d["profile"].update(t_f="fast"),
     "profile.t_f = 'fast': should be a number or a non-empty list of numbers"),
    (lambda d: d["profile"].update(t_b=[1, 1, math.nan, 1]),
     "profile: t_b[2] = nan must be a positive finite duration"),
    (lambda d: d.update(num_devices=True), "num_devices = True: should be a valid integer"),
    (lambda d: d["devices"][2].append({"kind": "X", "mb": 0, "stage": 0}),
     "devices.2.24.kind = 'X': should be one of 'F', 'B', 'W', 'BW', 'F&B'"),
    (lambda d: d["devices"][2][5].pop("kind") and None, "devices.2.5.kind is missing"),
    (lambda d: d["routes"][0].__setitem__(1, 9), "routes.0.1 = 9 is not a device (num_devices = 4)"),
])
def test_check_rejects_impossible_documents(tmp_path, edit, message):
    path = write_doc(tmp_path / "x.json", edit)
    assert failed_cleanly(zbsolve("check", path), 2) == f"error: {path}: {message}"


def test_missing_key_is_named_not_dumped(tmp_path):
    line = failed_cleanly(zbsolve("check", write_doc(tmp_path / "x.json", lambda d: d.pop("profile") and None)), 2)
    assert "devices" not in line and "zbsolve-schedule" not in line


def test_no_internal_names(tmp_path):
    for edit in (lambda d: [d], lambda d: d["devices"][0].__setitem__(0, 3), lambda d: d.update(profile=[])):
        line = failed_cleanly(zbsolve("check", write_doc(tmp_path / "x.json", edit)), 2)
        assert "_Document" not in line and "_Ref" not in line and "_PassDoc" not in line, line


def test_invalid_schedule_exits_1(tmp_path):
    path = write_doc(tmp_path / "x.json", lambda d: d.update(mem_limit=1))
    assert failed_cleanly(zbsolve("check", path), 1).startswith("invalid: device 0 position 1 (0F1): memory 2")
    path = write_doc(tmp_path / "x.json", lambda d: d.update(num_microbatches=10 ** 12))
    assert failed_cleanly(zbsolve("check", path), 1) == (f"invalid: {path}: num_microbatches = 1000000000000, but "
                                                         "the devices list only 96 passes (each microbatch needs 8 "
                                                         "or more)")


def test_markup_in_values_is_shown_as_is(tmp_path):
    path = write_doc(tmp_path / "x.json", lambda d: d["profile"].update(t_f="[/bold]"))
    assert "t_f = '[/bold]'" in failed_cleanly(zbsolve("check", path), 2)
    path = write_doc(tmp_path / "y.json", lambda d: d.update(name="[/red]"))
    result = zbsolve("check", path)
    assert result.exit_code == 0 and "[/red]" in result.stdout


# -- the Python API raises InputError only --------------------------------------------------------------------
@pytest.mark.parametrize("build, message", [
    (lambda: Profile(t_f=-1), "profile: t_f = -1.0 must be a positive finite duration"),
    (lambda: Profile(t_f="fast"), "profile: t_f = 'fast': should be a number or a non-empty list of numbers"),
    (lambda: Profile(t_comm=math.inf), "profile: t_comm = inf: should be a finite number"),
    (lambda: Profile(mem_f=True), "profile: mem_f = True: should be a number or a non-empty list of numbers"),
    (lambda: Profile.model_validate({"t_w": [1, -1]}), "profile: t_w[1] = -1.0 must be a positive finite duration"),
    (lambda: Profile.from_paper(T_F=-1, T_B=1, T_W=1), "profile: t_f = -1.0 must be a positive finite duration"),
    (lambda: Profile.from_paper(T_F=1, T_B=1, T_W=1, M_B="x"), "profile: M_B = 'x': should be a number"),
    (lambda: Problem(num_devices=4), "problem: num_microbatches is missing"),
    (lambda: Problem(num_devices="4", num_microbatches=8), "problem: num_devices = '4': should be a valid integer"),
    (lambda: Problem(num_devices=4, num_microbatches=8, mem_limit=-1), "problem: mem_limit = -1: should be greater"),
    (lambda: Problem(num_devices=4, num_microbatches=8, mem_factor=math.nan), "problem: mem_factor = nan: should"),
    (lambda: Problem(num_devices=4, num_microbatches=8, profile={"t_f": "x"}), "problem: profile.t_f = 'x'"),
    (lambda: from_document([]), "schedule document: the top level is a list"),
    (lambda: from_document({**DOCUMENT, "num_devices": 0}), "schedule document: num_devices = 0: should be greater"),
])
def test_python_api_raises_input_error(build, message):
    with pytest.raises(InputError) as exc:
        build()
    assert type(exc.value) is InputError and isinstance(exc.value, ValueError)
    assert str(exc.value).startswith(message) and "\n" not in str(exc.value)


def test_problem_file_errors_name_the_file(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("num_devices: 4\nnum_microbatches: 8\nprofile: {t_f: fast}\n")
    line = failed_cleanly(zbsolve("solve", path, "--solver", "heuristic"), 2)
    assert line == f"error: {path}: profile.t_f = 'fast': should be a number or a non-empty list of numbers"


# -- output paths are checked before the work -----------------------------------------------------------------
def test_schedule_output_is_a_directory(tmp_path):
    line = failed_cleanly(zbsolve("schedule", "zb-h1", "-p", 4, "-m", 8, "-o", tmp_path), 2)
    assert line == f"error: --output = {tmp_path} is a directory; give a file name"


@pytest.mark.parametrize("args, needle", [
    (("schedule", "no-such-family", "-p", 4, "-m", 8, "-o", "{tmp}/missing/x.json"), "--output = "),
    (("schedule", "no-such-family", "-p", 4, "-m", 8, "--chart", "{tmp}/x.txt"), "--chart = "),
    (("plot", "{tmp}/no-such-doc.json", "-o", "{tmp}/missing/x.png"), "--output = "),
    (("plot", "{tmp}/no-such-doc.json", "-o", "{tmp}/x.pdf"), "suffix '.pdf' is not one of .png, .svg"),
    (("export", "{tmp}/no-such-doc.json", "-o", "{tmp}/"), "--output = "),
    (("profile", "--stages", 2, "-o", "{tmp}/missing/p.yaml"), "--output = "),
])
def test_outputs_are_checked_first(tmp_path, args, needle):
    """The input is bad too (an unknown family, a missing document) or slow to use (profile): the output path's
    error comes first."""
    line = failed_cleanly(zbsolve(*(str(a).format(tmp=tmp_path) for a in args)), 2)
    assert needle in line, line


def test_unwritable_chart_is_one_line(tmp_path):
    doc = write_doc(tmp_path / "x.json", lambda d: None)
    result = zbsolve("plot", doc, "-o", "/proc/x.png")
    assert "/proc/x.png" in failed_cleanly(result, 2)


# -- no output may overwrite one of the command's inputs --------------------------------------------------------
def _input_files(tmp: Path) -> None:
    """One input file of each kind a command reads, in ``tmp``, and ``link.yaml``, a link to the problem."""
    (tmp / "p.yaml").write_text("num_devices: 2\nnum_microbatches: 4\n")
    (tmp / "prof.yaml").write_text("t_f: 1\nt_b: 1\nt_w: 1\n")
    (tmp / "m.yaml").write_text((ROOT / "problems" / "models" / "llama3-8b.yaml").read_text())
    (tmp / "c.json").write_text((ROOT / "problems" / "models" / "configs" / "llama3-8b.json").read_text())
    (tmp / "s.json").write_text(json.dumps(DOCUMENT))
    (tmp / "r.jsonl").write_text(json.dumps({"hash": "h", "config": {}}) + "\n")
    (tmp / "g.yaml").write_text(yaml.safe_dump({"problems": ["p.yaml"], "axes": {"solver": ["heuristic"],
                                                                                 "time_limit": [1]}}))
    (tmp / "link.yaml").symlink_to(tmp / "p.yaml")


@pytest.mark.parametrize("args, option, output", [
    (("schedule", "1f1b", "-p", 2, "-m", 2, "--profile", "prof.yaml", "-o", "prof.yaml"), "--output", "prof.yaml"),
    (("solve", "p.yaml", "--time-limit", 1, "-o", "p.yaml"), "--output", "p.yaml"),
    (("solve", "p.yaml", "--time-limit", 1, "-o", "link.yaml"), "--output", "link.yaml"),
    (("plan", "m.yaml", "-p", 2, "-m", 2, "--time-limit", 1, "-o", "m.yaml"), "--output", "m.yaml"),
    (("frontier", "p.yaml", "--factors", 1, "--time-limit", 1, "-j", 1, "-o", "p.yaml"), "--output", "p.yaml"),
    (("estimate", "c.json", "--seq-len", 16, "-b", 1, "-o", "c.json"), "--output", "c.json"),
    (("export", "s.json", "-o", "s.json"), "--output", "s.json"),
    (("summarize", "r.jsonl", "-o", "r.jsonl"), "--output", "r.jsonl"),
    (("grid", "g.yaml", "-o", "g.yaml"), "--output", "g.yaml"),
    (("grid", "g.yaml", "-o", "new.jsonl", "--summary", "p.yaml"), "--summary", "p.yaml"),
    (("grid", "g.yaml", "-o", "new.jsonl", "--summary", "new.jsonl"), "--summary", "new.jsonl"),
], ids=["schedule --profile", "solve", "solve, a link", "plan", "frontier", "estimate", "export", "summarize", "grid",
        "grid --summary on a problem", "grid --summary on the results"])
def test_no_output_overwrites_an_input(tmp_path, monkeypatch, args, option, output):
    """An output that is one of the command's inputs (its file, a file a grid names, the results a grid resumes
    from, a link to one) is refused before the work: every file is left as it was."""
    monkeypatch.chdir(tmp_path)
    _input_files(tmp_path)
    before = {path: path.read_bytes() for path in tmp_path.iterdir()}
    line = failed_cleanly(zbsolve(*args), 2)
    assert line.startswith(f"error: {option} = {output} is the input file") and line.endswith(
        ": writing it would overwrite the input; give another path"), line
    assert {path: path.read_bytes() for path in tmp_path.iterdir()} == before


# -- zbsolve run: more ranks than cores ---------------------------------------------------------------------
def test_oversubscription_warning(monkeypatch):
    from zbsolve.execute.executor import oversubscription
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert oversubscription(2, "cpu") is None and oversubscription(8, "cuda") is None
    assert oversubscription(8, "cpu") == ("8 ranks on 2 CPU cores: ranks wait for a core, so the measured times and "
                                          "bubbles are not comparable with the simulator's")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert oversubscription(8, "cpu") is None


def test_run_warns_before_running(tmp_path, monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    from zbsolve.execute.executor import oversubscription

    def checked(schedule, options, warn):  # run_schedule's inputs checked, its warning told, no rank started
        warn(oversubscription(schedule.num_devices, options.device))
        return []

    monkeypatch.setattr("zbsolve.execute.executor.run_schedule", checked)
    result = zbsolve("run", write_doc(tmp_path / "x.json", lambda d: None), "--json")
    assert result.exit_code == 0, result.output
    assert result.stderr.strip() == ("warning: 4 ranks on 2 CPU cores: ranks wait for a core, so the measured times "
                                     "and bubbles are not comparable with the simulator's")


# -- mutated files, every command: exit 0, 1 or 2, one line, no traceback, no half-written file ---------------
ODD = [None, True, False, "x", "0", "", "[/b]", 0, -1, 1, 3, 0.5, -2.5, math.nan, math.inf, -math.inf, 1e300,
       [], [1], ["x"], {}, {"a": 1}]
"""Values a field is retyped to (small integers only: a count of 10**30 is valid input that never ends)."""


def _children(node: object) -> list:
    return list(node) if isinstance(node, dict) else list(range(len(node))) if isinstance(node, list) else []


@st.composite
def mutated(draw, tree: object) -> object:
    """``tree`` with one to three fields dropped, duplicated, retyped, corrupted or truncated."""
    tree = copy.deepcopy(tree)
    for _ in range(draw(st.sampled_from([1, 1, 2, 3]))):
        parent, key, node = None, None, tree
        for _ in range(draw(st.sampled_from([4, 3, 2, 1]))):
            if not _children(node):
                break
            parent, key = node, draw(st.sampled_from(_children(node)))
            node = node[key]
        if parent is None:
            return copy.deepcopy(draw(st.sampled_from(ODD)))
        how = draw(st.sampled_from(["drop", "duplicate", "retype", "corrupt", "truncate"]))
        if how == "drop":
            del parent[key]
        elif how == "duplicate" and isinstance(parent, list):
            parent.insert(key, copy.deepcopy(node))
        elif how == "duplicate":
            parent[key] = copy.deepcopy(parent[draw(st.sampled_from(_children(parent)))])
        elif how == "retype":
            parent[key] = copy.deepcopy(draw(st.sampled_from(ODD)))
        elif how == "corrupt" and isinstance(node, (int, float)) and not isinstance(node, bool):
            parent[key] = draw(st.sampled_from([-node, 0, 2 * node, node + 0.5, math.nan, -math.inf]))
        elif how == "corrupt" and isinstance(node, str):
            parent[key] = draw(st.sampled_from([node + "\u00e9", node[::-1], node.upper(), node + "]"]))
        elif isinstance(node, (list, str)):
            parent[key] = node[:draw(st.integers(0, max(0, len(node) - 1)))]
        else:
            parent[key] = not node if isinstance(node, bool) else None
    return tree


@st.composite
def damaged(draw, text: bytes) -> bytes:
    """``text`` with its bytes truncated, replaced or inserted, or a line duplicated."""
    how = draw(st.sampled_from(["truncate", "replace", "insert", "line"]))
    at = draw(st.integers(0, len(text)))
    if how == "truncate":
        return text[:at]
    if how == "replace":
        return text[:at] + draw(st.sampled_from([b"\xff", b"\x00", b"{", b"]", b":", b"\n", b"-"])) + text[at + 1:]
    if how == "insert":
        return text[:at] + draw(st.binary(min_size=1, max_size=4)) + text[at:]
    lines = text.splitlines(keepends=True)
    i = draw(st.integers(0, max(0, len(lines) - 1)))
    return b"".join(lines[:i + 1] + lines[i:])


@st.composite
def variants(draw, tree: object, kind: str) -> bytes:
    """The file of ``tree`` (``kind`` "json" or "yaml"): mostly with fields mutated, else with bytes damaged."""
    if draw(st.integers(0, 3)):
        return _dump(draw(mutated(tree)), kind)
    return draw(damaged(_dump(tree, kind)))


def _dump(data: object, kind: str) -> bytes:
    return (json.dumps(data) if kind == "json" else yaml.safe_dump(data, sort_keys=False)).encode()


def _problems() -> list[dict]:
    """The paper's problems shrunk to 2 to 4 devices and 4 to 8 microbatches, so that a heuristic solve is fast."""
    shrunk = []
    for i, path in enumerate(ICLR):
        data = yaml.safe_load(path.read_text())
        shrunk.append({**data, "num_devices": 2 + i % 3, "num_microbatches": 4 + i % 5})
    return shrunk


def _grid() -> dict:
    """The smoke grid cut to one quick heuristic job."""
    grid = yaml.safe_load(SMOKE.read_text())
    return {**grid, "axes": {"stages": [2], "microbatches": [4], "mem_factor": [1.0], "solver": ["heuristic"],
                             "time_limit": [1]}}


def _line(label: str, exc: Exception) -> str:
    """The one line the command line prints for ``exc``: its label, then its message on one line."""
    return f"{label}: {' '.join(str(exc).split())}"


def _verdict(work: Callable[[], object]) -> tuple[int, str | None]:
    """The exit code and the stderr line the documented contract (the command line's docstring: 0 ok, 1 invalid
    schedule, infeasible problem or another failure, 2 bad input) gives for what the command does, done here through
    the Python API by ``work``: an ``InputError`` is 2 and "error: <its message>", a ``ScheduleError`` or an
    ``InfeasibleError`` 1 and "invalid: <its message>", another zbsolve error 1 and "error: <its message>", none
    0 and nothing on stderr."""
    try:
        work()
    except InputError as exc:
        return 2, _line("error", exc)
    except (ScheduleError, InfeasibleError) as exc:
        return 1, _line("invalid", exc)
    except ZbsolveError as exc:
        return 1, _line("error", exc)
    return 0, None


def _checked(doc: Path) -> None:
    """What ``zbsolve check`` does with a document, through the functions it calls: read it with its costs,
    simulate it, fit its memory."""
    loaded = load_document(doc, "zbsolve check")
    timeline = simulate(loaded.schedule)
    if loaded.costs is not None:
        check_fits(loaded.costs, timeline)


def _plotted(doc: Path) -> None:
    """What ``zbsolve plot`` needs of a document, through the functions it calls: read it with its costs, simulate
    it."""
    simulate(load_document(doc, "zbsolve plot").schedule)


Solves = list[tuple[Profile | Model, Request, object]]
"""Each call of ``solve_request`` a command made: its costs, its request and its outcome (a result or an error)."""


@contextmanager
def _solves_recorded() -> Iterator[Solves]:
    """Within the block, ``solve_request`` (the command line looks it up when it solves) records each call in the
    list it yields."""
    solves: Solves = []

    def recorded(costs: Profile | Model, request: Request, *args: Any, **kwargs: Any) -> SolveResult:
        try:
            result = solve_request(costs, request, *args, **kwargs)
        except Exception as exc:
            solves.append((costs, request, exc))
            raise
        solves.append((costs, request, result))
        return result

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(importlib.import_module("zbsolve.optimize.solve"), "solve_request", recorded)
        yield solves


def _solved(path: Path, solves: Solves) -> None:
    """``zbsolve solve <path> --solver heuristic --time-limit 2`` through the Python API, solved once: the problem
    file read with its own sizes, placement and limit into the one request ``solve`` makes of them (a file without
    sizes, a bare profile, needs --devices and --microbatches), which the command line must have solved as it is,
    once (``solves``); that solve's error is raised here."""
    given = load_input(path)
    if not isinstance(given, Problem):
        raise InputError(f"{path}: give --devices and --microbatches to solve a "
                         f"{'model' if isinstance(given, Model) else 'profile'}")
    request = Request(mem_limit=given.mem_limit, mem_factor=given.mem_factor, num_microbatches=given.num_microbatches,
                      num_devices=given.num_devices, placement=given.placement, solver="heuristic", time_limit=2)
    assert [(costs, asked) for costs, asked, _ in solves] == [(given.profile, request)], solves
    if isinstance(solves[0][2], Exception):
        raise solves[0][2]


def _assert_clean(result, folder: Path, expected: set[str], want: tuple[int, str | None]) -> None:
    """The one exit code ``want`` gives (see ``_verdict``) with its one line on stderr (nothing there on exit 0);
    never a traceback; nothing but ``expected`` in ``folder`` (temporary files included)."""
    code, line = want
    assert result.exit_code == code, (code, line, result.exit_code, result.output, result.exception)
    assert isinstance(result.exception, SystemExit if code else (SystemExit, type(None))), repr(result.exception)
    assert "Traceback" not in result.output
    assert result.stderr.strip().splitlines() == ([line] if code else []), (line, result.stderr)
    assert {p.name for p in folder.iterdir()} <= expected


SETTINGS = settings(deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow,
                                                                           HealthCheck.data_too_large])


@settings(SETTINGS, max_examples=60)
@given(st.data())
def test_check_mutated_documents(data):
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        doc = folder / "doc.json"
        doc.write_bytes(data.draw(variants(DOCUMENT, "json")))
        _assert_clean(zbsolve("check", doc), folder, {"doc.json"}, _verdict(lambda: _checked(doc)))


@settings(SETTINGS, max_examples=20)
@given(st.data())
def test_export_mutated_documents(data):
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        doc, out = folder / "doc.json", folder / "out.csv"
        doc.write_bytes(data.draw(variants(DOCUMENT, "json")))
        result = zbsolve("export", doc, "-o", out, "-q")
        _assert_clean(result, folder, {"doc.json", "out.csv"}, _verdict(lambda: checked_csv(read_document(doc)[0])))
        assert out.exists() == (result.exit_code == 0)
        if out.exists():
            assert out.read_text() == torch_csv(read_document(doc)[0])


@settings(SETTINGS, max_examples=12)
@given(st.data())
def test_plot_mutated_documents(data):
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        doc, out = folder / "doc.json", folder / "out.png"
        doc.write_bytes(data.draw(variants(DOCUMENT, "json")))
        result = zbsolve("plot", doc, "-o", out, "-q")
        _assert_clean(result, folder, {"doc.json", "out.png"}, _verdict(lambda: _plotted(doc)))
        assert out.exists() == (result.exit_code == 0)
        if out.exists():
            png = out.read_bytes()
            assert png.startswith(b"\x89PNG\r\n\x1a\n") and png.endswith(b"IEND\xaeB`\x82")


@settings(SETTINGS, max_examples=20)
@given(st.data())
def test_solve_mutated_problems(data):
    problem = data.draw(st.sampled_from(_problems()))
    kind = data.draw(st.sampled_from(["yaml", "json"]))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        path, out = folder / f"problem.{kind}", folder / "out.json"
        path.write_bytes(data.draw(variants(problem, kind)))
        with _solves_recorded() as solves:
            result = zbsolve("solve", path, "--solver", "heuristic", "--time-limit", 2, "-o", out, "-q")
        _assert_clean(result, folder, {path.name, "out.json"}, _verdict(lambda: _solved(path, solves)))
        assert out.exists() == (result.exit_code == 0)
        if out.exists():
            read_document(out)


@settings(SETTINGS, max_examples=5)
@given(st.data())
def test_grid_mutated_files(data):
    """A grid that does not load or expand is bad input, refused before any job runs (2, nothing written); one that
    does runs every job once, and exits 1 with one line counting the failed jobs its results file records, or 0."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        path, out = folder / "grid.yaml", folder / "out.jsonl"
        path.write_bytes(data.draw(variants(_grid(), "yaml")))
        jobs: list = []
        want = _verdict(lambda: jobs.extend(expand(Grid.load(path))))
        result = zbsolve("grid", path, "-o", out, "--jobs", 1, "-q")
        if want[0] != 2:
            records = [json.loads(line) for line in out.read_text().splitlines()]
            assert sorted(r["hash"] for r in records) == sorted(job.key for job in jobs)
            failures = sum(r.get("status") == "error" for r in records)
            want = (1, f"{len(jobs)} jobs: 0 already done, {len(jobs)} run, {failures} failed; results in {out}; "
                       "--retry-failed runs the failed jobs again") if failures else (0, None)
        _assert_clean(result, folder, {"grid.yaml", "out.jsonl"}, want)
        assert out.exists() == (want[0] != 2)


# -- one mutation each, its one answer worked out by hand -----------------------------------------------------
@pytest.mark.parametrize("command", ["check", "export", "plot"])
def test_a_retyped_document_field_is_bad_input_naming_it(tmp_path, command):
    """The zb-h1 document with num_devices = "four": every command that reads it exits 2 with the one line naming
    the file, the field and the value, and writes nothing."""
    doc = write_doc(tmp_path / "doc.json", lambda d: d.update(num_devices="four"))
    args = {"check": (), "export": ("-o", tmp_path / "out.csv"), "plot": ("-o", tmp_path / "out.png")}[command]
    line = failed_cleanly(zbsolve(command, doc, *args), 2)
    assert line == f"error: {doc}: num_devices = 'four': should be a valid integer"
    assert [p.name for p in tmp_path.iterdir()] == ["doc.json"]


def test_an_invalid_document_schedule_exits_1_in_every_command(tmp_path):
    """The zb-h1 document with a memory limit of 1 (it holds two microbatches on device 0 after its second F): a
    valid document of an invalid schedule, 1 in every command."""
    doc = write_doc(tmp_path / "doc.json", lambda d: d.update(mem_limit=1))
    for args in (("check", doc), ("export", doc, "-o", tmp_path / "out.csv"), ("plot", doc, "-o", tmp_path / "o.png")):
        assert failed_cleanly(zbsolve(*args), 1).startswith("invalid: device 0 position 1 (0F1): memory 2"), args
    assert [p.name for p in tmp_path.iterdir()] == ["doc.json"]


def test_a_retyped_problem_field_is_bad_input_naming_it(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_bytes(_dump({**_problems()[0], "num_microbatches": "x"}, "yaml"))
    line = failed_cleanly(zbsolve("solve", path, "--solver", "heuristic", "-o", tmp_path / "out.json", "-q"), 2)
    assert line == f"error: {path}: num_microbatches = 'x': should be a valid integer"
    assert [p.name for p in tmp_path.iterdir()] == ["p.yaml"]


def test_a_retyped_grid_axis_is_bad_input_naming_it(tmp_path):
    path = tmp_path / "g.yaml"
    grid = _grid()
    path.write_bytes(_dump({**grid, "axes": {**grid["axes"], "stages": ["two"]}}, "yaml"))
    line = failed_cleanly(zbsolve("grid", path, "-o", tmp_path / "out.jsonl", "--jobs", 1, "-q"), 2)
    assert line == f"error: {path}: axes.stages.0 = 'two': should be a valid integer"
    assert [p.name for p in tmp_path.iterdir()] == ["g.yaml"]


def test_seeds_are_valid():
    """Unmutated, the seeds of the mutations pass every command."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        doc = folder / "doc.json"
        doc.write_text(json.dumps(DOCUMENT))
        assert zbsolve("check", doc).exit_code == 0
        problem = folder / "p.yaml"
        problem.write_bytes(_dump(_problems()[0], "yaml"))
        assert zbsolve("solve", problem, "--solver", "heuristic", "-o", folder / "s.json", "-q").exit_code == 0
        grid = folder / "g.yaml"
        grid.write_bytes(_dump(_grid(), "yaml"))
        result = zbsolve("grid", grid, "-o", folder / "r.jsonl", "--jobs", 1, "-q")
        assert result.exit_code == 0, result.output
