"""Grid solving: parallel, resumable, failure-tolerant, locked, checked before it runs, stoppable by a signal
without orphans, and on a local Dask cluster."""

import concurrent.futures as cf
import contextlib
import csv
import inspect
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import failed_cleanly, heavy_head, zbsolve
from zbsolve import InputError, simulate
from zbsolve.io.document import read_document
from zbsolve.base.checks import MAX_PASSES
from zbsolve.base import parallel
from zbsolve.app.grid import (
    Grid,
    Job,
    ResultsFile,
    expand,
    read_results,
    run_job,
    solve_grid,
    to_dataframe,
    write_summary,
)
from zbsolve.problem.memory_factor import reference_peak
from zbsolve.problem.problem_file import Problem

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


def _write_grid(tmp_path, axes, profile=None, problem="problems/iclr/1.5b-p8-m24.yaml"):
    path = tmp_path / "g.yaml"
    data = {"name": "t", "axes": axes}
    data.update({"profile": profile} if profile else {"problems": [os.path.abspath(problem)]})
    path.write_text(yaml.safe_dump(data))
    return path


def _grid_command(grid, out, *options):
    return [sys.executable, "-m", "zbsolve", "grid", str(grid), "-o", str(out), *map(str, options)]


def _words(text):
    """``text`` with its whitespace (and the line breaks of a narrow console) collapsed to single spaces."""
    return " ".join(text.split())


def _state(pid):
    """A process's state letter from /proc (Z: a zombie, dead but not reaped), or None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2]


def _read(path):
    """A /proc file's bytes; empty once its process is gone."""
    try:
        return Path(path).read_bytes()
    except OSError:
        return b""


def _threads(pid):
    """A process's number of threads; 0 once it is gone."""
    for line in _read(f"/proc/{pid}/status").splitlines():
        if line.startswith(b"Threads:"):
            return int(line.split()[1])
    return 0


def _children(pid):
    """The live processes whose parent is ``pid``, found by scanning /proc."""
    found = set()
    for path in Path("/proc").glob("[0-9]*/stat"):
        try:
            stat = path.read_text()
        except OSError:
            continue
        state, ppid = stat[stat.rindex(")") + 2:].split()[:2]
        if int(ppid) == pid and state != "Z":
            found.add(int(path.parent.name))
    return found


def _wait_until(condition, seconds):
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.1)
    return condition()


def _kill_all(pids):
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_failing_job_is_recorded_and_batch_goes_on(tmp_path):
    grid = _write_grid(tmp_path, {"stages": [2], "microbatches": [4], "mem_limit": [0.5, 4.0], "time_limit": [5]},
                       profile={"t_f": 1, "t_b": 1, "t_w": 1})
    out = tmp_path / "r.jsonl"
    run = zbsolve("grid", grid, "-o", out, "-j", "2", "-q")
    assert run.exit_code == 1, run.stderr
    records = {r["config"]["mem_limit"]: r for r in read_results(out)}
    assert records[0.5]["status"] == "error" and "InfeasibleError" in records[0.5]["error"]
    assert records[4.0]["status"] == "optimal"


def test_interrupt_keeps_finished_results_and_resumes(tmp_path):
    grid = _write_grid(tmp_path, {"mem_factor": [2.0], "solver": ["cpsat"], "time_limit": [1], "seed": [0, 1, 2, 3],
                                  "objective": ["span"]})
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


@pytest.mark.xdist_group("dask")
def test_dask_local_cluster_matches_local_run(tmp_path, dask_address):
    local = {r["hash"]: r for r in solve_grid(Grid.load(SMOKE), jobs=2)}
    remote = {r["hash"]: r for r in solve_grid(Grid.load(SMOKE), executor=dask_address, output=tmp_path / "r.jsonl")}
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
               objective="span", time_limit=time_limit, seed=0)


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
    assert re.findall(r"\._[A-Za-z]\w*", inspect.getsource(parallel)) == []


