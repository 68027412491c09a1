"""When the running ``zbsolve`` command started: its time limit counts from there, so that loading the program
counts against it. The entry point (``zbsolve_cli.main``) sets it while a command runs."""

from __future__ import annotations

import time

started: float | None = None
"""``time.monotonic()`` at the ``zbsolve`` process's start while a command runs, else None."""


def command_began() -> float:
    """When this command started (``time.monotonic()``): the ``zbsolve`` process's start where it runs as one,
    else now."""
    return time.monotonic() if started is None else started
