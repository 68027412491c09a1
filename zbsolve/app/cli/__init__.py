"""The ``zbsolve`` command line, one module per command. Exit codes: 0 ok, 1 infeasible or failed check, 2 bad
input."""

from zbsolve.app.cli import configure, documents, estimate, families, frontier, grid, plan, predict, run, solve  # noqa: F401
from zbsolve.app.cli.common import app

__all__ = ["app"]
