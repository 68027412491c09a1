"""The ``zbsolve`` command's entry point, apart from the ``zbsolve`` package so that importing it imports nothing
else: the command line is imported under a guard, so that an interrupt while it starts is one line and the
interrupt's exit code, never a traceback."""

from __future__ import annotations

import atexit
import os
import signal
import sys
import time


def main() -> None:
    """Import and run the command line; an interrupt while importing is one line and exit code 130. Once the command
    has returned, its output flushed and the exit handlers run, the process ends without tearing its modules down
    (torch's alone take most of a second), so that a command's time limit holds from its start to its exit."""
    began = time.monotonic()
    try:
        from zbsolve.app.cli import app
        from zbsolve.base import clock
    except KeyboardInterrupt:
        print("interrupted: zbsolve stopped while starting", file=sys.stderr)
        sys.exit(128 + signal.SIGINT)
    clock.started = began  # the command's time limit counts from the process's start
    try:
        app()
    except SystemExit as ended:
        code = ended.code
    else:
        code = 0
    finally:
        clock.started = None
    if code is not None and not isinstance(code, int):  # sys.exit("text"): the text, and exit code 1
        print(code, file=sys.stderr)
        code = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can be written
            pass
    os._exit(code or 0)
