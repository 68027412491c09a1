"""A command given a file of another kind says which kind it takes and which it was given (zbsolve.base.kinds): a
profile, a problem file, a model description, a schedule document, a grid file, a Hugging Face config.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import PROBLEMS, ROOT

import zbsolve
from zbsolve.app.cli import app
from zbsolve.app.grid import Grid
from zbsolve.base.errors import InputError
from zbsolve.base.inputs import load_mapping
from zbsolve.base.kinds import DOCUMENT, GRID, HF_CONFIG, KINDS, MODEL, PROBLEM, PROFILE, file_kind
from zbsolve.core.profile import UNIT, Profile
from zbsolve.core.simulator import simulate
from zbsolve.io.document import FORMAT, to_document
from zbsolve.costmodel.model import Model
from zbsolve.problem.problem_file import Problem
from zbsolve.schedulers.families import make_schedule

MODEL_FILE = "problems/models/llama3-8b.yaml"
PROBLEM_FILE = "problems/iclr/1.5b-p8-m24.yaml"
GRID_FILE = "problems/grids/smoke.yaml"
CONFIG_FILE = "problems/models/configs/llama3-8b.json"
TAKES = {PROFILE: "a profile (t_f, t_b, ...)", PROBLEM: "a problem file (num_devices, num_microbatches, profile)",
         MODEL: "a model description (layers)", DOCUMENT: "a schedule document (format: zbsolve-schedule)",
         GRID: "a grid file (axes, problems or models)", HF_CONFIG: "a Hugging Face config.json (model_type, "
                                                                   "hidden_size, ...)"}
USE = {PROFILE: "use zbsolve compare/schedule --profile or zbsolve solve for a profile",
       PROBLEM: "use zbsolve solve/frontier for a problem file", MODEL: "use zbsolve plan/solve for a model description",
       DOCUMENT: "use zbsolve check/plot/export/run for a schedule document", GRID: "use zbsolve grid for a grid file",
       HF_CONFIG: "use zbsolve estimate for a Hugging Face config.json, which writes a model description from it"}
SOLVE_TAKES = f"{TAKES[PROBLEM]}, {TAKES[MODEL]} or {TAKES[PROFILE]}"


def zbsolve_cli(*args: object):
    """The command line run in-process, from the repository root, on a terminal wide enough that no line wraps."""
    return CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "100000"})


def refused(result) -> str:
    """The one line of a command that exited 2, with no traceback."""
    assert result.exit_code == 2, (result.stdout, result.stderr, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.fixture
def files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """One file of every kind, by kind, their paths relative to the working directory (the repository root); a
    profile and a schedule document written into ``tmp_path``."""
    monkeypatch.chdir(ROOT)
    profile, document = tmp_path / "profile.yaml", tmp_path / "zb-h1.json"
    Profile.from_paper(T_F=[1, 1.2], T_B=1, T_W=1).save(profile)
    document.write_text(json.dumps(to_document(simulate(make_schedule("zb-h1", UNIT, 2, 4)))))
    return {PROFILE: profile, PROBLEM: Path(PROBLEM_FILE), MODEL: Path(MODEL_FILE), DOCUMENT: document,
            GRID: Path(GRID_FILE), HF_CONFIG: Path(CONFIG_FILE)}


def test_every_shipped_file_is_told_by_its_keys(files):
    shipped = {PROBLEM: [*PROBLEMS.glob("iclr/*.yaml"), *PROBLEMS.glob("vshape/*.yaml")],
               MODEL: [*PROBLEMS.glob("models/*.yaml"), *PROBLEMS.glob("measured/*/*.yaml")], GRID: list(PROBLEMS.glob("grids/*.yaml")),
               HF_CONFIG: list(PROBLEMS.glob("models/configs/*.json"))}
    for kind, paths in shipped.items():
        assert paths
        for path in paths:
            assert file_kind(load_mapping(path)) == kind, path
    for kind, path in files.items():
        data = json.loads(path.read_text()) if path.suffix == ".json" else load_mapping(path)
        assert file_kind(data) == kind, path
    assert file_kind({"name": "x"}) is None and file_kind([1]) is None
    # A profile under "profile:" alone (problems/moe/) is of no kind of its own: --profile takes it as it is.
    assert file_kind(load_mapping(PROBLEMS / "moe" / "deepseek-v3-stage.yaml")) is None


def test_a_kinds_keys_are_its_own_fields():
    """Each kind is told by keys its reader knows, so a file that has one is read as that kind and nothing else."""
    document = to_document(simulate(make_schedule("zb-h1", UNIT, 2, 4)))
    assert KINDS[DOCUMENT].keys <= set(document) and document["format"] == FORMAT
    assert KINDS[PROFILE].keys <= set(Profile.model_fields)
    assert KINDS[PROBLEM].keys <= set(Problem.model_fields)
    assert KINDS[MODEL].keys <= set(Model.model_fields)
    assert KINDS[GRID].keys <= set(Grid.model_fields)
    assert KINDS[HF_CONFIG].keys & set(load_mapping(ROOT / CONFIG_FILE))


# (command line, kind it takes, kind given, what the line says it takes)
CASES = [
    (["compare", "-p", "8", "-m", "24", "--profile", "{}"], "--profile", MODEL, TAKES[PROFILE]),
    (["schedule", "zb-h1", "-p", "4", "-m", "8", "--profile", "{}"], "--profile", HF_CONFIG, TAKES[PROFILE]),
    (["plan", "{}", "-p", "8", "-m", "24"], "zbsolve plan", PROBLEM, TAKES[MODEL]),
    (["plan", "{}", "-p", "8", "-m", "24"], "zbsolve plan", DOCUMENT, TAKES[MODEL]),
    (["solve", "{}"], "zbsolve solve", GRID, SOLVE_TAKES),
    (["solve", "{}", "-p", "8", "-m", "8"], "zbsolve solve", HF_CONFIG, SOLVE_TAKES),
    (["solve", "{}"], "zbsolve solve", DOCUMENT, SOLVE_TAKES),
    (["frontier", "{}"], "zbsolve frontier", MODEL, TAKES[PROBLEM]),
    (["grid", "{}", "-o", "{out}/r.jsonl"], "zbsolve grid", PROBLEM, TAKES[GRID]),
    (["estimate", "{}", "--seq-len", "8192", "--microbatch-size", "1", "-o", "{out}/m.yaml"], "zbsolve estimate",
     MODEL, TAKES[HF_CONFIG]),
    (["check", "{}"], "zbsolve check", PROBLEM, TAKES[DOCUMENT]),
    (["check", "{}"], "zbsolve check", HF_CONFIG, TAKES[DOCUMENT]),
    (["plot", "{}", "-o", "{out}/x.png"], "zbsolve plot", GRID, TAKES[DOCUMENT]),
    (["export", "{}", "-o", "{out}/x.csv"], "zbsolve export", MODEL, TAKES[DOCUMENT]),
    (["export", "{}", "-f", "megatron"], "zbsolve export", PROFILE, TAKES[DOCUMENT]),
    (["run", "{}", "--model", "gpt"], "zbsolve run", PROBLEM, TAKES[DOCUMENT]),
]


@pytest.mark.parametrize("args, taker, given, takes", CASES, ids=[f"{c[0][0]}-{c[2]}" for c in CASES])
def test_a_command_given_another_kind_of_file_says_which_it_takes(files, tmp_path, args, taker, given, takes):
    out = tmp_path / "out"
    out.mkdir()
    path = files[given]
    line = refused(zbsolve_cli(*(a.format(path, out=out) for a in args)))
    assert line == f"error: {path} is a {given}; {taker} takes {takes}: {USE[given]}"
    assert not any(out.iterdir())


def test_a_model_as_profile_and_a_problem_as_model_are_refused(files):
    line = refused(zbsolve_cli("compare", "--devices", "8", "--microbatches", "24", "--profile", MODEL_FILE))
    assert line == (f"error: {MODEL_FILE} is a model description; --profile takes a profile (t_f, t_b, ...): use "
                    "zbsolve plan/solve for a model description")
    line = refused(zbsolve_cli("plan", PROBLEM_FILE, "--devices", "8", "--microbatches", "24"))
    assert line == (f"error: {PROBLEM_FILE} is a problem file; zbsolve plan takes a model description (layers): use "
                    "zbsolve solve/frontier for a problem file")


def test_the_python_api_says_it_too(files):
    with pytest.raises(InputError, match=rf"^{PROBLEM_FILE} is a problem file; zbsolve.plan takes a model "
                                         r"description \(layers\)"):
        zbsolve.plan(PROBLEM_FILE, num_devices=8, num_microbatches=24)
    with pytest.raises(InputError, match=rf"^{GRID_FILE} is a grid file; zbsolve.solve takes a problem file"):
        zbsolve.solve(GRID_FILE, num_devices=2, num_microbatches=4)
    solved = zbsolve.solve(PROBLEM_FILE, time_limit=1)  # a problem file: its devices and microbatches as stated
    assert (solved.schedule.num_devices, solved.schedule.num_microbatches) == (8, 24)
    with pytest.raises(InputError, match=rf"^{MODEL_FILE} is a model description; Profile.load takes a profile"):
        Profile.load(MODEL_FILE)
    with pytest.raises(InputError, match=rf"^{MODEL_FILE} is a model description; zbsolve.export takes a schedule"):
        zbsolve.export(MODEL_FILE, "megatron")


def test_a_file_of_the_kind_taken_is_still_judged_field_by_field(files, tmp_path):
    """A file of no kind known is read as the kind taken, so its first bad key is named as before; a problem file's
    profile is still taken by --profile."""
    odd = tmp_path / "odd.yaml"
    odd.write_text("colour: red\n")
    assert refused(zbsolve_cli("compare", "-p", "2", "-m", "4", "--profile", odd)) == \
        f"error: {odd}: colour = 'red': unknown key"
    assert refused(zbsolve_cli("plan", odd, "-p", "2", "-m", "4")) == f"error: {odd}: layers is missing"
    assert refused(zbsolve_cli("check", odd)).startswith(f"error: {odd} is not valid JSON: ")
    typo = tmp_path / "typo.yaml"
    typo.write_text("t_f: 1\nt_bb: 2\n")
    assert refused(zbsolve_cli("compare", "-p", "2", "-m", "4", "--profile", typo)) == \
        f"error: {typo}: t_bb = 2: unknown key"
    done = zbsolve_cli("compare", "-p", "4", "-m", "8", "--profile", PROBLEM_FILE, "--json")
    assert done.exit_code == 0, done.output
