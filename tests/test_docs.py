"""The README stays a newcomer's page, the docs name only paths that exist, and nothing cites an issue number that
nothing in the repository resolves."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAPS = (README, ROOT / "docs" / "architecture.md")
"""The pages that map the code: every path they name must exist."""
README_BYTES = 7 * 1024
PACKAGES = tuple(sorted(p.name for p in (ROOT / "zbsolve").iterdir() if (p / "__init__.py").exists()))
"""The package's subpackages, whose paths the pages name."""
ISSUE = re.compile(r"\bissues? \d+", re.IGNORECASE)
SKIPPED: frozenset[str] = frozenset()
"""Tracked files still citing an issue number, each to be reworded."""


def test_the_readme_is_short_and_shows_the_two_commands():
    text = README.read_text()
    assert len(README.read_bytes()) <= README_BYTES
    assert "make demo" in text and "make test" in text


def _named_paths(text: str) -> set[str]:
    """The package paths a page names: ``zbsolve/...`` anywhere, and ``PACKAGE/...`` in backquotes."""
    named = {m.rstrip("/.") for m in re.findall(r"(?<![\w/])zbsolve/[\w/.]*[\w/]", text)}
    for quoted in re.findall(r"`([^`\s]+)`", text):
        head = quoted.split("/")[0]
        if "/" in quoted and head in PACKAGES:
            named.add("zbsolve/" + quoted.rstrip("/"))
    return named


@pytest.mark.parametrize("page", MAPS, ids=lambda p: p.name)
def test_every_path_the_page_names_exists(page):
    missing = sorted(p for p in _named_paths(page.read_text()) if not (ROOT / p).exists())
    assert not missing, f"{page.name} names paths that do not exist: {missing}"


def test_no_file_cites_an_issue_number():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    hits = []
    for name in files:
        if name in SKIPPED:
            continue
        try:
            text = (ROOT / name).read_text()
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue
        hits += [f"{name}: {m.group(0)}" for m in ISSUE.finditer(text)]
    assert not hits, hits
