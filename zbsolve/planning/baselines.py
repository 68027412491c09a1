"""The baselines a plan is measured against: each of torch's built-in schedules on each baseline split (uniform,
torchtitan's, Megatron's), and on the uniform and torchtitan splits with every block recomputed (torchtitan's
activation checkpointing); Megatron's own schedule on a ``--pipeline-model-parallel-layout`` when given, and on
Megatron's split and the layout with the best recomputation of Megatron's menu; all simulated on the plan's own
costs."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import replace

from zbsolve.base.errors import InputError, ZbsolveError
from zbsolve.base.interrupt import Deadline, deadline
from zbsolve.base.units import gib
from zbsolve.core import torch_compat
from zbsolve.core.simulator import Timeline
from zbsolve.costmodel.model import Model
from zbsolve.io.targets.megatron import MEGATRON, megatron_schedule
from zbsolve.io.targets.megatron.layout import layout_counts
from zbsolve.planning.result import Baseline, by_step_time
from zbsolve.planning.runs import BaselineSetting, builtin_run
from zbsolve.planning.targets import recompute_choices
from zbsolve.problem.costs import DEFAULT_RESERVE, Costs
from zbsolve.problem.partition import partition
from zbsolve.problem.recompute import FULL, NONE, Recompute, parse_recompute
from zbsolve.problem.request import Request
from zbsolve.problem.splits import megatron_split, megatron_uneven_split, split_ranges
from zbsolve.schedulers.builtins import BUILTINS

SPLITS = ("uniform", "torchtitan", "megatron")
"""The splits of the baselines: equal blocks per stage, torchtitan's default, Megatron's with the embedding and
the loss counted as layers."""
RECOMPUTED = (("uniform", FULL), ("torchtitan", FULL))
"""The splits also run with recomputation, and how: what a torchtitan user gets by turning it on."""
MEGATRON_CHUNKS = (1, 2)
"""The virtual stages per device Megatron's split runs with its best ``--recompute-num-layers``: none and two."""


def baselines(model: Model, num_devices: int, num_microbatches: int, device_memory: int,
              reserve: int = DEFAULT_RESERVE, layout: str | None = None,
              megatron_ends: tuple[int | None, int | None] = (None, None)) -> list[Baseline]:
    """``baseline_rows`` of the ``BaselineSetting`` these arguments make, field for field."""
    return baseline_rows(BaselineSetting(model, num_devices, num_microbatches, device_memory, reserve, layout,
                                         megatron_ends))


def baseline_rows(setting: BaselineSetting) -> list[Baseline]:
    """Every built-in torch schedule on every baseline split, without recomputation and as ``RECOMPUTED`` says;
    then Megatron's schedule on the setting's ``layout`` (an ``InputError`` where it does not suit the model and
    devices, ``layout_counts``) without recomputation, and on Megatron's split (``MEGATRON_CHUNKS``) and the layout
    with the best recomputation of Megatron's menu (``best_recompute``); simulated on the model's costs.
    ``megatron_ends``, when either is given, adds Megatron's uneven split ("megatron-uneven") beside its even one.
    The rows of ``baseline_part`` of each of ``PARTS``, in ``ordered`` order."""
    return ordered({part: baseline_part(setting, part) for part in PARTS})


PARTS = (*BUILTINS, MEGATRON.name)
"""The baselines in parts, each timed whole or not at all (``timed_baselines``): each built-in's rows (its torch
order built once for them all), and Megatron's."""
SPLIT_ROWS = [(split, NONE) for split in SPLITS] + list(RECOMPUTED)
"""(split, recomputation) of each built-in's rows, in order."""
NOT_TIMED = "not timed: the plan's time limit ran out first"
"""The note of a baseline row that the plan's time limit left untimed."""


def ordered(parts: dict[str, list[Baseline]]) -> list[Baseline]:
    """The rows of ``parts`` in ``baseline_rows``'s order: by split, then built-in; Megatron's last."""
    return [parts[name][i] for i in range(len(SPLIT_ROWS)) for name in BUILTINS] + parts[MEGATRON.name]


