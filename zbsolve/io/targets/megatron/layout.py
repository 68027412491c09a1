"""Megatron's ``--pipeline-model-parallel-layout`` string read into a split of a ``Model``, and written for any split
(``megatron_layout``).

Source read: megatron-core 0.16.1 from PyPI, ``megatron/core/transformer/pipeline_parallel_layer_layout.py``:
``PipelineParallelLayerLayout.parse_str_to_list`` (the grammar), ``__init__`` (the stage count a multiple of the
pipeline size; stage i on pipeline rank i % pp as virtual stage i // pp) and ``validate_layer_layout`` (one E first,
one L last, as many t as decoder layers; as many m as ``mtp_num_layers``, none without MTP layers; "decoder layers
must be placed before MTP layers"; "the MTP should be always in the last virtual pipeline stage of that rank"; "All
of the MTP layers must be in the same one virtual pipeline stage"; an MTP stage on a rank other than the last is
"standalone", which it allows).

The grammar: commas are dropped; ``(...)*n`` is unrolled, then ``x*n`` (any one character); the text is cut into
stages at ``|``; each stage is a run of ``E`` (the embedding), ``t`` (a transformer block), ``m`` (an MTP layer) and
``L`` (the loss, with the final norm and the head). Over a ``Model`` (``layer_symbols``), ``E`` stands for the layers
before the first block, ``t`` for one block, ``m`` for one MTP layer (named ``mtp.*``, as ``zbsolve estimate`` names
DeepSeek-V3's), ``L`` for the layers after the last block and MTP layer.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple

from zbsolve.base.checks import check_count
from zbsolve.base.errors import InputError
from zbsolve.costmodel.model import Model
from zbsolve.problem.partition import check_ranges

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


def layer_symbols(model: Model) -> str:
    """Megatron's symbol of each layer of ``model``, in layer order: ``E`` before the first block, ``t`` a block,
    ``m`` an MTP layer (its name starts with ``mtp.``), ``L`` after the last block and MTP layer.

    ``InputError`` of one line where the layers are not in Megatron's order (E, then t, then m, then L): a model
    without blocks, an MTP layer before a block ("decoder layers must be placed before MTP layers"), another
    non-block layer between blocks or among the MTP layers (it has no symbol)."""
    mtp = [layer.mtp for layer in model.layers]
    blocks = [i for i, layer in enumerate(model.layers) if layer.block and not mtp[i]]
    if not blocks:
        raise InputError(f"model {model.name} has no blocks (layers with block = true) for the t of a layout")
    end = max((i for i, is_mtp in enumerate(mtp) if is_mtp), default=blocks[-1])
    symbols = "".join("m" if mtp[i] else "E" if i < blocks[0] else "L" if i > end else "t" if layer.block else "?"
                      for i, layer in enumerate(model.layers))
    early = symbols.find("m")
    if 0 <= early < blocks[-1]:
        raise InputError(f"MTP layer {model.layers[early].name} comes before block {model.layers[blocks[-1]].name}: "
                         "Megatron places the MTP layers (m) after every decoder layer (t)")
    if "?" in symbols:
        i = symbols.index("?")
        where = "between blocks" if i < blocks[-1] else "between the last block and the last MTP layer"
        raise InputError(f"layer {model.layers[i].name} (block = false) lies {where}: Megatron's layout has no "
                         "symbol for it (E, t, m and L only)")
    return symbols


def layout_counts(model: Model, text: str, num_devices: int) -> Layout:
    """The layers per stage and virtual stages per device of layout ``text`` over ``model`` on ``num_devices``
    pipeline ranks.

    Megatron's flat list of stages is in layer order, stage i on rank i % pp as virtual stage i // pp: zbsolve's
    interleaved placement (stage s on device s mod p), so the stages keep their order; the MTP layers count in the
    stage of their m. ``InputError`` of one line, as Megatron refuses: a stage count that ``num_devices`` does not
    divide, E not first or L not last or either not once, a t count other than the model's blocks, an m count other
    than its MTP layers, a t after an m, an m outside the last virtual stage of its device, m in more than one
    stage; and what zbsolve cannot take: an empty stage, a stage of only E (only L) where the model has no layer
    before its first block (after its last block and MTP layer), layers out of Megatron's order (``layer_symbols``).
    """
    p = check_count("num_devices", num_devices)
    stages = parse_layout(text)
    if len(stages) % p:
        raise InputError(f"layout = {text!r} has {len(stages)} stages, not a multiple of num_devices = {p} (Megatron "
                         "places stage i on device i % num_devices)")
    _check_ends(text, stages)
    symbols = layer_symbols(model)
    if sum(stage.count("t") for stage in stages) != symbols.count("t"):
        raise InputError(f"layout = {text!r} has {sum(s.count('t') for s in stages)} t, but model {model.name} has "
                         f"{symbols.count('t')} blocks")
    _check_mtp(model, text, stages, p, symbols.count("m"))
    before, after = symbols.count("E"), symbols.count("L")
    counts = [stage.count("t") + stage.count("m") + before * stage.count("E") + after * stage.count("L")
              for stage in stages]
    empty = next((s for s, count in enumerate(counts) if count == 0), None)
    if empty is not None:
        held = f" holds only {stages[empty]}, for which model {model.name} has no layer" if stages[empty] else ""
        raise InputError(f"layout = {text!r}: stage {empty}{held or ' is empty'}; zbsolve times every stage's F, B "
                         "and W")
    return Layout(tuple(counts), len(stages) // p)


def _check_ends(text: str, stages: list[str]) -> None:
    """Megatron's ``validate_layer_layout`` on the ends: one E, first; one L, last."""
    flat = "".join(stages)
    for symbol, what, end, at in (("E", "embedding", "first", 0), ("L", "loss", "last", -1)):
        if flat.count(symbol) != 1:
            raise InputError(f"layout = {text!r}: the {what} {symbol} must appear once, but appears "
                             f"{flat.count(symbol)} times")
        if flat[at] != symbol:
            raise InputError(f"layout = {text!r}: the {what} {symbol} must be the {end} layer, but {flat[at]} is")


