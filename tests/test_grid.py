"""Grid solving: parallel, resumable, failure-tolerant, locked, and on a local Dask cluster."""

import contextlib
import inspect
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import yaml

from zbsolve import InputError, simulate
from zbsolve.document import read_document
from zbsolve.grid import Grid, Job, ResultsFile, executors, expand, read_results, solve_grid, to_dataframe
from zbsolve.problem import Problem

SMOKE = "problems/grids/smoke.yaml"


def _check_schedules(records):
    for r in records:
        assert r["status"] in ("optimal", "feasible", "heuristic"), r
        schedule, _ = read_document(r["schedule"])
        timeline = simulate(schedule)
        assert timeline.paper_bubble == pytest.approx(r["figures"]["paper_bubble"])


def test_smoke_grid_parallel_and_resume(tmp_path):
    out = tmp_path / "r.jsonl"
    records = list(solve_grid(Grid.load(SMOKE), jobs=2, output=out, schedules_dir=tmp_path / "s"))
    assert len(records) == 8 == len(read_results(out))
    assert len({r["hash"] for r in records}) == 8
    _check_schedules(records)
    assert list(solve_grid(Grid.load(SMOKE), jobs=2, output=out)) == []
    frame = to_dataframe(out)
    assert len(frame) == 8 and {"paper_bubble", "num_devices", "mem_factor"} <= set(frame.columns)


