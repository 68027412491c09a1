"""Where jobs run: a pool of local processes that an interrupted run can stop mid-job and that never outlive their
parent, or a Dask cluster (``dask://HOST:PORT``)."""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any, Callable, Literal, cast

from zbsolve.base.errors import InputError

Release = Callable[[bool], None]
"""Releases an executor; called with whether every job finished."""


def start_method() -> Literal["fork", "spawn"]:
    """How worker processes start: "fork" when the caller is a script run by its path and has no other thread, else
    "spawn". A spawned worker runs the caller's script again (as ``__mp_main__``), which breaks a script that calls
    ``zbsolve.plan`` without ``if __name__ == "__main__":``; a fork runs nothing again, and copies no other thread
    where there is none. Notebooks and ``python -m`` modules spawn."""
    main = sys.modules.get("__main__")
    script = getattr(main, "__spec__", None) is None and getattr(main, "__file__", None) is not None
    alone = threading.active_count() == 1
    return "fork" if script and alone and "fork" in multiprocessing.get_all_start_methods() else "spawn"


class _RecordingContext:
    """The context of ``start_method()``, adding every process it creates to ``created``."""

    def __init__(self, created: list[BaseProcess]) -> None:
        self.created = created
        fork = start_method() == "fork"
        self.context = multiprocessing.get_context("fork") if fork else multiprocessing.get_context("spawn")

    def Process(self, *args: Any, **kwargs: Any) -> BaseProcess:
        """A worker process, recorded before it starts."""
        process = self.context.Process(*args, **kwargs)
        self.created.append(process)
        return process

    def __getattr__(self, name: str) -> Any:
        return getattr(self.context, name)


WATCH_SECONDS = 0.5
"""How often a worker checks that its parent is alive."""


def watch_parent(parent: int) -> None:
    """Run in each worker as it starts: ignore Ctrl-C and end at once on SIGTERM (the parent stops its workers; a
    handler inherited from the parent would raise in them), and watch in a thread that the parent process ``parent``
    is alive; once it is gone, however it died, kill this worker's own child processes (a CBC solve) and the worker
    itself."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)

    def alive() -> bool:
        try:
            os.kill(parent, 0)
        except ProcessLookupError:
            return False
        return True

    def watch() -> None:
        while alive():
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


_PAUSES: list[Callable[[], AbstractContextManager[object]]] = []
"""What stops this process's own threads while a pool starts its workers (``paused_for_pools``)."""


@contextmanager
def paused_for_pools(pause: Callable[[], AbstractContextManager[object]]) -> Iterator[None]:
    """While inside, each ``ProcessPool`` starts its workers inside ``pause()``, which stops a thread of this
    process (a progress display's) until they are started: without other threads they fork (``start_method``),
    sharing what this process imported, rather than spawn, each importing it all again."""
    _PAUSES.append(pause)
    try:
        yield
    finally:
        _PAUSES.remove(pause)


class ProcessPool(cf.ProcessPoolExecutor):
    """Worker processes, one job at a time each, that keeps its workers at hand to stop them; each
    worker kills itself within ``WATCH_SECONDS`` of its parent's death, even a ``kill -KILL``. Forked workers
    start at once (inside the pauses of ``paused_for_pools``), spawned ones at the first jobs."""

    def __init__(self, max_workers: int) -> None:
        self.workers: list[BaseProcess] = []
        """Every worker process the pool has started."""
        with ExitStack() as paused:
            for pause in list(_PAUSES):
                paused.enter_context(pause())
            recording = _RecordingContext(self.workers)
            # Every attribute but Process forwards to the real context.
            super().__init__(max_workers=max_workers, mp_context=cast(BaseContext, recording),
                             initializer=watch_parent, initargs=(os.getpid(),))
            if recording.context.get_start_method() == "fork":
                self.submit(os.getpid)  # the first job forks every worker, then starts the pool's own thread


def shutdown_pool(pool: ProcessPool, finished: bool) -> None:
    """Shut the pool down; when interrupted, stop the jobs still running instead of waiting for them. Its thread is
    waited for (at once where its workers are stopped), so that a pool started after it may fork
    (``start_method``)."""
    if not finished:
        for process in pool.workers:
            if process.is_alive():
                process.terminate()
    pool.shutdown(wait=True, cancel_futures=True)


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