def _check_mtp(model: Model, text: str, stages: list[str], p: int, mtp: int) -> None:
    """Megatron's ``validate_layer_layout`` on the m of ``stages`` (on ``p`` devices) over ``mtp`` MTP layers: as
    many m, after every t, in the last virtual stage of a device (stage i >= stages - p), all in one stage."""
    flat = "".join(stages)
    if flat.count("m") != mtp:
        if not mtp:
            raise InputError(f"model {model.name} has no MTP layers (mtp.*) for the m of layout = {text!r}")
        raise InputError(f"layout = {text!r} has {flat.count('m')} m, but model {model.name} has {mtp} MTP layers "
                         "(mtp.*); Megatron needs one m each")
    if not mtp:
        return
    if "t" in flat[flat.index("m"):]:
        raise InputError(f"layout = {text!r}: a t follows an m; Megatron places the MTP layers (m) after every "
                         "decoder layer (t)")
    held = [s for s, stage in enumerate(stages) if "m" in stage]
    if held[0] < len(stages) - p:
        raise InputError(f"layout = {text!r}: stage {held[0]} holds an m but is not the last virtual stage of device "
                         f"{held[0] % p}; Megatron keeps the MTP layers there")
    if len(held) > 1:
        raise InputError(f"layout = {text!r}: the m lie in stages {', '.join(map(str, held))}; Megatron keeps all "
                         "MTP layers in one virtual stage")


