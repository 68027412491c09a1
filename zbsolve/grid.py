"""Batch solving of config grids: the cartesian product of a grid file's axes, run in parallel
processes (or on a Dask cluster), each finished job appended at once to a JSONL results file
that a rerun resumes from."""

from __future__ import annotations

import concurrent.futures as cf
import csv
import fcntl
import hashlib
import itertools
import json
import multiprocessing
import os
import time
from pathlib import Path
from typing import IO, Callable, Iterable, Iterator, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, ValidationError, model_validator

from zbsolve.errors import InputError, ZbsolveError
from zbsolve.problem import Problem, resolve_limit
from zbsolve.profile import Profile, load_mapping, pydantic_message


class Axes(BaseModel):
    """The swept values; a job is one value from each axis. Unset axes take the problem's value."""

    model_config = ConfigDict(extra="forbid")

    stages: Optional[list[PositiveInt]] = Field(None, min_length=1)
    """Numbers of devices p."""
    microbatches: Optional[list[PositiveInt]] = Field(None, min_length=1)
    """Numbers of microbatches m."""
    mem_factor: Optional[list[PositiveFloat]] = Field(None, min_length=1)
    """Memory limits as multiples of 1F1B's peak."""
    mem_limit: Optional[list[PositiveFloat]] = Field(None, min_length=1)
    """Memory limits in the profile's unit."""
    placement: list[str] = Field(["sequential"], min_length=1)
    """Placements."""
    solver: list[str] = Field(["cpsat"], min_length=1)
    """Solvers: cpsat, cbc, heuristic."""
    time_limit: list[PositiveFloat] = Field([60.0], min_length=1)
    """Solver time limits in seconds."""
    seed: list[int] = Field([0], min_length=1)
    """Solver seeds."""

    @model_validator(mode="after")
    def _one_limit_axis(self) -> "Axes":
        if self.mem_factor is not None and self.mem_limit is not None:
            raise ValueError("sweep mem_factor or mem_limit, not both")
        return self


class Grid(BaseModel):
    """A grid file: problems (files or one inline profile) and the axes to sweep."""

    model_config = ConfigDict(extra="forbid")

    name: str = "grid"
    """Name of the sweep."""
    problems: list[str] = []
    """Problem YAML files, relative to the grid file."""
    profile: Optional[Profile] = None
    """An inline profile, used when no problem files are named."""
    axes: Axes = Field(default_factory=Axes)
    """What to sweep."""

    @model_validator(mode="after")
    def _has_problem(self) -> "Grid":
        if not self.problems and self.profile is None:
            raise ValueError("name at least one problem file or give an inline profile")
        return self

    @classmethod
    def load(cls, path: str | Path) -> "Grid":
        """Read a grid file; problem paths become relative to it."""
        path = Path(path)
        data = load_mapping(path)
        try:
            grid = cls.model_validate(data)
        except ValidationError as exc:
            raise InputError(pydantic_message(str(path), exc)) from None
        grid.problems = [str((path.parent / p) if not Path(p).is_absolute() else p) for p in grid.problems]
        return grid


class Job(BaseModel):
    """One solve, fully resolved: everything its result depends on."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    problem: str
    """Problem name."""
    profile: Profile
    """Costs."""
    num_devices: PositiveInt
    """Devices p."""
    num_microbatches: PositiveInt
    """Microbatches m."""
    placement: str
    """Placement name."""
    mem_limit: Optional[float] = None
    """Memory limit in profile units (None: see mem_factor, or unlimited)."""
    mem_factor: Optional[float] = None
    """Memory limit as a multiple of 1F1B's peak."""
    solver: str
    """Solver name."""
    time_limit: float
    """Time limit in seconds."""
    seed: int
    """Solver seed."""

    @property
    def key(self) -> str:
        """Content hash: equal for equal jobs, whatever the grid they come from."""
        text = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def _problems(grid: Grid) -> list[Problem]:
    if grid.problems:
        return [Problem.load(p) for p in grid.problems]
    p = grid.profile.num_stages or (grid.axes.stages or [None])[0]
    if p is None:
        raise InputError("axes.stages: required with an inline profile of scalars")
    if not grid.axes.microbatches:
        raise InputError("axes.microbatches: required with an inline profile")
    return [Problem(name=grid.name, num_devices=p, num_microbatches=grid.axes.microbatches[0], profile=grid.profile)]


