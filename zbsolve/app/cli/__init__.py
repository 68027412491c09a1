"""The ``zbsolve`` command line, one module per command. Exit codes: 0 ok, 1 infeasible or failed check, 2 bad
input."""

from zbsolve.app.cli import (  # noqa: F401
    calibrate,
    configure,
    documents,
    estimate,
    families,
    frontier,
    grid,
    plan,
    predict,
    run,
    solve,
)
from zbsolve.app.cli.common import app

__all__ = ["app"]
