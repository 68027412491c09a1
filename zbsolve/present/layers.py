"""A model's layers as a text table: ``zbsolve estimate`` and ``zbsolve profile --per-layer`` print it."""

from __future__ import annotations

from collections.abc import Sequence

from zbsolve.base.units import gib, mib
from zbsolve.costmodel.model import BLOCK, Layer, Model

LAYER_COLUMNS = ("layer", "F ms", "B ms", "W ms", "mem_f MiB", "mem_b MiB", "mem_w MiB", "static GiB", "out MiB")
"""Columns of ``layer_rows``."""
LAYER_HEADERS = tuple(name.replace(" ", "\n") for name in LAYER_COLUMNS)
"""``LAYER_COLUMNS`` as a terminal table heads them, each unit under its figure, so the table fits 100 columns."""
_COSTS = ("t_f", "t_b", "t_w", "mem_f", "mem_b", "mem_w", "static_bytes", "out_bytes")


def layer_rows(model: Model) -> list[list[str]]:
    """The model's layers as text rows of ``LAYER_COLUMNS`` (a run of layers with the same costs in one row,
    e.g. ``layers.0..31 (x32)``), then the totals."""
    groups: list[list[Layer]] = []
    for layer in model.layers:
        if groups and _costs(groups[-1][0]) == _costs(layer):
            groups[-1].append(layer)
        else:
            groups.append([layer])
    total = [sum(values) for values in zip(*(_costs(layer) for layer in model.layers))]
    return [[_run_name(group), *_cells(_costs(group[0]))] for group in groups] + [["total", *_cells(total)[:-1], "-"]]


def _costs(layer: Layer) -> tuple[float, ...]:
    return tuple(getattr(layer, name) for name in _COSTS)


def _cells(costs: Sequence[float]) -> list[str]:
    """Times in ms, activation memory and the output in MiB, static bytes in GiB."""
    t_f, t_b, t_w, mem_f, mem_b, mem_w, static, out = costs
    return ([f"{1e3 * t:.3f}" for t in (t_f, t_b, t_w)] + [f"{mib(m):.1f}" for m in (mem_f, mem_b, mem_w)]
            + [f"{gib(static):.2f}", f"{mib(out):.1f}"])


def _run_name(group: list[Layer]) -> str:
    """A run of layers by name: ``layers.0..31 (x32)`` for blocks named by index."""
    if len(group) == 1:
        return group[0].name
    first, last = group[0].name, group[-1].name
    if BLOCK.fullmatch(first) and BLOCK.fullmatch(last):
        return f"{first}..{last.split('.')[1]} (x{len(group)})"
    return f"{first} .. {last} (x{len(group)})"
