"""Byte sizes from text."""

from __future__ import annotations

import pytest

from zbsolve.errors import InputError
from zbsolve.units import gib, parse_bytes


@pytest.mark.parametrize("text, size", [("80GiB", 80 * 2**30), ("80 GB", 80 * 10**9), ("512MiB", 512 * 2**20),
                                        ("1.5TiB", 3 * 2**39), ("4096", 4096), (4096, 4096), ("2kb", 2000),
                                        ("1e3B", 1000)])
def test_sizes(text, size):
    assert parse_bytes(text) == size


@pytest.mark.parametrize("text", ["80 GiBs", "GiB", "-1GiB", "0", "", "nan", True, "1e400GB", "eighty"])
def test_bad_sizes_name_the_field(text):
    with pytest.raises(InputError, match="^device_memory = "):
        parse_bytes(text, "device_memory")


def test_gib():
    assert gib(3 * 2**29) == 1.5