def expand(grid: Grid) -> list[Job]:
    """The grid's job list: problems x every axis."""
    problems, a = _problems(grid), grid.axes
    jobs = []
    for prob in problems:
        limits = ([("mem_factor", x) for x in a.mem_factor] if a.mem_factor else
                  [("mem_limit", x) for x in a.mem_limit] if a.mem_limit else
                  [("mem_factor", prob.mem_factor)] if prob.mem_factor else [("mem_limit", prob.mem_limit)])
        for p, m, (kind, limit), placement, solver, t, seed in itertools.product(
                a.stages or [prob.num_devices], a.microbatches or [prob.num_microbatches], limits,
                a.placement, a.solver, a.time_limit, a.seed):
            jobs.append(Job(problem=prob.name, profile=prob.profile, num_devices=p, num_microbatches=m,
                            placement=placement, solver=solver, time_limit=t, seed=seed, **{kind: limit}))
    return jobs


def run_job(job: Job, schedules_dir: Optional[str] = None) -> dict:
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


# -- the results file ---------------------------------------------------------------------------
def read_results(path: str | Path) -> list[dict]:
    """Every complete record of a results file; a truncated last line (from a crash) is dropped."""
    path = Path(path)
    if not path.exists():
        return []
    lines = path.read_text().split("\n")
    records = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                break
            raise InputError(f"{path} line {i + 1} is not JSON: not a zbsolve results file") from None
        if not isinstance(record, dict) or "hash" not in record or "config" not in record:
            raise InputError(f"{path} line {i + 1} has no 'hash' and 'config': not a zbsolve results file")
        records.append(record)
    return records


class ResultsFile:
    """A results file held open for appending, locked against a second grid run."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.done = {r["hash"] for r in read_results(self.path)}
        self._file: IO[str] = open(self.path, "a+")
        try:
            fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._file.close()
            raise InputError(f"{self.path} is in use by another grid run; wait for it or use another -o") from None
        self._drop_truncated_tail()

    def _drop_truncated_tail(self) -> None:
        self._file.seek(0)
        text = self._file.read()
        if text and not text.endswith("\n"):
            self._file.truncate(text.rfind("\n") + 1)

    def append(self, record: dict) -> None:
        """Write one record and flush it to disk at once."""
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        """Release the lock."""
        self._file.close()


def shutdown_pool(pool: cf.ProcessPoolExecutor, finished: bool) -> None:
    """Shut the pool down; when interrupted, stop the jobs still running instead of waiting for them."""
    workers = list((pool._processes or {}).values())  # shutdown() forgets them; Python < 3.14 has no public way
    pool.shutdown(wait=finished, cancel_futures=True)
    if not finished:
        for process in workers:
            process.terminate()


def make_executor(spec: Union[str, cf.Executor, None], jobs: int) -> tuple[cf.Executor, Callable[[bool], None]]:
    """An executor from ``None`` (local processes), ``dask://HOST:PORT`` or an Executor, and how to release it
    (called with whether all jobs finished)."""
    if isinstance(spec, cf.Executor):
        return spec, lambda finished: None
    if spec is None or spec == "local":
        pool = cf.ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"))
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


def solve_grid(grid: Grid | Iterable[Job], *, jobs: int = 1, executor: Union[str, cf.Executor, None] = None,
               output: str | Path | None = None, schedules_dir: str | Path | None = None) -> Iterator[dict]:
    """Run every job not yet in ``output``; yield each record as it finishes (and append it to ``output``).

    A job that fails is recorded with its error and the batch goes on. On KeyboardInterrupt the
    pending jobs are cancelled and every finished record stays in ``output``.
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


def pending(jobs: Iterable[Job], output: str | Path | None) -> tuple[int, int]:
    """(distinct jobs, of those already in ``output``)."""
    keys = {j.key for j in jobs}
    done = {r["hash"] for r in read_results(output)} if output is not None else set()
    return len(keys), len(keys & done)


# -- tables ---------------------------------------------------------------------------------------
def flatten(record: dict) -> dict:
    """One flat row of a record: config and figures side by side (peak memory as its maximum)."""
    row = {"hash": record["hash"], **record["config"], "status": record.get("status"),
           "mem_limit_value": record.get("mem_limit"), "solve_time": record.get("solve_time"),
           "error": record.get("error", ""), "schedule": record.get("schedule")}
    for key, value in (record.get("figures") or {}).items():
        row[key] = max(value) if isinstance(value, list) and value else value
    return row


def write_summary(records: list[dict], path: str | Path) -> None:
    """Write the records as a flat CSV table."""
    rows = [flatten(r) for r in records]
    columns = list(dict.fromkeys(k for row in rows for k in row))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


def to_dataframe(records: Iterable[dict] | str | Path):
    """The records (or a results file) as a pandas DataFrame, one flat row each."""
    import pandas as pd

    if isinstance(records, (str, Path)):
        records = read_results(records)
    return pd.DataFrame([flatten(r) for r in records])
