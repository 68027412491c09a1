"""Interrupts of a plan and of the long commands' start-up, raised where each test chooses (a progress callback that
raises ``KeyboardInterrupt`` at a given log line, or a patched step), never by a signal sent after a delay: before
the search has timed a partition that fits nothing is planned (and nothing is said not to fit), after it the best
plan so far comes back and says it was interrupted, and an interrupt while a command starts is one line and exit
130, never a traceback."""

from __future__ import annotations

import concurrent.futures as cf
import importlib
import json
import re

import pytest
from typer.testing import CliRunner

from conftest import heavy_head
from zbsolve.app.cli import app
from zbsolve.core.simulator import simulate
from zbsolve.planning import planner, search
from zbsolve.planning.planner import plan

runner = CliRunner()


def interrupt_at(pattern: str) -> tuple[callable, list[str]]:
    """A progress callback that raises ``KeyboardInterrupt`` at the first log line matching ``pattern`` (once), and
    the lines it heard."""
    heard: list[str] = []

    def hear(line: str) -> None:
        heard.append(line)
        if re.search(pattern, line) and sum(bool(re.search(pattern, x)) for x in heard) == 1:
            raise KeyboardInterrupt
    return hear, heard


def never(*args, **kwargs):
    raise KeyboardInterrupt


@pytest.mark.parametrize("memory", ["16GiB", "4.1GiB"], ids=["fits", "does-not-fit"])
def test_an_interrupt_before_any_partition_is_timed_plans_nothing(memory, monkeypatch):
    """An interrupt while the search times its first partition (beside the split bounds), before any is timed: it
    propagates, both where a baseline fits (it was taken as the plan) and where nothing fits (it was "no partition
    ... fits")."""
    monkeypatch.setattr(search, "time_candidate", never)
    heard: list[str] = []
    with cf.ThreadPoolExecutor(1) as pool, pytest.raises(KeyboardInterrupt):
        plan(heavy_head(), num_devices=4, num_microbatches=8, device_memory=memory, reserve=0, placement="sequential",
             time_limit=10, executor=pool, progress=heard.append)
    assert not any("]: " in line for line in heard), heard  # no partition said timed


def test_an_interrupt_after_some_partitions_plans_the_best_so_far():
    hear, heard = interrupt_at(r"^sequential x1 .*\]: \S+s$")
    with cf.ThreadPoolExecutor(1) as pool:
        result = plan(heavy_head(), num_devices=4, num_microbatches=8, device_memory="16GiB", reserve=0,
                      placement="sequential", time_limit=10, executor=pool, progress=hear)
    assert result.interrupted and result.summary()["interrupted"] is True
    assert "interrupted: planning with the best partition found so far" in result.log.splitlines()
    assert result.candidates and simulate(result.timeline.schedule).makespan == result.step_time
    assert result.step_time <= min(c.step_time for c in result.candidates) * (1 + 1e-9)
    # the split bound was solved before the interrupt: it is kept, not lost as 0
    assert result.lower_bound is not None and 0 < result.lower_bound <= result.step_time


def test_an_interrupt_during_the_final_solves_keeps_their_best_and_says_so(monkeypatch):
    """No local search, so the final CP-SAT solves have the time left; the first one is interrupted once it has a
    schedule (its lower bound is logged after the warm start): the plan stops there, interrupted."""
    monkeypatch.setattr(planner, "local_search", lambda *args: None)
    hear, heard = interrupt_at(r"^lower bound: ")
    with cf.ThreadPoolExecutor(1) as pool:
        result = plan(heavy_head(), num_devices=4, num_microbatches=8, device_memory="16GiB", reserve=0,
                      placement="sequential", time_limit=30, executor=pool, progress=hear)
    assert any(line.startswith("lower bound: ") for line in heard), heard
    assert result.interrupted, result.log
    log = result.log.splitlines()
    assert "interrupted: the final solves stop here, with the best schedule found so far" in log
    assert sum(line.startswith("cpsat on ") for line in log) == 1, result.log
    assert simulate(result.timeline.schedule).makespan == result.step_time