def test_workers_die_with_a_killed_grid(tmp_path):
    """kill -KILL of a grid while its workers run a 60 s CP-SAT search: no process it started survives it by
    more than a few seconds (each worker sees its parent gone and kills itself)."""
    grid = _write_grid(tmp_path, {"mem_factor": [2.0], "time_limit": [60], "seed": [0, 1], "objective": ["span"]},
                       problem="problems/iclr/14.6b-p16-m48.yaml")
    proc = subprocess.Popen(_grid_command(grid, tmp_path / "r.jsonl", "-j", 2, "-q"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    started = set()
    try:
        def solving():
            """Both workers are in a CP-SAT search: a third thread beside the main one and the parent watch."""
            started.update(_children(proc.pid))
            workers = [pid for pid in started if b"spawn_main" in _read(f"/proc/{pid}/cmdline")]
            return len(workers) == 2 and all(_threads(pid) >= 3 for pid in workers)

        assert _wait_until(solving, 60), "the workers never started solving"
        started.update(_children(proc.pid))
        proc.kill()
        proc.wait(timeout=10)
        assert _wait_until(lambda: all(_state(pid) in (None, "Z") for pid in started), 10), \
            {pid: _state(pid) for pid in started}
    finally:
        proc.kill()
        _kill_all(pid for pid in started if _state(pid) not in (None, "Z"))


def test_sigterm_keeps_results_and_writes_the_summary(tmp_path):
    grid = _write_grid(tmp_path, {"mem_factor": [2.0], "time_limit": [2, 60], "objective": ["span"]})
    out, summary = tmp_path / "r.jsonl", tmp_path / "s.csv"
    proc = subprocess.Popen(_grid_command(grid, out, "-j", 1, "--summary", summary), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    workers = set()
    try:
        assert _wait_until(lambda: out.exists() and out.read_text().count("\n") >= 1, 60)
        workers = _children(proc.pid)
        proc.terminate()
        _, stderr = proc.communicate(timeout=30)
        assert _wait_until(lambda: all(_state(pid) in (None, "Z") for pid in workers), 10)
    finally:
        proc.kill()
        _kill_all(pid for pid in workers if _state(pid) not in (None, "Z"))
    assert proc.returncode == 143, stderr
    assert "interrupted by SIGTERM" in _words(stderr) and "resume" in stderr
    kept = read_results(out)
    assert len(kept) == 1 and kept[0]["config"]["time_limit"] == 2
    with open(summary) as f:
        assert [row["hash"] for row in csv.DictReader(f)] == [kept[0]["hash"]]


def test_rerun_exits_1_on_recorded_failures_and_retry_failed_reruns_only_them(tmp_path):
    grid = _write_grid(tmp_path, {"stages": [2], "microbatches": [4], "mem_limit": [4.0, 8.0], "time_limit": [5]},
                       profile={"t_f": 1, "t_b": 1, "t_w": 1})
    out = tmp_path / "r.jsonl"
    command = ("grid", grid, "-o", out, "-j", 1)
    first = list(solve_grid(Grid.load(grid), output=out))
    with open(out, "a") as f:
        f.write(json.dumps({**first[0], "status": "error", "error": "RuntimeError: a lost worker"}) + "\n")
    assert [r["status"] for r in read_results(out)] == ["error", "optimal"]

    rerun = zbsolve(*command)
    assert rerun.exit_code == 1 and "2 already done, 0 run, 1 failed" in _words(rerun.stderr), rerun.stderr
    assert out.read_text().count("\n") == 3

    retry = zbsolve(*command, "--retry-failed")
    assert retry.exit_code == 0 and "1 already done, 1 run, 0 failed" in _words(retry.stdout), retry.stderr
    lines = out.read_text().splitlines()
    assert len(lines) == 4 and json.loads(lines[-1])["hash"] == first[0]["hash"]
    assert [r["status"] for r in read_results(out)] == ["optimal", "optimal"]


def test_a_failed_future_becomes_a_failure_record(tmp_path):
    """A job whose executor fails it (a worker that died) is recorded as failed, and the batch goes on."""
    class Lost(cf.Executor):
        def submit(self, fn, *args, **kwargs):
            future = cf.Future()
            future.set_exception(RuntimeError("worker lost"))
            return future

    jobs = expand(Grid.load(SMOKE))[:2]
    records = list(solve_grid(jobs, executor=Lost(), output=tmp_path / "r.jsonl"))
    assert [r["status"] for r in records] == ["error", "error"]
    assert records[0]["error"] == "RuntimeError: worker lost"
    assert {r["hash"] for r in read_results(tmp_path / "r.jsonl")} == {j.key for j in jobs}


TWO_STAGES = {"t_f": [1, 2], "t_b": 1, "t_w": 1}


@pytest.mark.parametrize("axes, needle", [
    ({"solver": ["cpsat", "gurobi"]}, ["axes.solver.1", "'gurobi'", "'cpsat', 'cbc' or 'heuristic'"]),
    ({"placement": ["diagonal"]}, ["axes.placement.0", "'diagonal'"]),
    ({"mem_factor": [0]}, ["axes.mem_factor.0", "greater than 0"]),
    ({"mem_factor": [float("inf")]}, ["axes.mem_factor.0", "inf"]),
    ({"time_limit": [-1]}, ["axes.time_limit.0", "-1"]),
    ({"stages": [3]}, ["stages = 3", "2 stages"]),
    ({"placement": ["vshape"], "stages": [5]}, ["placement = vshape", "stages = 5"]),
])
def test_every_axis_value_is_checked_before_any_job(tmp_path, axes, needle):
    path = _write_grid(tmp_path, {"microbatches": [4], **axes}, profile=TWO_STAGES)
    with pytest.raises(InputError) as error:
        expand(Grid.load(path))
    message = str(error.value)
    assert message.startswith(str(path)) and "\n" not in message
    assert all(part in message for part in needle), message


def test_a_missing_problem_file_names_the_grid_file(tmp_path):
    path = _write_grid(tmp_path, {}, problem=str(tmp_path / "missing.yaml"))
    with pytest.raises(InputError, match=f"{re.escape(str(path))}: problems.0: cannot read .*missing.yaml"):
        expand(Grid.load(path))


@pytest.mark.parametrize("case", ["bad axis", "output is a folder", "summary folder missing"])
def test_bad_input_exits_2_before_any_job(tmp_path, case):
    grid = _write_grid(tmp_path, {"solver": ["gurobi"] if case == "bad axis" else ["heuristic"]})
    out = tmp_path / "r.jsonl"
    options = {"bad axis": [], "output is a folder": [], "summary folder missing": ["--summary", tmp_path / "no/s.csv"]}
    run = zbsolve("grid", grid, "-o", tmp_path if case == "output is a folder" else out, *options[case])
    assert failed_cleanly(run, 2).startswith("error:")
    assert {"bad axis": "gurobi", "output is a folder": "is a directory",
            "summary folder missing": "does not exist"}[case] in _words(run.stderr)
    assert not out.exists()


def test_a_memory_factor_on_a_chunk_profile_counts_its_merged_stages():
    """A V-shape problem of 2p per-chunk stages: the factor's unit is 1F1B's peak on the merged p-stage profile."""
    path = "problems/vshape/p16-m48.yaml"
    record = run_job(_job(path, "heuristic", 5).model_copy(update={"placement": "vshape", "mem_factor": 1.0}))
    assert record["status"] == "heuristic", record.get("error")
    problem = Problem.load(path)
    peak = reference_peak(problem.profile, problem.num_devices, problem.num_microbatches)
    assert record["mem_limit"] == pytest.approx(peak)


def test_a_grid_of_models_plans_each_setting(tmp_path):
    model = tmp_path / "heavy.yaml"
    heavy_head(blocks=6).save(model)
    grid = tmp_path / "plans.yaml"
    grid.write_text(yaml.safe_dump({"name": "plans", "models": [model.name], "axes": {
        "stages": [2], "microbatches": [4, 8], "device_memory": ["16GiB"], "placement": ["sequential"],
        "time_limit": [120]}}))  # a search this small ends long before: every baseline is timed, under any load
    jobs = expand(Grid.load(grid))
    assert [(j.num_devices, j.num_microbatches, j.device_memory, j.placement) for j in jobs] == \
        [(2, 4, 16 * 2**30, "sequential"), (2, 8, 16 * 2**30, "sequential")]
    out, summary = tmp_path / "r.jsonl", tmp_path / "s.csv"
    done = zbsolve("grid", grid, "-o", out, "-j", 1, "--summary", summary, "--schedules", tmp_path / "docs")
    assert done.exit_code == 0, done.stderr
    records = read_results(out)
    assert sorted(r["config"]["num_microbatches"] for r in records) == [4, 8]
    for record in records:
        assert record["status"] == "planned" and record["config"]["problem"] == "heavy"
        assert record["figures"]["step_time"] >= record["figures"]["lower_bound"] > 0
        # six built-ins on three splits, and on two of them with every block recomputed
        assert [b["recompute"] for b in record["baselines"]].count("none") == 18
        assert [b["recompute"] for b in record["baselines"]].count("full") == 12
        check = zbsolve("check", record["schedule"], "-q")
        assert check.exit_code == 0, check.stderr
    assert "step_time" in summary.read_text().splitlines()[0]


def test_a_grid_of_models_needs_devices_and_microbatches(tmp_path):
    model = tmp_path / "heavy.yaml"
    heavy_head(blocks=6).save(model)
    grid = tmp_path / "plans.yaml"
    grid.write_text(yaml.safe_dump({"models": [model.name], "axes": {"stages": [2]}}))
    with pytest.raises(InputError, match="axes.stages and axes.microbatches: required with models"):
        expand(Grid.load(grid))
    grid.write_text(yaml.safe_dump({"models": [model.name], "problems": ["x.yaml"]}))
    with pytest.raises(InputError, match="a grid plans models or solves problems, not both"):
        Grid.load(grid)


def test_a_grid_of_models_refuses_a_plan_over_the_size_limit_before_any_job(tmp_path):
    heavy_head(blocks=6).save(tmp_path / "heavy.yaml")
    grid = tmp_path / "plans.yaml"
    m = MAX_PASSES // (3 * 2) + 1
    grid.write_text(yaml.safe_dump({"models": ["heavy.yaml"], "axes": {"stages": [2], "microbatches": [m],
                                                                      "placement": ["sequential"]}}))
    with pytest.raises(InputError, match=f"^{re.escape(str(grid))}: model heavy with stages = 2, microbatches = {m}, "
                                         f"placement = sequential: 2 stages x {m} microbatches would be "):
        expand(Grid.load(grid))


def test_the_summary_writes_a_partition_whole_and_a_per_device_figure_as_its_largest(tmp_path):
    labels = ["tok_embeddings, layers.0-3", "layers.4-7, norm, output"]
    record = {"hash": "h", "config": {"problem": "llama3-8b", "num_devices": 8}, "status": "planned",
              "figures": {"partition": [2, 1, 1, 1, 5, 5, 5, 5], "memory_gib": [61.5, 70.25], "step_time": 1.5,
                          "device_layers": labels}}
    write_summary([record], tmp_path / "s.csv")
    with open(tmp_path / "s.csv", newline="") as f:
        (row,) = csv.DictReader(f)
    assert row["partition"] == "2,1,1,1,5,5,5,5"
    assert [int(x) for x in row["partition"].split(",")] == record["figures"]["partition"]
    assert float(row["memory_gib"]) == 70.25 and float(row["step_time"]) == 1.5
    assert row["device_layers"] == "tok_embeddings, layers.0-3; layers.4-7, norm, output"  # whole, devices told apart


@pytest.mark.parametrize("path", sorted((Path(__file__).resolve().parent.parent / "problems" / "grids").glob("*.yaml")),
                         ids=lambda p: p.stem)
def test_every_grid_file_expands(path):
    assert expand(Grid.load(path))
