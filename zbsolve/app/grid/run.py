"""Running a grid: each job solved in an executor, each record appended to the results file as it finishes."""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import time
from collections.abc import Generator, Iterable
from pathlib import Path

from zbsolve.app.grid.jobs import Grid, Job, PlanJob, expand
from zbsolve.app.grid.results import ResultsFile, skipped
from zbsolve.base.errors import InputError
from zbsolve.base.parallel import make_executor
from zbsolve.optimize.solve import solve_request
from zbsolve.planning.planner import plan


def _record(job: Job | PlanJob) -> dict:
    """The fields of every record of ``job``: its hash, config and profile (a plan job's model by name)."""
    if isinstance(job, PlanJob):
        return {"hash": job.key, "config": job.model_dump(mode="json", exclude={"model"})}
    return {"hash": job.key, "config": job.model_dump(mode="json", exclude={"profile"}),
            "profile": job.profile.model_dump()}


def _failure(job: Job | PlanJob, exc: Exception, solve_time: float | None) -> dict:
    """The record of a job that failed with ``exc``."""
    return {**_record(job), "status": "error", "error": f"{type(exc).__name__}: {exc}", "solve_time": solve_time}


def run_job(job: Job | PlanJob, schedules_dir: str | None = None) -> dict:
    """Solve (or plan) one job with one solver thread; a failure becomes a record with its error, not an exception.
    A memory factor counts 1F1B's peak on the profile with one stage per device (chunk stages merged)."""
    if isinstance(job, PlanJob):
        return _run_plan(job, schedules_dir)
    began = time.monotonic()
    try:
        result = solve_request(job.profile, job.request())
    except Exception as exc:
        return _failure(job, exc, time.monotonic() - began)
    figures = result.summary()
    record = {**_record(job), "status": result.status, "mem_limit": result.schedule.mem_limit,
              "figures": {k: v for k, v in figures.items() if k != "status"}, "solve_time": result.solve_time,
              "schedule": None}
    if schedules_dir is not None:
        path = Path(schedules_dir) / f"{job.key}.json"
        result.to_json(path)
        record["schedule"] = str(path)
    return record


def _run_plan(job: PlanJob, schedules_dir: str | None) -> dict:
    """Plan one model, timing its candidates one at a time in this process."""
    began = time.monotonic()
    try:
        with cf.ThreadPoolExecutor(1) as pool:
            result = plan(job.model, num_devices=job.num_devices, num_microbatches=job.num_microbatches,
                          device_memory=job.device_memory, placement=job.placement, time_limit=job.time_limit,
                          executor=pool)
    except Exception as exc:
        return _failure(job, exc, time.monotonic() - began)
    record = {**_record(job), "status": "planned", "figures": result.summary(),
              "baselines": [b.row() for b in result.baselines], "solve_time": result.plan_time, "schedule": None}
    if schedules_dir is not None:
        path = Path(schedules_dir) / f"{job.key}.json"
        result.to_json(path)
        record["schedule"] = str(path)
    return record


def _outcome(future: cf.Future, job: Job | PlanJob) -> dict:
    """A finished job's record; a failure record when its worker process died or the executor failed."""
    try:
        return future.result()
    except Exception as exc:
        return _failure(job, exc, None)


def solve_grid(grid: Grid | Iterable[Job | PlanJob], *, jobs: int = 1, executor: str | cf.Executor | None = None,
               output: str | Path | None = None, schedules_dir: str | Path | None = None,
               retry_failed: bool = False) -> Generator[dict, None, None]:
    """Run every job not yet in ``output`` (with ``retry_failed``, also those recorded as failed); yield each
    record as it finishes and append it to ``output``, where it supersedes the job's earlier record.

    A job that fails is recorded with its error and the batch goes on. On KeyboardInterrupt (or when the
    caller stops iterating) the pending jobs are cancelled, the running ones on local processes are stopped,
    and every finished record stays in ``output``.
    """
    if jobs < 1:
        raise InputError(f"jobs = {jobs} must be >= 1")
    job_list = expand(grid) if isinstance(grid, Grid) else list(grid)
    if schedules_dir is not None:
        try:
            Path(schedules_dir).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError(f"schedules_dir = {schedules_dir}: cannot make the folder ({exc.strerror or exc})") \
                from None
    with contextlib.ExitStack() as stack:
        results = None
        if output is not None:
            results = ResultsFile(output)
            stack.callback(results.close)
        seen = set() if results is None else skipped(results.records, retry_failed)
        todo = []
        for job in job_list:
            if job.key not in seen:
                seen.add(job.key)
                todo.append(job)
        pool, release = make_executor(executor, jobs)
        futures: dict[cf.Future, Job | PlanJob] = {}
        finished = False

        def stop() -> None:
            for future in futures:
                future.cancel()
            release(finished)

        stack.callback(stop)
        for job in todo:
            futures[pool.submit(run_job, job, None if schedules_dir is None else str(schedules_dir))] = job
        for future in cf.as_completed(futures):
            record = _outcome(future, futures[future])
            if results is not None:
                results.append(record)
            yield record
        finished = True