def baseline_part(setting: BaselineSetting, part: str) -> list[Baseline]:
    """The rows of one of ``PARTS``: the built-in ``part`` on each of ``SPLIT_ROWS``, or Megatron's rows."""
    if part != MEGATRON.name:
        builtin, rows = BUILTINS[part], []
        for split, recompute in SPLIT_ROWS:
            try:
                counts = _counts(split_ranges(split, setting.model, builtin.chunks * setting.num_devices))
            except InputError as exc:
                rows.append(_without_figure(split, part, None, str(exc), recompute, builtin.chunks))
                continue
            rows.append(_simulated(setting, split, part, builtin.chunks, counts, recompute))
        return rows
    return _megatron_rows(setting)


def _megatron_rows(setting: BaselineSetting) -> list[Baseline]:
    """Megatron's rows: its schedule on its uneven split (``megatron_ends`` given) and on the ``layout`` without
    recomputation, then on its split, its uneven split and the layout with ``best_recompute``."""
    model, p = setting.model, setting.num_devices
    rows, megatron = [], []
    for chunks in MEGATRON_CHUNKS:
        try:
            megatron.append(("megatron", chunks, _counts(megatron_split(model, chunks * p))))
        except InputError:
            continue  # the rows without recomputation say why
    if setting.megatron_ends != (None, None):
        for chunks in MEGATRON_CHUNKS:
            try:
                counts = _counts(megatron_uneven_split(model, p, *setting.megatron_ends, chunks))
            except InputError as exc:
                rows.append(_without_figure("megatron-uneven", megatron_schedule(chunks), None, str(exc), NONE,
                                            chunks))
                continue
            megatron.append(("megatron-uneven", chunks, counts))
            rows.append(_megatron(setting, "megatron-uneven", chunks, counts, NONE))
    if setting.layout is not None:
        given = layout_counts(model, setting.layout, p)
        megatron.append(("layout", given.chunks, given.counts))
        rows.append(_megatron(setting, "layout", given.chunks, given.counts, NONE))
    return rows + [best_recompute(setting, split, chunks, counts) for split, chunks, counts in megatron]


def timed_baselines(setting: BaselineSetting, stop_at: float) -> list[Baseline]:
    """``baseline_rows`` until ``time.monotonic()`` reaches ``stop_at`` (``base.interrupt.deadline``: the part being
    timed then is stopped where this is the main thread, else finished): the rows of each of ``PARTS`` not timed
    by then say ``NOT_TIMED``."""
    parts: dict[str, list[Baseline]] = {}
    if time.monotonic() < stop_at:
        torch_compat.has_pipelining()  # imported whole first: a module stopped halfway through its import stays broken
    try:
        with deadline(stop_at):
            for part in PARTS:
                if time.monotonic() >= stop_at:
                    break
                parts[part] = baseline_part(setting, part)
    except Deadline:
        pass
    for part in PARTS:
        if part not in parts:
            name, chunks = (part, BUILTINS[part].chunks) if part in BUILTINS else (megatron_schedule(1), 1)
            parts[part] = [_without_figure(split, name, None, NOT_TIMED, recompute, chunks)
                           for split, recompute in (SPLIT_ROWS if part in BUILTINS else [("megatron", NONE)])]
    return ordered(parts)


def best_recompute(setting: BaselineSetting, split: str, chunks: int, counts: Sequence[int]) -> Baseline:
    """Megatron's schedule (``megatron_schedule``) on the layer ``counts`` per stage with its best recomputation
    from Megatron's menu: the best single ``--recompute-num-layers`` N under ``--recompute-method block`` (the first
    N blocks of every virtual stage, ``Recompute("uniform", N)``), N from 1 to the most blocks in a stage (that one
    as "full": every block), and each ``--recompute-modules`` choice a Megatron plan of the model times
    (``targets.recompute_choices``); the fastest that fits.

    The first N that fits is the best N: the order does not depend on the costs and recomputing more blocks only
    lengthens their B, so the step time never falls as N grows. When nothing fits, the row of "full", with a
    note."""
    model = setting.model
    ranges = partition(model, len(counts), list(counts))
    most = max(sum(layer.block for layer in model.layers[a:b]) for a, b in ranges)
    for recompute in [*(Recompute("uniform", n) for n in range(1, most)), FULL]:
        ladder = _megatron(setting, split, chunks, counts, recompute)
        if ladder.fits or ladder.step_time is None:
            break
    else:
        ladder = replace(ladder, note=f"no --recompute-num-layers from 1 to {most} fits")
    modules = [_megatron(setting, split, chunks, counts, choice)
               for choice in map(parse_recompute, recompute_choices(MEGATRON.name, "auto", model)) if choice.modules]
    fitting = [row for row in (ladder, *modules) if row.fits and row.step_time is not None]
    return min(fitting, key=by_step_time, default=ladder)


