"""The command line options of a training setup, each declared once and bound to its ``Setup`` field by name
(``--seq-len`` to ``seq_len``): the help is the field's docstring, the default the field's in the model the command
builds. A command takes the fields it needs (``setup_options``) and receives those given as one mapping."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

import typer

from zbsolve.base.units import parse_bytes
from zbsolve.costmodel.gpus import GPUS
from zbsolve.costmodel.setup import RULES, SIZES, Setup


@dataclass(frozen=True)
class Option:
    """How the command line gives one field."""

    kind: type
    """The type typer reads (sizes are read as text, then as bytes)."""
    metavar: str = ""
    """The value's name in the help."""
    short: str | None = None
    """A short form, e.g. -b."""
    help: str | None = None
    """The help, where the field's docstring is not it."""


OPTIONS: dict[str, Option] = {
    "gpu": Option(str, "GPU", help=f"GPU preset: {', '.join(GPUS)}."), "dtype": Option(str, "DTYPE"),
    "seq_len": Option(int, "N"), "microbatch_size": Option(int, "N", "-b"), "global_batch": Option(int, "N"),
    "gpus": Option(int, "N"), "tp": Option(int, "N"), "pp": Option(int, "N"), "vp": Option(int, "N"),
    "dp": Option(int, "N"), "cp": Option(int, "N"), "ep": Option(int, "N"), "zero": Option(int, "N"),
    "layout": Option(str, "STR"), "partition": Option(str, "SPLIT"), "schedule": Option(str, "NAME"),
    "recompute": Option(str, "CHOICE"), "device_memory": Option(str, "SIZE"), "reserve": Option(str, "SIZE"),
    "overlap_grad_reduce": Option(bool), "overlap_param_gather": Option(bool), "tp_comm_overlap": Option(bool),
    "dispatcher": Option(str, "NAME"), "a2a_link": Option(str, "LINK"), "link": Option(str, "LINK"),
    "efficiency": Option(float, "SHARE"), "flash_attention": Option(bool), "method": Option(str, "METHOD")}
"""Each field's option, by field."""


def _parameter(model: type[Setup], name: str) -> inspect.Parameter:
    """The typer parameter of field ``name``: required where the model requires it, else None (not given)."""
    option, field = OPTIONS[name], model.model_fields[name]
    flag = "--" + name.replace("_", "-")
    flags = [f"{flag}/--no-{flag[2:]}"] if option.kind is bool else [flag, *([option.short] if option.short else [])]
    required = field.is_required()
    shown = False if required or field.default is None else (
        f"{field.default // 2**30}GiB" if name in SIZES else str(field.default))
    default = typer.Option(... if required else None, *flags, metavar=option.metavar or None, show_default=shown,
                           help=option.help or field.description)
    return inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default,
                             annotation=option.kind if required else Optional[option.kind])


def given(name: str, value: Any) -> Any:
    """An option's value checked by its field's rule under its flag, sizes read as bytes."""
    flag = "--" + name.replace("_", "-")
    if name in SIZES:
        return parse_bytes(value, flag, zero=name == "reserve")
    if name in RULES:
        RULES[name](flag, value)
    return value


def setup_options(model: type[Setup], fields: tuple[str, ...]) -> Callable[[Callable], Callable]:
    """A command that also takes the options of ``fields`` (``OPTIONS``), their defaults ``model``'s, after its
    own parameters; it receives those given, checked (``given``), as its parameter ``knobs``."""
    def decorate(command: Callable) -> Callable:
        own = [p for p in inspect.signature(command).parameters.values() if p.name != "knobs"]
        added = [_parameter(model, name) for name in fields]

        @functools.wraps(command)
        def bound(**values: Any) -> Any:
            options = {name: values.pop(name) for name in fields}
            knobs = {name: given(name, value) for name, value in options.items() if value is not None}
            return command(**values, knobs=knobs)

        bound.__signature__ = inspect.Signature(own[:1] + added + own[1:])  # type: ignore[attr-defined]
        bound.__annotations__ = {**{k: v for k, v in command.__annotations__.items() if k != "knobs"},
                                 **{p.name: p.annotation for p in added}}
        return bound
    return decorate