@pytest.fixture
def heavy_file(tmp_path):
    path = tmp_path / "heavy.yaml"
    heavy_head().save(path)
    return path


def test_plan_command_interrupted_before_any_partition_says_nothing_was_planned(monkeypatch, heavy_file, tmp_path):
    out = tmp_path / "plan.json"
    monkeypatch.setattr(planner, "bounds", never)
    done = runner.invoke(app, ["plan", str(heavy_file), "-p", "4", "-m", "8", "--device-memory", "16GiB", "--jobs",
                               "1", "-o", str(out)])
    assert done.exit_code == 130, done.output
    assert done.output.strip().splitlines() == ["interrupted before the search timed a partition that fits: nothing "
                                                "planned yet, nothing written"]
    assert not out.exists()


def test_plan_command_interrupted_after_some_partitions_writes_the_best_and_says_so(monkeypatch, heavy_file,
                                                                                     tmp_path):
    out = tmp_path / "plan.json"
    monkeypatch.setattr(planner, "local_search", never)
    done = runner.invoke(app, ["plan", str(heavy_file), "-p", "4", "-m", "8", "--device-memory", "16GiB",
                               "--placement", "sequential", "--jobs", "1", "--time-limit", "20", "-q", "-o", str(out)])
    assert done.exit_code == 130, done.output
    line = " ".join(done.output.split())
    assert re.fullmatch(rf"interrupted: the best plan found so far is in {re.escape(str(out))} \(\d+ partitions "
                        r"timed\)", line), line
    doc = json.loads(out.read_text())
    assert doc["plan"]["interrupted"] is True
    assert runner.invoke(app, ["check", str(out), "-q"]).exit_code == 0


@pytest.mark.parametrize("command, args, said", [
    ("plan", ["{model}", "-p", "4", "-m", "8", "--device-memory", "16GiB", "-o", "{out}"],
     "interrupted: zbsolve plan stopped before it finished"),
    ("solve", ["problems/iclr/1.5b-p8-m24.yaml", "-o", "{out}"], "interrupted: zbsolve solve stopped before it "
                                                                 "finished"),
    ("frontier", ["problems/iclr/1.5b-p8-m24.yaml", "-o", "{out}"], "interrupted: zbsolve frontier stopped before "
                                                                    "it finished"),
    ("grid", ["problems/grids/smoke.yaml", "-o", "{out}"], "interrupted before any job ran: nothing written"),
])
def test_an_interrupt_while_a_long_command_starts_is_one_line_and_exit_130(monkeypatch, heavy_file, tmp_path,
                                                                           command, args, said):
    """The interrupt comes as the command checks where it will write (before its own interrupt handling began):
    one line, the interrupt's exit code, no traceback and not click's "Aborted!"."""
    from conftest import ROOT

    module = importlib.import_module(f"zbsolve.app.cli.{command}")
    monkeypatch.setattr(module, "check_output", never)
    monkeypatch.chdir(ROOT)
    out = tmp_path / "out.json"
    done = runner.invoke(app, [command, *(a.format(model=heavy_file, out=out) for a in args)])
    assert done.exit_code == 130, done.output
    assert done.output.strip().splitlines() == [said]
    assert not out.exists()


def test_an_interrupt_while_the_command_line_imports_is_one_line(monkeypatch, capsys):
    import builtins

    import zbsolve_cli as entry

    real_import = builtins.__import__

    def interrupted(name, *args, **kwargs):
        if name == "zbsolve.app.cli":
            raise KeyboardInterrupt
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", interrupted)
    with pytest.raises(SystemExit) as stopped:
        entry.main()
    assert stopped.value.code == 130
    assert capsys.readouterr().err == "interrupted: zbsolve stopped while starting\n"