def megatron_layout(model: Model, ranges: Sequence[Sequence[int]], num_devices: int) -> str:
    """The ``--pipeline-model-parallel-layout`` string of ``ranges`` placed looped, stage s on device
    s % ``num_devices`` (``--pipeline-model-parallel-size`` = num_devices; the virtual stages per device follow
    from the number of stages), e.g. ``"Et*3|t*4|t*4|t*2L"``, or ``"Et*3|t*4|t*4|tmL"`` with an MTP layer.

    The grammar (``PipelineParallelLayerLayout.parse_str_to_list`` in
    ``megatron/core/transformer/pipeline_parallel_layer_layout.py``): stages separated by ``|`` in layer order,
    stage i on pipeline rank i % pp in virtual stage i // pp; ``E`` the embedding, ``t`` a transformer block,
    ``m`` an MTP layer, ``L`` the loss (with the final norm and the head); ``x*n`` repeats one symbol, ``(...)*n``
    a group, commas are ignored. ``E`` must come first and ``L`` last, each once; ``validate_layer_layout`` keeps
    every ``m`` after the last ``t``, in one virtual stage, the last of its rank.

    Here the layers before the first block are the ``E`` of the first stage, each block a ``t``, each MTP layer
    (``mtp.*``) an ``m``, those after the last block and MTP layer the ``L`` of the last stage (written even where
    the model lists no such layer: Megatron always has them). A stage boundary among the layers before the first
    block, among the MTP layers or after them, an MTP stage that is not the last virtual stage of its device, and
    layers out of Megatron's order (``layer_symbols``) have no layout: an ``InputError``; so is a stage
    count that ``num_devices`` does not divide.
    """
    ranges = check_ranges(model, ranges)
    check_count("num_devices", num_devices)
    if len(ranges) % num_devices:
        raise InputError(f"num_devices = {num_devices} does not divide the {len(ranges)} stages: Megatron's layout "
                         "places stage i on device i % num_devices with the same stages on every device")
    symbols = layer_symbols(model)
    names = [layer.name for layer in model.layers]
    first, tail = symbols.index("t"), len(symbols) - symbols.count("L")
    mtp = range(symbols.find("m"), tail) if "m" in symbols else range(0)
    for s, (a, _) in enumerate(ranges[1:], 1):
        if a < first or a > tail or a in mtp[1:]:
            where = ("the layers before the first block (one E)" if a < first else "the MTP layers (one virtual "
                     "stage)" if a in mtp else f"the layers after the last {'MTP layer' if mtp else 'block'} (one L)")
            raise InputError(f"stage {s} starts at layer {names[a]}, splitting {where}: Megatron's layout cannot "
                             "express that boundary")
    stages = []
    for s, (a, b) in enumerate(ranges):
        runs = "".join(x if n == 1 else f"{x}*{n}" if n else "" for x, n in
                       (("t", symbols[a:b].count("t")), ("m", symbols[a:b].count("m"))))
        if "m" in runs and s < len(ranges) - num_devices:
            raise InputError(f"stage {s} holds MTP layer {names[mtp[0]]} but is not the last virtual stage of device "
                             f"{s % num_devices}: Megatron keeps the MTP layers there")
        stages.append(("E" if s == 0 else "") + runs + ("L" if s == len(ranges) - 1 else ""))
    return "|".join(stages)


def _stage_text(stage: str) -> str:
    """One stage's symbols as ``megatron_layout`` writes them: each run of one symbol longer than 1 as ``x*n``."""
    runs = [(m[0][0], len(m[0])) for m in re.finditer(r"(.)\1*", stage)]
    return "".join(symbol if n == 1 else f"{symbol}*{n}" for symbol, n in runs)


def grouped_layout(text: str) -> str:
    """The shortest layout string Megatron parses to the same stages as ``text`` with each stage written as
    ``megatron_layout`` writes it (``_stage_text``: ``t*2``): repeated runs of stages grouped as ``(...|)*n``
    (``"Et|t*2|t*2|t*2|tL"`` -> ``"Et|(t*2|)*3tL"``).

    megatron-core 0.16.1's ``parse_str_to_list`` unrolls ``(...)*n`` (no nesting: ``[^)]+``) before ``x*n``, so a
    group may hold ``x*n`` but no group; the last stage (the only one with L) is never in one. Among the
    groupings of the stages, the shortest is found exactly (a stage count squared, times its divisors)."""
    stages = parse_layout(text)
    tokens = [_stage_text(stage) + "|" for stage in stages[:-1]]
    best: list[str] = [""]
    for end in range(1, len(tokens) + 1):
        choices = [best[end - 1] + tokens[end - 1]]
        for start in range(end - 1):
            span = end - start
            for period in range(1, span // 2 + 1):
                if span % period or tokens[start:end] != tokens[start:start + period] * (span // period):
                    continue
                choices.append(best[start] + f"({''.join(tokens[start:start + period])})*{span // period}")
        best.append(min(choices, key=len))
    return best[-1] + _stage_text(stages[-1])
