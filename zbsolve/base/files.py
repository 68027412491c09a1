"""Output files: checked before any work starts, written whole or not at all.

``check_output`` refuses, with one ``InputError`` line, a path that is one of the command's input files, a
directory, whose parent is missing or not a directory, or that cannot be written; ``write_atomic`` writes to a
temporary file beside the target and renames it into place, so an interrupted write never leaves half a file.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from zbsolve.base.errors import InputError


def check_output(path: str | Path, what: str = "output", inputs: Iterable[str | Path | None] = ()) -> Path:
    """``path`` as a Path if a file can be written there and it is none of the files in ``inputs`` (``None``s are
    skipped), which writing it would overwrite; else an ``InputError`` naming ``what`` and the path."""
    path = Path(path)
    for source in inputs:
        if source is not None and _same_file(path, Path(source)):
            named = "" if Path(source) == path else f" {source}"
            raise InputError(f"{what} = {path} is the input file{named}: writing it would overwrite the input; "
                             "give another path")
    if path.is_dir():
        raise InputError(f"{what} = {path} is a directory; give a file name")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.exists():
        raise InputError(f"{what} = {path}: the folder {parent} does not exist")
    if not parent.is_dir():
        raise InputError(f"{what} = {path}: {parent} is not a folder")
    try:
        with tempfile.NamedTemporaryFile(dir=parent, prefix=f".{path.name}."):
            pass
    except OSError as exc:
        raise InputError(f"{what} = {path} cannot be written ({exc.strerror or exc})") from None
    if path.exists() and not os.access(path, os.W_OK):
        raise InputError(f"{what} = {path} cannot be written (permission denied)")
    return path


def _same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` are one file (a link to it included), or resolve to one path where either is
    missing."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path beside ``path`` to write to; renamed onto ``path`` when the block ends without error,
    removed otherwise."""
    path = Path(path)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=path.suffix, dir=path.parent if str(path.parent)
                                else ".")
    os.close(fd)
    tmp = Path(name)
    tmp.chmod(0o666 & ~_umask())
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _umask() -> int:
    """The process's file-creation mask (read by setting it and putting it back)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all; an OS error is an ``InputError`` naming the path."""
    write_with(path, lambda tmp: tmp.write_text(text))


def write_with(path: str | Path, writer: Callable[[Path], object]) -> None:
    """Call ``writer`` on a temporary path beside ``path`` and rename it into place; an OS error is an
    ``InputError`` naming the path."""
    try:
        with atomic_path(path) as tmp:
            writer(tmp)
    except OSError as exc:
        raise InputError(f"cannot write {path}: {exc.strerror or exc}") from None
