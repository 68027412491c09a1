"""Megatron's ``--pipeline-model-parallel-layout`` string read into a split of a ``Model`` (``splits.megatron_layout``
writes one).

Source read: megatron-core 0.16.1 from PyPI, ``megatron/core/transformer/pipeline_parallel_layer_layout.py``:
``PipelineParallelLayerLayout.parse_str_to_list`` (the grammar), ``__init__`` (the stage count a multiple of the
pipeline size; stage i on pipeline rank i % pp as virtual stage i // pp) and ``validate_layer_layout`` (one E first,
one L last, as many t as decoder layers).

The grammar: commas are dropped; ``(...)*n`` is unrolled, then ``x*n`` (any one character); the text is cut into
stages at ``|``; each stage is a run of ``E`` (the embedding), ``t`` (a transformer block), ``m`` (an MTP layer) and
``L`` (the loss, with the final norm and the head). Over a ``Model``, ``E`` stands for the layers before the first
block, ``t`` for one block, ``L`` for the layers after the last block.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from zbsolve.base.checks import check_count
from zbsolve.base.errors import InputError
from zbsolve.problem.model import Model

SYMBOLS = "EtmL"
"""The layer symbols Megatron knows: embedding, transformer block, MTP layer, loss."""
REPEATS = (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)")
"""Megatron's unrolling, applied in order: a group ``(...)*n``, then one character ``x*n``."""
MAX_SYMBOLS = 1_000_000
"""The most characters an unrolled layout may have (far more than any model's layers)."""


class Layout(NamedTuple):
    """A layout string over a model: its stages in zbsolve's stage order and how they sit on the devices."""

    counts: tuple[int, ...]
    """Layers of the model per stage (embedding and head included), in layer order."""
    chunks: int
    """Virtual stages per device (Megatron's virtual pipeline size): stage s runs on device s % p."""


def parse_layout(text: str) -> list[str]:
    """The stages of a layout string as Megatron's ``parse_str_to_list`` reads them, each a string of symbols
    (``"Et*2|(t*2|)*2,tL"`` -> ``["Ett", "tt", "tt", "tL"]``); a symbol other than E, t, m, L after unrolling is an
    ``InputError``, as it is an ``AssertionError`` in Megatron."""
    if not isinstance(text, str):
        raise InputError(f"layout = {text!r} must be a string such as 'Et*3|(t*4|)*6,t*3L'")
    unrolled, total = text.replace(",", ""), 0

    def repeat(match: re.Match) -> str:
        nonlocal total
        total += len(match[1]) * int(match[2])
        if total > MAX_SYMBOLS:
            raise InputError(f"layout = {text!r} unrolls to more than {MAX_SYMBOLS:,} symbols")
        return match[1] * int(match[2])

    for pattern in REPEATS:
        unrolled = re.sub(pattern, repeat, unrolled)
    stages = unrolled.split("|")
    for s, stage in enumerate(stages):
        bad = next((c for c in stage if c not in SYMBOLS), None)
        if bad is not None:
            raise InputError(f"layout = {text!r}: stage {s} ({stage!r} unrolled) has the symbol {bad!r}; Megatron "
                             "knows E, t, m and L, with (...)*n, x*n, | and commas")
    return stages


def layout_counts(model: Model, text: str, num_devices: int) -> Layout:
    """The layers per stage and virtual stages per device of layout ``text`` over ``model`` on ``num_devices``
    pipeline ranks.

    Megatron's flat list of stages is in layer order, stage i on rank i % pp as virtual stage i // pp: zbsolve's
    interleaved placement (stage s on device s mod p), so the stages keep their order. ``InputError`` of one line,
    as Megatron refuses: a stage count that ``num_devices`` does not divide, E not first or L not last or either
    not once, a t count other than the model's blocks; and what zbsolve cannot take: ``m`` (MTP layers are not
    supported for dense models), an empty stage, a stage of only E (only L) where the model has no layer before
    its first block (after its last), a non-block layer between blocks (it has no symbol).
    """
    p = check_count("num_devices", num_devices)
    stages = parse_layout(text)
    if len(stages) % p:
        raise InputError(f"layout = {text!r} has {len(stages)} stages, not a multiple of num_devices = {p} (Megatron "
                         "places stage i on device i % num_devices)")
    _check_symbols(text, stages)
    blocks = [i for i, layer in enumerate(model.layers) if layer.block]
    if not blocks:
        raise InputError(f"model {model.name} has no blocks (layers with block = true) for the t of a layout")
    if sum(stage.count("t") for stage in stages) != len(blocks):
        raise InputError(f"layout = {text!r} has {sum(s.count('t') for s in stages)} t, but model {model.name} has "
                         f"{len(blocks)} blocks")
    between = next((layer.name for layer in model.layers[blocks[0]:blocks[-1]] if not layer.block), None)
    if between is not None:
        raise InputError(f"layer {between} (block = false) lies between blocks: Megatron's layout has no symbol "
                         "for it (E, t, m and L only)")
    before, after = blocks[0], len(model.layers) - 1 - blocks[-1]
    counts = [stage.count("t") + before * stage.count("E") + after * stage.count("L") for stage in stages]
    empty = next((s for s, count in enumerate(counts) if count == 0), None)
    if empty is not None:
        held = f" holds only {stages[empty]}, for which model {model.name} has no layer" if stages[empty] else ""
        raise InputError(f"layout = {text!r}: stage {empty}{held or ' is empty'}; zbsolve times every stage's F, B "
                         "and W")
    return Layout(tuple(counts), len(stages) // p)


def _check_symbols(text: str, stages: list[str]) -> None:
    """Megatron's ``validate_layer_layout`` on the symbols: one E first, one L last; no m (dense models only)."""
    flat = "".join(stages)
    if "m" in flat:
        s = next(s for s, stage in enumerate(stages) if "m" in stage)
        raise InputError(f"layout = {text!r}: stage {s} has an MTP layer (m); multi-token prediction is not "
                         "supported for dense models")
    for symbol, what, end, at in (("E", "embedding", "first", 0), ("L", "loss", "last", -1)):
        if flat.count(symbol) != 1:
            raise InputError(f"layout = {text!r}: the {what} {symbol} must appear once, but appears "
                             f"{flat.count(symbol)} times")
        if flat[at] != symbol:
            raise InputError(f"layout = {text!r}: the {what} {symbol} must be the {end} layer, but {flat[at]} is")
