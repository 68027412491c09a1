"""Built-in launcher: one process per rank (``python -m zbsolve.execute.launch``), a file rendezvous
in a temporary directory.

When a rank fails or dies, every other rank is killed at once and the error names the rank;
ranks that never finish are killed at the deadline. Under torchrun, ``torchrun_rank`` gives this
process's place instead.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from zbsolve.base.errors import InputError, ZbsolveError

RankFn = Callable[[int, int, str, Any], Any]
"""(rank, world_size, init_method, payload) -> that rank's result; a module-level function (it is pickled)."""

_POLL_S = 0.05
_GRACE_S = 5.0
_TAIL = 2000


class LaunchError(ZbsolveError):
    """A rank failed, died, or did not finish in time."""


class RankPlace(NamedTuple):
    """Where this process sits in a torchrun job."""

    rank: int
    """Global rank."""
    local_rank: int
    """Rank on this machine (its GPU index)."""
    world_size: int
    """Number of ranks."""


def torchrun_rank() -> RankPlace | None:
    """This process's place when started by torchrun (RANK and WORLD_SIZE set), else None."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    rank = int(os.environ["RANK"])
    return RankPlace(rank, int(os.environ.get("LOCAL_RANK", rank)), int(os.environ["WORLD_SIZE"]))


def _worker(job: str, rank: int, result: str) -> None:
    """Entry point of a rank process: run the job's function and pickle its outcome to ``result``."""
    try:
        fn, world_size, init_method, payload = pickle.loads(Path(job).read_bytes())
        outcome = {"ok": fn(rank, world_size, init_method, payload)}
    except BaseException as exc:  # noqa: BLE001  (every failure goes back to the launcher)
        outcome = {"error": f"{type(exc).__name__}: {exc}", "input_error": isinstance(exc, InputError),
                   "traceback": traceback.format_exc(), "when": time.time()}
    Path(result).write_bytes(pickle.dumps(outcome))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1 if "error" in outcome else 0)


def _stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    end = time.monotonic() + _GRACE_S
    for proc in procs:
        try:
            proc.wait(max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _outcome(result: Path) -> dict | None:
    return pickle.loads(result.read_bytes()) if result.exists() else None


def _result(rank: int, result: Path) -> Any:
    """What rank ``rank`` returned, from its ``result`` file (it exited 0, so it wrote one)."""
    outcome = _outcome(result)
    if outcome is None:
        raise LaunchError(f"rank {rank} exited without reporting its result")
    return outcome["ok"]


def _failure(rank: int, proc: subprocess.Popen, result: Path, log: Path) -> ZbsolveError:
    outcome = _outcome(result)
    if outcome is not None and "error" in outcome:
        kind = InputError if outcome["input_error"] else LaunchError
        return kind(f"rank {rank}: {outcome['error']}")
    code = proc.returncode
    how = f"signal {-code}" if code < 0 else f"exit code {code}"
    tail = log.read_text(errors="replace")[-_TAIL:].strip() if log.exists() else ""
    return LaunchError(f"rank {rank} died ({how}) before reporting; the other ranks were stopped"
                       + (f"; its last output: {tail}" if tail else ""))


def _first_failed(procs: list[subprocess.Popen], results: list[Path]) -> int | None:
    """The failed rank to blame: one that died without reporting, else the one whose error came first."""
    failed = [r for r, proc in enumerate(procs) if proc.poll() not in (None, 0)]
    reported = {r: outcome for r in failed if (outcome := _outcome(results[r])) is not None and "error" in outcome}
    died = [r for r in failed if r not in reported]
    if died:
        return died[0]
    return min(reported, key=lambda r: reported[r]["when"]) if reported else None


def launch(fn: RankFn, world_size: int, payload: Any, *, deadline_s: float) -> list[Any]:
    """Run ``fn`` in ``world_size`` processes and return their results in rank order.

    The first rank that fails stops all the others and its error is raised (``InputError`` if the
    rank raised one, else ``LaunchError``); after ``deadline_s`` seconds every rank is killed.
    """
    if world_size < 1:
        raise InputError(f"world_size = {world_size} must be >= 1")
    with tempfile.TemporaryDirectory(prefix="zbsolve-launch-") as tmp:
        job = Path(tmp) / "job.pickle"
        job.write_bytes(pickle.dumps((fn, world_size, f"file://{Path(tmp) / 'rendezvous'}", payload)))
        results = [Path(tmp) / f"rank{r}.pickle" for r in range(world_size)]
        logs = [Path(tmp) / f"rank{r}.log" for r in range(world_size)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        procs: list[subprocess.Popen] = []
        try:
            for r in range(world_size):
                with open(logs[r], "wb") as log:
                    procs.append(subprocess.Popen(
                        [sys.executable, "-m", "zbsolve.execute.launch", str(job), str(r), str(results[r])],
                        env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
            end = time.monotonic() + deadline_s
            while any(proc.poll() is None for proc in procs):
                failed = _first_failed(procs, results)
                if failed is not None:
                    raise _failure(failed, procs[failed], results[failed], logs[failed])
                if time.monotonic() > end:
                    waiting = [r for r, proc in enumerate(procs) if proc.poll() is None]
                    raise LaunchError(f"ranks {waiting} did not finish within {deadline_s:g} s; all ranks were "
                                      "stopped")
                time.sleep(_POLL_S)
            failed = _first_failed(procs, results)
            if failed is not None:
                raise _failure(failed, procs[failed], results[failed], logs[failed])
            return [_result(r, path) for r, path in enumerate(results)]
        finally:
            _stop(procs)


if __name__ == "__main__":
    _worker(sys.argv[1], int(sys.argv[2]), sys.argv[3])
