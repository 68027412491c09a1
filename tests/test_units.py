"""Byte sizes from text."""

from __future__ import annotations

import re

import pytest

from zbsolve.base.errors import InputError
from zbsolve.base.units import gib, parse_bytes


@pytest.mark.parametrize("text, size", [("80GiB", 80 * 2**30), ("80 GB", 80 * 10**9), ("512MiB", 512 * 2**20),
                                        ("1.5TiB", 3 * 2**39), ("1048576", 2**20), (2**20, 2**20),
                                        ("2kb", 2000), ("1e3B", 1000)])
def test_sizes(text, size):
    assert parse_bytes(text) == size


@pytest.mark.parametrize("text", ["80 GiBs", "GiB", "-1GiB", "0", "", "nan", True, "1e400GB", "eighty"])
def test_bad_sizes_name_the_field(text):
    with pytest.raises(InputError, match="^device_memory = "):
        parse_bytes(text, "device_memory")


@pytest.mark.parametrize("text, hint", [("80", "did you mean 80GiB?"), (80, "did you mean 80GiB?"),
                                        ("1048575", "did you mean 1048575GiB?"), ("0.5", "did you mean 0.5GiB?")])
def test_a_bare_number_below_a_mib_is_refused_with_a_hint(text, hint):
    """80 is surely 80 GiB written without its unit, never 80 bytes of device memory."""
    with pytest.raises(InputError, match=re.escape(hint) + "$") as error:
        parse_bytes(text, "device_memory")
    assert str(error.value).startswith(f"device_memory = {text!r} is ")


def test_gib():
    assert gib(3 * 2**29) == 1.5
