"""Batch solving of config grids: the cartesian product of a grid file's axes, checked whole, then run in
parallel processes (or on a Dask cluster), each finished job appended at once to a JSONL results file
that a rerun resumes from (and retries the failed jobs of, when asked)."""

from zbsolve.app.grid.jobs import Axes, Grid, Job, expand
from zbsolve.app.grid.results import ResultsFile, failed, flatten, pending, read_results, to_dataframe, write_summary
from zbsolve.app.grid.run import run_job, solve_grid
from zbsolve.base.parallel import ProcessPool, make_executor, shutdown_pool

__all__ = ["Axes", "Grid", "Job", "ProcessPool", "ResultsFile", "expand", "failed", "flatten", "make_executor",
           "pending", "read_results", "run_job", "shutdown_pool", "solve_grid", "to_dataframe", "write_summary"]
