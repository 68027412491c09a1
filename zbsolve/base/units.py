"""Byte sizes as people write them: ``80GiB``, ``512MiB``, ``80GB``, or a plain number of bytes."""

from __future__ import annotations

import math
import re

from zbsolve.base.errors import InputError

UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
         "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
"""Bytes per unit, by the unit's name in capitals (decimal kB/MB/GB/TB, binary KiB/MiB/GiB/TiB)."""
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")
GIB = 2**30
MIB = 2**20
LEAST_BARE = 2**20
"""The least size given without a unit: a smaller bare number is surely GiB or GB written without the unit."""


def parse_bytes(text: str | int | float, what: str = "size", zero: bool = False) -> int:
    """Bytes in ``text`` (e.g. "80GiB", "1.5 TB", 1048576), positive (or 0 with ``zero``), at least ``LEAST_BARE``
    when it has no unit; anything else is an ``InputError`` naming ``what``."""
    if isinstance(text, bool):
        raise InputError(f"{what} = {text!r} is not a size (e.g. 80GiB, 512MiB, 80GB or bytes)")
    if isinstance(text, (int, float)):
        number, unit = float(text), ""
    else:
        match = _SIZE.match(str(text))
        if match is None or match[2].upper() not in UNITS:
            raise InputError(f"{what} = {text!r} is not a size (e.g. 80GiB, 512MiB, 80GB or bytes)")
        number, unit = float(match[1]), match[2].upper()
    size = number * UNITS[unit]
    if not math.isfinite(size) or size < 0 or size == 0 and not zero:
        raise InputError(f"{what} = {text!r} must be a {'' if zero else 'positive '}size{' >= 0' if zero else ''}")
    if not unit and 0 < size < LEAST_BARE:
        raise InputError(f"{what} = {text!r} is {size:.15g} bytes (a size without a unit is in bytes): did you mean "
                         f"{number:.15g}GiB?")
    return round(size)


def gib(size: float) -> float:
    """``size`` bytes in GiB."""
    return size / GIB


def mib(size: float) -> float:
    """``size`` bytes in MiB."""
    return size / MIB


def size_text(size: float) -> str:
    """``size`` bytes as text: GiB to two decimals, MiB below 1 GiB ("19.72 GiB", "12.50 MiB")."""
    return f"{gib(size):.2f} GiB" if abs(size) >= GIB else f"{mib(size):.2f} MiB"
