"""Where jobs run: a pool of spawned local processes that an interrupted run can stop mid-job and that never
outlive their parent, or a Dask cluster (``dask://HOST:PORT``)."""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
import signal
import threading
import time
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any, Callable

from zbsolve.errors import InputError

Release = Callable[[bool], None]
"""Releases an executor; called with whether every job finished."""


class _RecordingSpawnContext:
    """The spawn context, adding every process it creates to ``created``."""

    def __init__(self, created: list[BaseProcess]) -> None:
        self.created = created
        self.spawn = multiprocessing.get_context("spawn")

    def Process(self, *args: Any, **kwargs: Any) -> BaseProcess:
        """A spawn process, recorded before it starts."""
        process = self.spawn.Process(*args, **kwargs)
        self.created.append(process)
        return process

    def __getattr__(self, name: str) -> Any:
        return getattr(self.spawn, name)


WATCH_SECONDS = 0.5
"""How often a worker checks that its parent is alive."""


def watch_parent(parent: int) -> None:
    """Run in each worker as it starts: ignore Ctrl-C (the parent stops its workers), and watch in a thread
    that the parent process ``parent`` is alive; once it is gone, however it died, kill this worker's own child
    processes (a CBC solve) and the worker itself."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(WATCH_SECONDS)
        for pid in _children():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="watch-parent", daemon=True).start()


def _children() -> list[int]:
    """This process's child processes (from /proc; none where there is no /proc)."""
    pids = []
    for path in Path("/proc/self/task").glob("*/children"):
        try:
            pids += [int(pid) for pid in path.read_text().split()]
        except OSError:
            continue
    return pids


class ProcessPool(cf.ProcessPoolExecutor):
    """Spawned worker processes, one job at a time each, that keeps its workers at hand to stop them; each
    worker kills itself within ``WATCH_SECONDS`` of its parent's death, even a ``kill -KILL``."""

    def __init__(self, max_workers: int) -> None:
        self.workers: list[BaseProcess] = []
        """Every worker process the pool has started."""
        super().__init__(max_workers=max_workers, mp_context=_RecordingSpawnContext(self.workers),
                         initializer=watch_parent, initargs=(os.getpid(),))


def shutdown_pool(pool: ProcessPool, finished: bool) -> None:
    """Shut the pool down; when interrupted, stop the jobs still running instead of waiting for them."""
    pool.shutdown(wait=finished, cancel_futures=True)
    if not finished:
        for process in pool.workers:
            if process.is_alive():
                process.terminate()


def make_executor(spec: str | cf.Executor | None, jobs: int) -> tuple[cf.Executor, Release]:
    """An executor from ``None`` or ``"local"`` (``jobs`` local processes), ``dask://HOST:PORT`` or an Executor,
    and how to release it."""
    if isinstance(spec, cf.Executor):
        return spec, lambda finished: None
    if spec is None or spec == "local":
        pool = ProcessPool(jobs)
        return pool, lambda finished: shutdown_pool(pool, finished)
    if isinstance(spec, str) and spec.startswith("dask://"):
        try:
            from distributed import Client
        except ImportError:
            raise InputError("executor = dask://...: install the dask extra (pip install 'zbsolve[dask]')") from None
        try:
            client = Client(spec.removeprefix("dask://"), timeout=30)
        except OSError as exc:
            raise InputError(f"executor = {spec!r}: cannot reach the Dask scheduler ({exc})") from None
        return client.get_executor(), lambda finished: client.close()
    raise InputError(f"executor = {spec!r}: use 'local', 'dask://HOST:PORT' or a concurrent.futures.Executor")
