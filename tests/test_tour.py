"""The README's quick start and docs/cli.md's examples, replayed as printed: every ``zbsolve`` line of their shell
blocks, in order, in one folder, through the command line in-process; each exits 0 and writes the files it names.
Blocks fenced as ``long`` (a search of a minute, a torch run, what reads their output) are not replayed."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest
from conftest import ROOT, zbsolve

PAGES = (ROOT / "README.md", ROOT / "docs" / "cli.md")
"""The pages whose examples run in this order: the quick start first, then the tour."""
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
"""A fenced block: its info string and its text."""
COMMAND = re.compile(r"^(?:\.venv/bin/)?zbsolve (.+)$")
"""A command line of a block, as a user types it from the repository's root (the README's ``.venv/bin/`` or not)."""
WRITES = ("-o", "--output", "--chart", "--summary")
"""The options naming a file or folder a command writes."""


def commands(page: Path) -> list[str]:
    """The ``zbsolve`` command lines of ``page``'s shell blocks (no info string), without ``zbsolve`` and any trailing
    comment, in order; blocks fenced as ``long`` are left out."""
    lines = []
    for info, text in FENCE.findall(page.read_text()):
        if info.strip() == "":
            lines += [m.group(1).split("  #")[0].strip() for m in map(COMMAND.match, text.splitlines()) if m]
    return lines


def written(args: list[str]) -> list[str]:
    """The files and folders the command ``args`` says it writes."""
    return [value for option, value in zip(args, args[1:]) if option in WRITES]


def test_each_page_has_examples_to_replay_and_some_left_out():
    assert all(commands(page) for page in PAGES)
    assert "long" in {info.strip() for info, _ in FENCE.findall(PAGES[1].read_text())}


def test_the_quick_start_and_the_tour_run_as_printed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A command both pages show runs once, where it first comes. Its worker processes start as the ``zbsolve``
    script's do, forked (``base.parallel.start_method``), not spawned as under ``python -m pytest``: a spawned worker
    imports torch again, on the plans' time limits."""
    (tmp_path / "problems").symlink_to(ROOT / "problems")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys.modules["__main__"], "__spec__", None)
    replayed: list[str] = []
    for line in (line for page in PAGES for line in commands(page)):
        if line in replayed:
            continue
        replayed.append(line)
        args = shlex.split(line)
        result = zbsolve(*args)
        assert result.exit_code == 0, (line, result.stdout[-2000:], result.stderr[-2000:], result.exception)
        missing = [name for name in written(args) if not (tmp_path / name).exists()]
        assert not missing, f"zbsolve {line}: wrote no {missing}"
        assert not any(name.endswith("/") and not any((tmp_path / name).iterdir()) for name in written(args)), line