def test_truncated_last_line_is_dropped_and_rerun(tmp_path):
    out = tmp_path / "r.jsonl"
    records = list(solve_grid(Grid.load(SMOKE), jobs=1, output=out))
    lines = out.read_text().splitlines()
    out.write_text("\n".join(lines[:3]) + "\n" + lines[3][: len(lines[3]) // 2])
    assert len(read_results(out)) == 3
    again = list(solve_grid(Grid.load(SMOKE), jobs=2, output=out))
    assert len(again) == 5
    assert sorted(r["hash"] for r in read_results(out)) == sorted(r["hash"] for r in records)


def _write_grid(tmp_path, axes, profile=None):
    path = tmp_path / "g.yaml"
    data = {"name": "t", "axes": axes}
    data.update({"profile": profile} if profile else {"problems": [os.path.abspath("problems/iclr/1.5b-p8-m24.yaml")]})
    path.write_text(yaml.safe_dump(data))
    return path


def test_failing_job_is_recorded_and_batch_goes_on(tmp_path):
    grid = _write_grid(tmp_path, {"stages": [2], "microbatches": [4], "mem_limit": [0.5, 4.0], "time_limit": [5]},
                       profile={"t_f": 1, "t_b": 1, "t_w": 1})
    out = tmp_path / "r.jsonl"
    run = subprocess.run([sys.executable, "-m", "zbsolve", "grid", grid, "-o", out, "-j", "2", "-q"],
                         capture_output=True, text=True)
    assert run.returncode == 1, run.stderr
    records = {r["config"]["mem_limit"]: r for r in read_results(out)}
    assert records[0.5]["status"] == "error" and "InfeasibleError" in records[0.5]["error"]
    assert records[4.0]["status"] == "optimal"


def test_interrupt_keeps_finished_results_and_resumes(tmp_path):
    grid = _write_grid(tmp_path, {"mem_factor": [2.0], "solver": ["cpsat"], "time_limit": [3], "seed": [0, 1, 2, 3]})
    out = tmp_path / "r.jsonl"
    cmd = [sys.executable, "-m", "zbsolve", "grid", str(grid), "-o", str(out), "-j", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (out.exists() and out.read_text().count("\n") >= 1):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    kept = read_results(out)
    assert 1 <= len(kept) < 4, stderr
    assert proc.returncode == 130 and "resume" in stderr
    rerun = subprocess.run(cmd + ["-q"], capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 0, rerun.stderr
    final = read_results(out)
    assert len(final) == 4 and len({r["hash"] for r in final}) == 4
    assert [r["hash"] for r in final[: len(kept)]] == [r["hash"] for r in kept]


def test_second_run_on_same_file_is_refused(tmp_path):
    out = tmp_path / "r.jsonl"
    held = ResultsFile(out)
    try:
        with pytest.raises(InputError, match="in use by another grid run"):
            list(solve_grid(Grid.load(SMOKE), output=out))
    finally:
        held.close()


@pytest.mark.parametrize("text, needle", [
    ("axes: {stages: [2]}\nprofile: {t_f: 1}\ncolour: red\n", "colour"),
    ("axes: {stages: []}\nprofile: {t_f: 1}\n", "axes.stages"),
    ("axes: {stages: [two]}\nprofile: {t_f: 1}\n", "axes.stages.0"),
    ("axes: {stages: [2]}\n", "at least one problem"),
    ("axes: {stages: [2]}\nprofile: {t_f: 1}\n", "axes.microbatches"),
])
def test_bad_grid_files(tmp_path, text, needle):
    path = tmp_path / "g.yaml"
    path.write_text(text)
    with pytest.raises(InputError, match=needle.replace(".", r"\.")):
        expand(Grid.load(path))


def test_not_a_results_file(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({"a": 1}) + "\n" + json.dumps({"b": 2}) + "\n")
    with pytest.raises(InputError, match="not a zbsolve results file"):
        read_results(path)


def test_dask_local_cluster_matches_local_run(tmp_path):
    distributed = pytest.importorskip("distributed")
    local = {r["hash"]: r for r in solve_grid(Grid.load(SMOKE), jobs=2)}
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        remote = {r["hash"]: r for r in solve_grid(Grid.load(SMOKE), executor=f"dask://{cluster.scheduler_address}",
                                                   output=tmp_path / "r.jsonl")}
    assert remote.keys() == local.keys()
    for key, record in remote.items():
        assert record["status"] == local[key]["status"]
        assert record["figures"]["paper_bubble"] == pytest.approx(local[key]["figures"]["paper_bubble"])


def test_identical_jobs_run_once(tmp_path):
    grid = _write_grid(tmp_path, {"stages": [2], "microbatches": [4], "seed": [0, 0], "time_limit": [5]},
                       profile={"t_f": 1, "t_b": 1, "t_w": 1})
    jobs = expand(Grid.load(grid))
    assert len(jobs) == 2 and jobs[0].key == jobs[1].key
    records = list(solve_grid(jobs, output=tmp_path / "r.jsonl"))
    assert len(records) == 1 == len(read_results(tmp_path / "r.jsonl"))


def _job(path, solver, time_limit):
    prob = Problem.load(path)
    return Job(problem=prob.name, profile=prob.profile, num_devices=prob.num_devices,
               num_microbatches=prob.num_microbatches, placement="sequential", mem_factor=2.0, solver=solver,
               time_limit=time_limit, seed=0)


def test_stopping_early_terminates_the_running_jobs(tmp_path):
    """Leaving the loop early, as Ctrl-C does, kills the job still running (a two-minute CP-SAT search that
    does not prove optimality) instead of waiting for it; only the finished record is kept."""
    slow = _job("problems/iclr/14.6b-p16-m48.yaml", "cpsat", 120)
    quick = _job("problems/iclr/1.5b-p8-m24.yaml", "heuristic", 5)
    before = set(multiprocessing.active_children())
    out = tmp_path / "r.jsonl"
    began = time.monotonic()
    try:
        with contextlib.closing(solve_grid([slow, quick], jobs=2, output=out)) as records:
            assert next(records)["hash"] == quick.key
        stopped = time.monotonic()
        while set(multiprocessing.active_children()) - before and time.monotonic() < stopped + 10:
            time.sleep(0.1)
        assert not set(multiprocessing.active_children()) - before
        assert time.monotonic() - began < 60
    finally:
        for process in set(multiprocessing.active_children()) - before:
            process.terminate()
    assert [r["hash"] for r in read_results(out)] == [quick.key]


def test_executors_use_no_private_attribute():
    assert re.findall(r"\._[A-Za-z]\w*", inspect.getsource(executors)) == []
