"""The ``zbsolve`` command's entry point, apart from the ``zbsolve`` package so that importing it imports nothing
else: the command line is imported under a guard, so that an interrupt while it starts is one line and the
interrupt's exit code, never a traceback."""

from __future__ import annotations

import signal
import sys


def main() -> None:
    """Import and run the command line; an interrupt while importing is one line and exit code 130."""
    try:
        from zbsolve.app.cli import app
    except KeyboardInterrupt:
        print("interrupted: zbsolve stopped while starting", file=sys.stderr)
        sys.exit(128 + signal.SIGINT)
    app()
