"""User input read and checked: YAML and JSON files, and pydantic models whose every error is one ``InputError``
line naming the field and the value."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, ClassVar, Self

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from zbsolve.base.errors import InputError
from zbsolve.base.kinds import check_kind

_SHOWN = 60
"""Longest shown value in an error message (longer ones are cut)."""



class InputModel(BaseModel):
    """A model built from user input: strict types, and any validation error is an ``InputError`` of one line
    (``where: field = value: what is wrong``) instead of pydantic's ``ValidationError``."""

    model_config = ConfigDict(strict=True)
    what: ClassVar[str] = "input"
    """What the model is, to start its error lines when no file is named."""
    file_kind: ClassVar[str | None] = None
    """The kind of input file (``base.kinds.KINDS``) ``load`` reads, which refuses a file of another kind; None:
    any."""

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise InputError(pydantic_message(self.what, exc, data)) from None

    # Nested in another model, this one validates as pydantic's own do, so an error keeps its full path.
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    @classmethod
    def model_validate(cls, obj: Any, **kwargs: Any) -> Self:
        """Validate ``obj`` (pydantic's keywords); a bad field is an ``InputError``."""
        return cls.parse(obj, cls.what, **kwargs)

    @classmethod
    def parse(cls, data: object, where: str, **kwargs: Any) -> Self:
        """Validate ``data``; a bad field is an ``InputError`` line that starts with ``where`` (e.g. a file)."""
        try:
            return super().model_validate(data, **kwargs)
        except ValidationError as exc:
            raise InputError(pydantic_message(where, exc, data)) from None

    @classmethod
    def load(cls, path: str | os.PathLike[str], taker: str | None = None) -> Self:
        """Read from YAML or JSON, named after the file unless it says its name; errors name the file, the
        field and the value, and a file of another kind than ``file_kind`` what ``taker`` (a command, an option;
        default: this method) takes."""
        data = load_mapping(path)
        if cls.file_kind is not None:
            check_kind(data, str(path), [cls.file_kind], taker or f"{cls.__name__}.load")
        data.setdefault("name", Path(path).stem)
        return cls.parse(data, str(path))


def pydantic_message(where: str, exc: ValidationError, data: object = None) -> str:
    """One line for pydantic's errors: ``where: field = value: what is wrong``, for the first field at fault (its
    deepest error; the alternatives of a union merged). With ``data``, the validated input, union members'
    tags are left out of the field's path."""
    errors = [(_path(err["loc"], data, err["type"]), err) for err in exc.errors(include_url=False)]
    top = errors[0][0][:1]
    path = max((p for p, _ in errors if p[:1] == top), key=len)
    return f"{where}: {_describe('.'.join(map(str, path)), [err for p, err in errors if p == path])}"


def _path(loc: tuple, data: object, kind: str) -> tuple:
    """The keys and indices of ``loc`` that lead through ``data`` (a missing key kept); ``loc`` as given when
    ``data`` is None."""
    if data is None:
        return tuple(loc)
    path, node = [], data
    for i, key in enumerate(loc):
        if isinstance(node, dict) and key in node or (isinstance(node, (list, tuple)) and isinstance(key, int)
                                                       and 0 <= key < len(node)):
            path.append(key)
            node = node[key]
        elif kind == "missing" and i == len(loc) - 1:
            path.append(key)
    return tuple(path)


def _describe(name: str, errors: list) -> str:
    """``field = value: what is wrong`` for the errors of one field."""
    err = errors[0]
    kind, ctx, value = err["type"], err.get("ctx", {}), err.get("input")
    tag = str(ctx.get("discriminator", "")).strip("'")
    if kind == "missing":
        return f"{name} is missing"
    if kind == "union_tag_not_found":
        return f"{name}.{tag} is missing"
    if kind == "union_tag_invalid":
        return f"{name}.{tag} = {show(ctx['tag'])}: should be one of {ctx['expected_tags']}"
    if kind == "value_error" and isinstance(value, dict):
        return f"{name}: {_reason(err)}" if name else _reason(err)
    wanted = [e for e in errors if not e["type"].endswith(("_type", "_parsing"))] or errors
    reasons = list(dict.fromkeys(_reason(e) for e in wanted))
    shared = "should be " if all(r.startswith("should be ") for r in reasons) else ""
    reason = shared + " or ".join(r.removeprefix(shared) for r in reasons)
    return f"{name} = {show(value)}: {reason}" if name else f"{reason}, got {show(value)}"


def _reason(err: dict) -> str:
    """Pydantic's message for ``err``, shortened."""
    if err["type"] == "extra_forbidden":
        return "unknown key"
    if err["type"] in ("model_type", "model_attributes_type", "dict_type"):
        return "should be a mapping"
    msg = err["msg"]
    if msg.startswith("Value error, "):
        return msg.removeprefix("Value error, ")
    if msg.startswith("Input "):
        return msg.removeprefix("Input ").split(", unable to")[0]
    return msg[:1].lower() + msg[1:]


def show(value: object) -> str:
    """``repr(value)``, cut to a readable length."""
    text = repr(value)
    return text if len(text) <= _SHOWN else text[:_SHOWN - 3] + "..."


class _Loader(yaml.SafeLoader):
    """YAML's safe loader that also reads numbers such as ``1e9`` (no dot) as floats, as JSON does."""


_Loader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)[eE][-+]?\d+$"),
                              list("-+.0123456789"))


def read_text(path: str | Path) -> str:
    """The UTF-8 text of the file at ``path``; an ``InputError`` line naming the file when it cannot be read."""
    path = Path(path)
    try:
        return path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{path} is not UTF-8 text: byte {exc.object[exc.start]:#04x} at offset {exc.start} "
                         "(a binary file?)") from None


def load_mapping(path: str | os.PathLike[str]) -> dict:
    """Read a YAML or JSON file that must hold a mapping; an ``InputError`` line naming the file otherwise."""
    path = Path(path)
    kind = "JSON" if path.suffix == ".json" else "YAML"
    text = read_text(path)
    try:
        data = json.loads(text) if kind == "JSON" else yaml.load(text, Loader=_Loader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise InputError(f"{path} is not valid YAML: {_one_line(exc.problem or exc.context or '')}{where}") from None
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        raise InputError(f"{path} is not valid {kind}: {_one_line(str(exc)) or type(exc).__name__}") from None
    if not isinstance(data, dict):
        raise InputError(f"{path} must hold a mapping at the top level, got {type(data).__name__}")
    return data


def _one_line(text: str) -> str:
    """``text`` with its line breaks and runs of spaces made single spaces."""
    return " ".join(text.split())
