"""Reading a Hugging Face ``config.json``: its mapping and the name its errors start with (``read_config``),
and its values, typed and checked, each error one line naming the file, the key and the value.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zbsolve.base.errors import InputError
from zbsolve.base.inputs import load_mapping
from zbsolve.base.kinds import HF_CONFIG, check_kind


def read_config(config: dict | str | Path) -> tuple[dict, str]:
    """The config's mapping and the name its errors start with; a file of another kind (``base.kinds``) is an
    ``InputError`` saying that ``zbsolve estimate`` takes a Hugging Face config.json."""
    if isinstance(config, dict):
        return config, "config"
    if isinstance(config, (str, Path)):
        data = load_mapping(config)
        check_kind(data, str(config), [HF_CONFIG], "zbsolve estimate")
        return data, str(config)
    raise InputError(f"config = {config!r}: should be a mapping or the path of a config.json")


MISSING: Any = object()
"""The default of ``integer`` that makes a key required."""


def integer(data: dict, key: str, where: str, default: int = MISSING, minimum: int = 1) -> int:
    """``data[key]`` as an integer >= ``minimum`` (``default`` when absent or null, if given)."""
    value = data.get(key)
    if value is None:
        if default is MISSING:
            raise InputError(f"{where}: {key} is missing")
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InputError(f"{where}: {key} = {value!r}: should be an integer >= {minimum}")
    return value


def boolean(data: dict, key: str, default: bool, where: str) -> bool:
    """``data[key]`` as true or false (``default`` when absent)."""
    value = data.get(key, default)
    if not isinstance(value, bool):
        raise InputError(f"{where}: {key} = {value!r}: should be true or false")
    return value


def probability(data: dict, key: str, default: float, where: str) -> float:
    """``data[key]`` as a probability in [0, 1] (``default`` when absent)."""
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise InputError(f"{where}: {key} = {value!r}: should be a probability in [0, 1]")
    return float(value)
