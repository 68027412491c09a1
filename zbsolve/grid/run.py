"""Running a grid: each job solved in an executor, each record appended to the results file as it finishes."""

from __future__ import annotations

import concurrent.futures as cf
import time
from pathlib import Path
from typing import Iterable, Iterator

from zbsolve.errors import InputError, ZbsolveError
from zbsolve.grid.executors import make_executor
from zbsolve.grid.results import ResultsFile
from zbsolve.grid.spec import Grid, Job, expand
from zbsolve.limits import resolve_limit


def run_job(job: Job, schedules_dir: str | None = None) -> dict:
    """Solve one job with one solver thread; a failure becomes a record with its error, not an exception."""
    from zbsolve.solve import solve

    record: dict = {"hash": job.key, "config": job.model_dump(mode="json", exclude={"profile"}),
                    "profile": job.profile.model_dump()}
    began = time.monotonic()
    try:
        limit = resolve_limit(job.profile, job.num_devices, job.num_microbatches, job.mem_limit, job.mem_factor)
        result = solve(job.profile, limit, num_microbatches=job.num_microbatches, num_devices=job.num_devices,
                       placement=job.placement, solver=job.solver, time_limit=job.time_limit, workers=1,
                       seed=job.seed)
    except ZbsolveError as exc:
        record.update(status="error", error=f"{type(exc).__name__}: {exc}", solve_time=time.monotonic() - began)
        return record
    figures = result.summary()
    record.update(status=result.status, mem_limit=limit, figures={k: v for k, v in figures.items() if k != "status"},
                  solve_time=result.solve_time, schedule=None)
    if schedules_dir is not None:
        path = Path(schedules_dir) / f"{job.key}.json"
        result.to_json(path)
        record["schedule"] = str(path)
    return record


def solve_grid(grid: Grid | Iterable[Job], *, jobs: int = 1, executor: str | cf.Executor | None = None,
               output: str | Path | None = None, schedules_dir: str | Path | None = None) -> Iterator[dict]:
    """Run every job not yet in ``output``; yield each record as it finishes (and append it to ``output``).

    A job that fails is recorded with its error and the batch goes on. On KeyboardInterrupt (or when the
    caller stops iterating) the pending jobs are cancelled, the running ones on local processes are stopped,
    and every finished record stays in ``output``.
    """
    if jobs < 1:
        raise InputError(f"jobs = {jobs} must be >= 1")
    job_list = expand(grid) if isinstance(grid, Grid) else list(grid)
    results = ResultsFile(output) if output is not None else None
    if schedules_dir is not None:
        Path(schedules_dir).mkdir(parents=True, exist_ok=True)
    seen = set() if results is None else set(results.done)
    todo = []
    for job in job_list:
        if job.key not in seen:
            seen.add(job.key)
            todo.append(job)
    pool, release = make_executor(executor, jobs)
    futures = [pool.submit(run_job, job, None if schedules_dir is None else str(schedules_dir)) for job in todo]
    finished = False
    try:
        for future in cf.as_completed(futures):
            record = future.result()
            if results is not None:
                results.append(record)
            yield record
        finished = True
    finally:
        for future in futures:
            future.cancel()
        release(finished)
        if results is not None:
            results.close()
