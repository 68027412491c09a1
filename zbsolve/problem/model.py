"""A model as an ordered list of layers with costs in real units (seconds, bytes), its partition into pipeline
stages, and the per-stage ``Profile`` a partition gives: each stage's figure is the exact sum of its layers'.

Stored as YAML under ``problems/models/``; ``zbsolve estimate`` writes one from a Hugging Face config.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, ClassVar, Literal, Optional

import yaml
from pydantic import BeforeValidator, ConfigDict, Field, PositiveInt, model_validator

from zbsolve.base.checks import check_count
from zbsolve.base.errors import InputError
from zbsolve.base.files import write_atomic
from zbsolve.core.profile import InputModel, Profile

Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]
"""A non-negative, finite duration in seconds."""
Flops = Annotated[float, Field(ge=0, allow_inf_nan=False)]
"""A non-negative, finite count of floating-point operations."""


def _whole(value: object) -> object:
    """An integral float (``1e9``) as an int; anything else as given, for the int check to judge."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


Bytes = Annotated[int, BeforeValidator(_whole)]
"""A whole number of bytes."""
BLOCK = re.compile(r"layers\.\d+")
"""Names of the repeated blocks in torchtitan's FQNs (``layers.0``, ``layers.1``, ...), which tables shorten."""


class Layer(InputModel):
    """One layer: its pass times, the activation memory its passes allocate and free, and what it holds."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    what: ClassVar[str] = "layer"

    name: str = Field(min_length=1)
    """The torch module FQN where known: ``tok_embeddings``, ``layers.0``, ..., ``norm``, ``output``."""
    block: bool = True
    """One of the model's repeated blocks (a uniform partition deals these out); False for the embedding, the
    final norm and the head."""
    t_f: Seconds
    """Forward pass F, seconds."""
    t_b: Seconds
    """Input-gradient pass B, seconds."""
    t_w: Seconds
    """Weight-gradient pass W, seconds."""
    mem_f: Bytes = Field(ge=0)
    """Activation bytes F allocates (the paper's M_B)."""
    mem_b: Bytes
    """Activation bytes B changes (M_W - M_B: what W needs stays)."""
    mem_w: Bytes = Field(le=0)
    """Activation bytes W changes (-M_W); mem_f + mem_b + mem_w = 0."""
    static_bytes: Bytes = Field(ge=0)
    """Bytes held for the whole step: weights, their gradients and optimizer states."""
    out_bytes: Bytes = Field(ge=0)
    """Bytes of the output activation, sent to the next stage when a stage boundary follows this layer."""
    flops_f: Optional[Flops] = None
    """FLOPs of F, where known (estimates)."""
    flops_b: Optional[Flops] = None
    """FLOPs of B, where known."""
    flops_w: Optional[Flops] = None
    """FLOPs of W, where known."""
    shares: Optional[str] = None
    """The layer whose weights this one uses (tied embeddings): a stage holding both holds them once."""

    @model_validator(mode="after")
    def _balanced(self) -> "Layer":
        if self.mem_f + self.mem_b + self.mem_w:
            raise ValueError(f"mem_f + mem_b + mem_w = {self.mem_f} + {self.mem_b} + {self.mem_w} = "
                             f"{self.mem_f + self.mem_b + self.mem_w}, must be 0")
        return self


class Link(InputModel):
    """The link between consecutive stages: a transfer of n bytes takes n / bytes_per_s + latency_s."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    what: ClassVar[str] = "link"

    name: str = ""
    """What the link is, e.g. "nvlink" or "network"."""
    bytes_per_s: float = Field(gt=0, allow_inf_nan=False)
    """Bandwidth per direction, bytes/s."""
    latency_s: Seconds = 0.0
    """Seconds added to every transfer."""

    def time(self, num_bytes: int) -> float:
        """Seconds to send ``num_bytes``."""
        return num_bytes / self.bytes_per_s + self.latency_s


class Setting(InputModel):
    """The training setting the costs are for."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    what: ClassVar[str] = "setting"

    seq_len: PositiveInt
    """Tokens per sequence."""
    microbatch_size: PositiveInt
    """Sequences per microbatch."""
    tp: PositiveInt = 1
    """Tensor-parallel degree: every figure is per device of the tensor-parallel group."""
    dp: PositiveInt = 1
    """Data-parallel degree."""
    zero: Literal[0, 1] = 0
    """ZeRO stage: 1 shards the optimizer states over the dp replicas."""
    dtype: str = "bf16"
    """Type of weights and activations."""
    gpu: Optional[str] = None
    """The GPU preset of an estimate (zbsolve.problem.estimate.gpus), or the device measured on."""
    efficiency: Optional[float] = Field(None, gt=0, le=1, allow_inf_nan=False)
    """Fraction of the peak throughput an estimate assumes."""

    @property
    def tokens(self) -> int:
        """Tokens of one microbatch."""
        return self.seq_len * self.microbatch_size


class Model(InputModel):
    """A model's layers in order, with what it takes to move an activation between stages."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    what: ClassVar[str] = "model"

    name: str = "model"
    """Short name, e.g. "llama3-8b"."""
    source: str = ""
    """How the costs were obtained (for an estimate, the command that writes this file)."""
    t_comm: Optional[Seconds] = None
    """Seconds to move an activation between stages; None derives it from ``link`` and the out_bytes at each
    stage boundary (0 when there is neither)."""
    link: Optional[Link] = None
    """The link between stages, to derive t_comm from."""
    setting: Optional[Setting] = None
    """The training setting the costs are for."""
    layers: list[Layer] = Field(min_length=1)
    """The layers in the order the forward pass runs them."""

    @model_validator(mode="after")
    def _check(self) -> "Model":
        names = [layer.name for layer in self.layers]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"layer names must be unique: {', '.join(twice)} appear more than once")
        for layer in self.layers:
            if layer.shares is not None and (layer.shares not in names or layer.shares == layer.name):
                raise ValueError(f"layer {layer.name}: shares = {layer.shares!r} must name another layer")
        if self.t_comm is not None and self.link is not None:
            raise ValueError("give t_comm or link, not both")
        return self

    def save(self, path: str | Path) -> None:
        """Write the model as YAML (``.yaml``/``.yml``, one line per layer) or JSON, whole or not at all."""
        path = Path(path)
        data = self.model_dump(exclude_none=True)
        text = (yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=1 << 16)
                if path.suffix in (".yaml", ".yml") else json.dumps(data, indent=1) + "\n")
        write_atomic(path, text)

    def total_flops(self) -> float:
        """FLOPs of F, B and W over every layer, for one microbatch on one device."""
        missing = [layer.name for layer in self.layers if None in (layer.flops_f, layer.flops_b, layer.flops_w)]
        if missing:
            raise InputError(f"model {self.name}: layer {missing[0]} has no FLOPs (only estimates record them)")
        return sum(layer.flops_f + layer.flops_b + layer.flops_w for layer in self.layers)  # type: ignore[operator]

    def flops_per_token(self) -> float:
        """Training FLOPs (F + B + W) per token of the whole model, over every device of a tensor-parallel group."""
        if self.setting is None:
            raise InputError(f"model {self.name} has no setting: its tokens per microbatch are unknown")
        return self.total_flops() * self.setting.tp / self.setting.tokens


def partition(model: Model, num_stages: int, spec: str | Sequence[int] = "uniform") -> list[tuple[int, int]]:
    """Half-open ranges of ``model.layers`` per stage, in stage order.

    ``spec`` is "uniform" (blocks dealt out evenly, the first stages taking one more when they do not divide;
    layers before the first block on the first stage, the final norm and head on the last), or the number of
    layers (entries of ``model.layers``, embedding and head included) of each stage, as a list or as text such as
    "5,4,4,4,4,4,4,6".
    """
    check_count("num_stages", num_stages)
    if isinstance(spec, str) and spec.strip() == "uniform":
        return _uniform(model, num_stages)
    counts = _counts(spec)
    if len(counts) != num_stages:
        raise InputError(f"partition = {_shown(spec)}: {len(counts)} stages, but num_stages = {num_stages}")
    if sum(counts) != len(model.layers):
        raise InputError(f"partition = {_shown(spec)}: the counts sum to {sum(counts)}, but {model.name} has "
                         f"{len(model.layers)} layers")
    ends = [sum(counts[:s + 1]) for s in range(num_stages)]
    return check_ranges(model, list(zip([0] + ends[:-1], ends)))


def _counts(spec: str | Sequence[int]) -> list[int]:
    """Layer counts per stage from a list or from comma-separated text; each a positive integer."""
    if isinstance(spec, str):
        try:
            counts: list = [int(x) for x in spec.split(",")]
        except ValueError:
            raise InputError(f"partition = {spec!r}: should be 'uniform' or comma-separated layer counts per "
                             "stage, e.g. '5,4,4,6'") from None
    elif isinstance(spec, Sequence):
        counts = list(spec)
    else:
        raise InputError(f"partition = {spec!r}: should be 'uniform' or a list of layer counts per stage")
    for s, count in enumerate(counts):
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise InputError(f"partition = {_shown(spec)}: stage {s} has {count!r} layers; each stage needs a "
                             "whole number >= 1")
    return counts


def _shown(spec: str | Sequence[int]) -> str:
    return repr(spec if isinstance(spec, str) else list(spec))


def _uniform(model: Model, num_stages: int) -> list[tuple[int, int]]:
    """Blocks dealt out evenly; each stage after the first starts at its first block."""
    blocks = [i for i, layer in enumerate(model.layers) if layer.block]
    if len(blocks) < num_stages:
        raise InputError(f"partition = 'uniform': {model.name} has {len(blocks)} blocks, fewer than num_stages = "
                         f"{num_stages}; give layer counts per stage")
    per, extra = divmod(len(blocks), num_stages)
    firsts = [sum(per + (s < extra) for s in range(stage)) for stage in range(num_stages)]
    starts = [0] + [blocks[i] for i in firsts[1:]]
    return check_ranges(model, list(zip(starts, starts[1:] + [len(model.layers)])))


def check_ranges(model: Model, ranges: Sequence[Sequence[int]]) -> list[tuple[int, int]]:
    """``ranges`` as (first, end) tuples if they cover every layer of ``model`` once, in order, none empty; an
    ``InputError`` naming the stage at fault otherwise."""
    n = len(model.layers)
    out: list[tuple[int, int]] = []
    for s, pair in enumerate(ranges):
        if (not isinstance(pair, Sequence) or len(pair) != 2
                or not all(isinstance(x, int) and not isinstance(x, bool) for x in pair)):
            raise InputError(f"stage {s} = {pair!r}: should be a pair of layer indices [first, end)")
        first, end = pair
        expected = out[-1][1] if out else 0
        if first != expected:
            raise InputError(f"stage {s} = [{first}, {end}): should start at layer {expected} (every layer once, "
                             "in order)")
        if end <= first:
            raise InputError(f"stage {s} = [{first}, {end}) is empty; every stage needs at least one layer")
        if end > n:
            raise InputError(f"stage {s} = [{first}, {end}) ends past the last layer: {model.name} has {n} layers")
        out.append((first, end))
    if not out or out[-1][1] != n:
        covered = out[-1][1] if out else 0
        raise InputError(f"stages cover layers [0, {covered}), but {model.name} has {n} layers")
    return out


def stage_profile(model: Model, ranges: Sequence[Sequence[int]]) -> Profile:
    """The per-stage profile of ``model`` cut at ``ranges``: each stage's times (seconds) and memory deltas
    (bytes) are the sums of its layers', and t_comm is the model's, or the link's time for the largest
    activation crossing a stage boundary."""
    ranges = check_ranges(model, ranges)
    sums = {name: [sum(getattr(layer, name) for layer in model.layers[a:b]) for a, b in ranges]
            for name in TIMES + ("mem_f", "mem_b", "mem_w")}
    for s, (a, b) in enumerate(ranges):
        missing = untimed(model.layers[a:b])
        if missing:
            raise InputError(f"stage {s} ({module_names(model, [(a, b)])}) has {missing} = 0: every stage needs "
                             "positive F, B and W times")
    return Profile(**sums, t_comm=comm_time(model, ranges))


TIMES = ("t_f", "t_b", "t_w")
"""The pass times of a layer; every stage needs some of each."""


def untimed(layers: Sequence[Layer]) -> str | None:
    """The first pass time (t_f, t_b, t_w) that none of ``layers`` has, or None: a stage of them needs all three."""
    return next((name for name in TIMES if not any(getattr(layer, name) > 0 for layer in layers)), None)


def comm_time(model: Model, ranges: Sequence[Sequence[int]]) -> float:
    """Seconds to move an activation between stages: the model's t_comm, else the link's time for the largest
    out_bytes at a stage boundary, else 0."""
    if model.t_comm is not None:
        return model.t_comm
    ranges = check_ranges(model, ranges)
    if model.link is None or len(ranges) == 1:
        return 0.0
    return max(model.link.time(model.layers[b - 1].out_bytes) for _, b in ranges[:-1])


def stage_static_bytes(model: Model, ranges: Sequence[Sequence[int]]) -> list[int]:
    """Per stage, the static bytes of its layers, a weight shared by two layers of the stage counted once."""
    return [held_static_bytes(model.layers[a:b]) for a, b in check_ranges(model, ranges)]


def held_static_bytes(layers: Sequence[Layer]) -> int:
    """The static bytes of ``layers`` held together, a weight two of them share counted once."""
    names = {layer.name for layer in layers}
    return sum(layer.static_bytes for layer in layers if layer.shares not in names)


def module_names(model: Model, ranges: Sequence[Sequence[int]]) -> str:
    """The model's own names of the layers in the half-open ``ranges``, in order, each run of numbered modules as
    one (``tok_embeddings, layers.0-3``, ``layers.10-12``, ``layers.28-31, norm, output``): how a stage or a
    device is labelled wherever a user reads it."""
    runs: list[tuple[str, int, int] | str] = []
    for a, b in ranges:
        for layer in model.layers[a:b]:
            prefix, dot, index = layer.name.rpartition(".")
            last = runs[-1] if runs else None
            if not (dot and index.isdigit()):
                runs.append(layer.name)
            elif isinstance(last, tuple) and last[0] == prefix and last[2] == int(index) - 1:
                runs[-1] = (prefix, last[1], int(index))
            else:
                runs.append((prefix, int(index), int(index)))
    return ", ".join(run if isinstance(run, str) else f"{run[0]}.{run[1]}" + (f"-{run[2]}" if run[2] > run[1] else "")
                     for run in runs)



LAYER_COLUMNS = ("layer", "F ms", "B ms", "W ms", "mem_f MiB", "mem_b MiB", "mem_w MiB", "static GiB", "out MiB")
"""Columns of ``layer_rows``."""
_COSTS = ("t_f", "t_b", "t_w", "mem_f", "mem_b", "mem_w", "static_bytes", "out_bytes")
MIB, GIB = 2**20, 2**30


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
    return ([f"{1e3 * t:.3f}" for t in (t_f, t_b, t_w)] + [f"{m / MIB:.1f}" for m in (mem_f, mem_b, mem_w)]
            + [f"{static / GIB:.2f}", f"{out / MIB:.1f}"])


def _run_name(group: list[Layer]) -> str:
    """A run of layers by name: ``layers.0..31 (x32)`` for blocks named by index."""
    if len(group) == 1:
        return group[0].name
    first, last = group[0].name, group[-1].name
    if BLOCK.fullmatch(first) and BLOCK.fullmatch(last):
        return f"{first}..{last.split('.')[1]} (x{len(group)})"
    return f"{first} .. {last} (x{len(group)})"
