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

from zbsolve.base.errors import InputError
from zbsolve.base.units import gib
from zbsolve.costmodel.constants import DEFAULT_RESERVE
from zbsolve.costmodel.gpus import GPUS
from zbsolve.costmodel.setup import RULES, SIZES, Setup, sized
from zbsolve.schedulers.builtins import ORDERS


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
    off: str | None = None
    """A switch's help for its ``--no-`` form, shown where the model's default is on."""


OPTIONS: dict[str, Option] = {
    "gpu": Option(str, "GPU", help=f"GPU preset: {', '.join(GPUS)}."), "dtype": Option(str, "DTYPE"),
    "seq_len": Option(int, "N"), "microbatch_size": Option(int, "N", "-b"), "global_batch": Option(int, "N"),
    "gpus": Option(int, "N"), "tp": Option(int, "N"), "pp": Option(int, "N"), "vp": Option(int, "N"),
    "dp": Option(int, "N", help="Data-parallel degree (shards the optimizer under --zero 1)."),
    "cp": Option(int, "N"), "ep": Option(int, "N"), "zero": Option(int, "N"),
    "layout": Option(str, "STR"), "partition": Option(str, "SPLIT"), "schedule": Option(
        str, "NAME", help=f"The order, in any case: {', '.join(ORDERS)} (default: Megatron's: 1F1B, or "
                          "Interleaved1F1B with --vp > 1)."),
    "recompute": Option(str, "CHOICE"),
    "device_memory": Option(str, "SIZE", help="Memory per device, e.g. 80GiB, 80GB or bytes (default: the GPU's)."),
    "reserve": Option(str, "SIZE", help="Memory per device kept free of stages and activations (default: predict "
                                        "and configure count the CUDA context and NCCL's buffers, plan and solve "
                                        f"keep {gib(DEFAULT_RESERVE):g} GiB)."),
    "runtime": Option(str, "NAME", help="Runtime whose allocations the memory follows: megatron or torchtitan."),
    "overlap_grad_reduce": Option(bool, off="Gradients reduced after the backward (not Megatron's "
                                            "--overlap-grad-reduce)."),
    "overlap_param_gather": Option(bool, off="Parameters all-gathered before the forward (not Megatron's "
                                             "--overlap-param-gather)."),
    "tp_comm_overlap": Option(bool),
    "compile": Option(bool, off="torchtitan's Llama blocks in eager PyTorch, each elementwise op a kernel of its own "
                                "(default: fused, as torch.compile or Megatron-LM runs them)."),
    "dispatcher": Option(str, "NAME"), "a2a_link": Option(str, "LINK"), "link": Option(str, "LINK"),
    "efficiency": Option(float, "SHARE"), "method": Option(str, "METHOD"), "calibration": Option(str, "CAL"),
    "flash_attention": Option(bool, off="Keep the s x s attention probabilities (default: flash attention keeps "
                                        "none).")}
"""Each field's option, by field."""


def flag(name: str) -> str:
    """Field ``name``'s flag: ``--seq-len`` for ``seq_len``."""
    return "--" + name.replace("_", "-")


def _default(model: type[Setup], name: str) -> tuple[Any, bool]:
    """Field ``name``'s typer default (required: ``...``; a size: as text, 4GiB) and whether the help shows it."""
    field = model.model_fields[name]
    if field.is_required():
        return ..., False
    if field.default is None:
        return None, False
    return (f"{field.default // 2**30}GiB" if name in SIZES else field.default), True


def _parameters(model: type[Setup], name: str) -> list[inspect.Parameter]:
    """The typer parameters of field ``name``: one option, or for a switch the form that turns it from ``model``'s
    default (``--flag``, or ``--no-flag`` with its ``off`` help) and, hidden, the default's form."""
    option, field = OPTIONS[name], model.model_fields[name]
    about = " ".join((option.help or field.description or "").split()).replace("(None: ", "(default: ")
    if option.kind is bool:
        on, off = flag(name), flag(f"no_{name}")
        change = off if field.default else on
        helps = {change: (option.off or "") if change == off else about}
        return [inspect.Parameter(form[2:].replace("-", "_"), inspect.Parameter.KEYWORD_ONLY, annotation=bool,
                                  default=typer.Option(False, form, hidden=form != change,
                                                       help=helps.get(form, "The default.")))
                for form in (on, off)]
    default, show = _default(model, name)
    kind = option.kind if default is not None else Optional[option.kind]
    flags = [flag(name), *([option.short] if option.short else [])]
    return [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=kind, default=typer.Option(
        default, *flags, metavar=option.metavar or None, show_default=show, help=about))]


def given(name: str, value: Any) -> Any:
    """An option's value checked by its field's rule under its flag, sizes read as bytes."""
    if name in SIZES:
        return sized(name, value, flag(name))
    if name in RULES:
        RULES[name](flag(name), value)
    return value


def _knobs(fields: tuple[str, ...], values: dict[str, Any], context: typer.Context, read: bool) -> dict[str, Any]:
    """The options of ``fields`` taken out of ``values``: with ``read``, those given on the command line, checked
    (``given``); else each as the command line has it, its default included (sizes as text: the command reads
    them)."""
    knobs = {}
    for name in fields:
        value = values.pop(name)
        if OPTIONS[name].kind is bool:
            off = values.pop(f"no_{name}")
            if value and off:
                raise InputError(f"{flag(name)} and {flag(f'no_{name}')}: give one")
            if value or off:
                knobs[name] = not off
        elif not read:
            if value is not None:
                knobs[name] = value
        elif context.get_parameter_source(name).name not in ("DEFAULT", "DEFAULT_MAP"):  # type: ignore[union-attr]
            knobs[name] = given(name, value)
    return knobs


def setup_options(model: type[Setup], fields: tuple[str, ...], read: bool = True) -> Callable[[Callable], Callable]:
    """A command that also takes the options of ``fields`` (``OPTIONS``), their defaults ``model``'s, after its
    first parameter; it receives those given on the command line, checked (``given``), as its parameter ``knobs``
    (without ``read``: each as the command line has it, defaults and sizes as text, e.g. 4GiB)."""
    def decorate(command: Callable) -> Callable:
        own = [p for p in inspect.signature(command).parameters.values() if p.name != "knobs"]
        added = [p for name in fields for p in _parameters(model, name)]
        context = inspect.Parameter("setup_context", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)

        @functools.wraps(command)
        def bound(**values: Any) -> Any:
            knobs = _knobs(fields, values, values.pop("setup_context"), read)
            return command(**values, knobs=knobs)

        keyword = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own]
        bound.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            keyword[:1] + added + keyword[1:] + [context])
        bound.__annotations__ = {**{k: v for k, v in command.__annotations__.items() if k != "knobs"},
                                 **{p.name: p.annotation for p in (*added, context)}}
        return bound
    return decorate
