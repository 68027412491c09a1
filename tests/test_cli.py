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