def baseline_plan(model: Model, num_devices: int, num_microbatches: int, device_memory: int, reserve: int,
                  top: Baseline) -> tuple[Timeline, Costs, tuple[str, int]]:
    """``taken_baseline``: ``top`` taken as the plan, under the ``BaselineSetting`` these arguments make."""
    return taken_baseline(BaselineSetting(model, num_devices, num_microbatches, device_memory, reserve), top)


def taken_baseline(setting: BaselineSetting, top: Baseline) -> tuple[Timeline, Costs, tuple[str, int]]:
    """A baseline taken as the plan: its schedule under the activation budgets, re-simulated; its costs, placement
    and stages per device."""
    assert top.counts is not None  # a baseline that fits has a split
    timeline, costs = builtin_run(setting, top.schedule, top.chunks, top.counts, parse_recompute(top.recompute),
                                  limited=True)
    return timeline, costs, (top.placement, top.chunks)


def own_order_time(model: Model, request: Request, name: str) -> float:
    """Seconds of a step of the built-in ``name`` (a runtime's own order, ``Target.schedule_of``) on the partition,
    placement's stages per device and recomputation ``request`` asks for, infinity when it does not fit the device
    memory: how a runtime that runs its own order times a candidate."""
    # a plan's candidate: devices, device memory and partition given
    assert request.num_devices and request.device_memory is not None and isinstance(request.partition, tuple)
    setting = BaselineSetting(model, request.num_devices, request.num_microbatches, request.device_memory,
                              request.reserve, overlap=request.pairs)
    row = _simulated(setting, "plan", name, request.chunks, request.partition, parse_recompute(request.recompute))
    return row.step_time if row.fits and row.step_time is not None else math.inf


def _counts(ranges: Sequence[tuple[int, int]]) -> tuple[int, ...]:
    """Layers per stage of half-open ``ranges``."""
    return tuple(b - a for a, b in ranges)


def _megatron(setting: BaselineSetting, split: str, chunks: int, counts: Sequence[int],
              recompute: Recompute) -> Baseline:
    """Megatron's schedule on ``counts`` (the order it runs with ``recompute``, ``MEGATRON.schedule_of``: combined
    1F1B where it runs it), or the row saying why Megatron does not run it."""
    name = MEGATRON.schedule_of(setting.model, setting.num_devices, chunks, recompute)
    assert name is not None  # Megatron runs its own order
    refusal = MEGATRON.microbatch_refusal("interleaved" if chunks > 1 else "sequential", setting.num_devices,
                                          setting.num_microbatches)
    if refusal is not None:
        return _without_figure(split, name, tuple(counts), refusal, recompute, chunks)
    return _simulated(setting, split, name, chunks, counts, recompute)


def _simulated(setting: BaselineSetting, split: str, name: str, chunks: int, counts: Sequence[int],
               recompute: Recompute) -> Baseline:
    """Built-in ``name`` with ``chunks`` stages per device on the layer ``counts`` per stage, simulated; or the row
    saying why it does not run."""
    shown, counts = str(recompute), tuple(counts)
    try:
        timeline, costs = builtin_run(setting, name, chunks, counts, recompute)
    except ZbsolveError as exc:
        return _without_figure(split, name, counts, str(exc), recompute, chunks)
    needed = tuple(gib(b) for b in costs.needed(timeline.peak_memory))
    recomputed = tuple(sum(a <= i < b for i in costs.recomputed) for a, b in costs.ranges)
    return Baseline(split, name, counts, timeline.makespan, timeline.bubble_rate, needed,
                    costs.first_over(timeline.peak_memory) is None, "", shown, chunks=chunks, recomputed=recomputed)


def _without_figure(split: str, name: str, counts: tuple[int, ...] | None, note: str, recompute: Recompute,
                    chunks: int) -> Baseline:
    """The row of built-in ``name`` on ``split`` that has no figure, saying why in ``note``."""
    return Baseline(split, name, counts, None, None, None, False, note, str(recompute), chunks=chunks,
                    recomputed=None)
