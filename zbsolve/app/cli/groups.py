"""Options bound in groups: a frozen dataclass whose fields are each annotated with their option
(``steps: Annotated[int, typer.Option(2, "--steps", ...)]``) or are such a group themselves stands, in a command's
signature, for all of them. ``grouped`` lists its options in the field's place, in the fields' order, and hands the
command the dataclass built from what the command line gives."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from typer.models import ParameterInfo

Result = TypeVar("Result")


def _is_group(kind: object) -> bool:
    """Whether ``kind`` is a group of options: a dataclass."""
    return isinstance(kind, type) and dataclasses.is_dataclass(kind)


def _fields(group: type) -> list[tuple[str, Any]]:
    """Each field of ``group`` with its type, ``Annotated`` kept (the option)."""
    hints = typing.get_type_hints(group, include_extras=True)
    return [(field.name, hints[field.name]) for field in dataclasses.fields(group)]


def _parameters(name: str, kind: Any) -> list[inspect.Parameter]:
    """The command line parameters of field ``name`` of type ``kind``: its option, or each of a group's."""
    if _is_group(kind):
        return [parameter for field, hint in _fields(kind) for parameter in _parameters(field, hint)]
    if typing.get_origin(kind) is not Annotated:
        raise TypeError(f"option {name}: annotate it Annotated[type, typer.Option(...)] or make it a group")
    base, *declared = typing.get_args(kind)
    option = next(info for info in declared if isinstance(info, ParameterInfo))
    return [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=base, default=option)]


def _built(group: type, values: dict[str, Any]) -> Any:
    """``group`` built from the command line's ``values``, its fields taken out of them."""
    return group(**{field: _built(hint, values) if _is_group(hint) else values.pop(field)
                    for field, hint in _fields(group)})


def grouped(command: Callable[..., Result]) -> Callable[..., Result]:
    """``command`` taking each of its parameters annotated with a group (a dataclass of options) as the group's
    options, listed in its place; it receives the group built from them. Every option's name is one parameter of the
    command line: a name taken twice is a ``TypeError``."""
    hints = typing.get_type_hints(command, include_extras=True)
    groups = {name: kind for name, kind in hints.items() if _is_group(kind)}
    listed: list[inspect.Parameter] = []
    for own in inspect.signature(command).parameters.values():
        kind = hints.get(own.name, own.annotation)
        listed += (_parameters(own.name, kind) if own.name in groups
                   else [own.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=kind)])
    names = [parameter.name for parameter in listed]
    if len(set(names)) < len(names):
        raise TypeError(f"{command.__name__}: options named twice: "
                        f"{sorted({name for name in names if names.count(name) > 1})}")

    @functools.wraps(command)
    def bound(**values: Any) -> Result:
        built = {name: _built(group, values) for name, group in groups.items()}
        return command(**values, **built)

    bound.__signature__ = inspect.Signature(listed)  # type: ignore[attr-defined]
    bound.__annotations__ = {parameter.name: parameter.annotation for parameter in listed}
    return bound
