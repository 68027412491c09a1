"""Models split into pipeline stages, or into their layers: a small GPT, or a user's ``module:function``."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from types import ModuleType

import torch
from torch import nn
from torch.nn import functional

from zbsolve.base.errors import InputError
from zbsolve.execute.recompute import checkpoint, recompute_output


class Block(nn.Module):
    """One pre-norm transformer block: causal self-attention then an MLP. ``selective``: the outputs of its norms and
    of the MLP's GELU are not kept for backward but recomputed once by the first backward that reads them
    (``zbsolve.execute.recompute.recompute_output``)."""

    def __init__(self, hidden: int, heads: int, selective: bool = False) -> None:
        super().__init__()
        self.heads = heads
        self.selective = selective
        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, h = x.shape
        q, k, v = self._then(self.ln1, x, self.qkv).view(n, t, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        a = functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(n, t, h))
        fc, act, out = self.mlp
        return x + self._then(act, self._then(self.ln2, x, fc), out)

    def _then(self, fn: nn.Module, x: torch.Tensor, consumer: nn.Module) -> torch.Tensor:
        """``consumer(fn(x))``, with ``fn(x)`` recomputed for backward if the block is selective."""
        return recompute_output(fn, x, consumer) if self.selective else consumer(fn(x))


@dataclass(frozen=True)
class GPTSizes:
    """The built-in GPT's sizes, whatever its blocks and their cut into stages."""

    hidden: int = 32
    """Hidden size."""
    heads: int = 2
    """Attention heads (``hidden`` is a multiple of them)."""
    vocab: int = 64
    """Vocabulary size."""
    seq_len: int = 16
    """Sequence length."""


class GPTStage(nn.Module):
    """A run of consecutive blocks: the first stage embeds token ids before them, the last ends with the final norm
    and the LM head (the norm may end the stage before it instead). The blocks at the positions ``recompute`` names
    run under ``zbsolve.execute.recompute.checkpoint``: their forward keeps only its input, runs again once when the
    backward first needs what it saved, and what that saves stays until the graph is freed (W reuses it). Those at
    the positions ``selective`` names recompute only their norms' and GELU's outputs the same way (``Block``)."""

    def __init__(self, blocks: int, *, embed: bool, norm: bool, head: bool, sizes: GPTSizes,
                 recompute: Collection[int] = (), selective: Collection[int] = ()) -> None:
        super().__init__()
        both = sorted(set(recompute) & set(selective))
        if both:
            raise InputError(f"blocks at positions {both} are both recomputed and selective; a block is at most one")
        hidden = sizes.hidden
        self.embed = nn.Embedding(sizes.vocab, hidden) if embed else None
        self.pos = nn.Parameter(0.02 * torch.randn(sizes.seq_len, hidden)) if embed else None
        self.blocks = nn.ModuleList(Block(hidden, sizes.heads, selective=i in selective) for i in range(blocks))
        self.norm = nn.LayerNorm(hidden) if norm else None
        self.head = nn.Linear(hidden, sizes.vocab, bias=False) if head else None
        self.recompute = tuple(i in recompute for i in range(blocks))
        self.selective = tuple(i in selective for i in range(blocks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            assert self.pos is not None, "a stage that embeds holds the positions too"
            x = embed_tokens(self.embed, self.pos, x)
        for block, again in zip(self.blocks, self.recompute):
            x = checkpoint(block, x) if again else block(x)
        if self.norm is not None:
            x = self.norm(x)
        if self.head is not None:
            x = self.head(x)
        return x


def embed_tokens(embed: nn.Embedding, pos: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Token embeddings of ``ids`` (batch, seq_len) plus the learned positions ``pos``."""
    return embed(ids) + pos[: ids.shape[1]]


class Embedding(nn.Module):
    """The GPT's first layer as a module of its own: a first stage's token embedding and positions."""

    def __init__(self, embed: nn.Embedding, pos: nn.Parameter) -> None:
        super().__init__()
        self.embed = embed
        self.pos = pos

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return embed_tokens(self.embed, self.pos, ids)


@dataclass(frozen=True)
class _Cut:
    """The GPT layers one stage holds."""

    embed: bool
    blocks: int
    norm: bool
    head: bool


def build_stages(num_stages: int, sizes: GPTSizes, *, layers: int, seed: int, recompute: Collection[str] = (),
                 selective: Collection[str] = ()) -> list[nn.Module]:
    """A GPT of ``sizes`` and ``layers`` blocks cut into ``num_stages`` stages, the same weights for the same
    ``seed``; the blocks ``recompute`` names (``blocks.i``) checkpointed, those ``selective`` names selectively
    recomputed (``Block``).

    Stage 0 takes token ids (batch, seq_len); the last stage returns logits (batch, seq_len, vocab).
    """
    if num_stages < 1 or layers < num_stages:
        raise InputError(f"layers = {layers} must be >= num_stages = {num_stages} >= 1")
    counts = [layers // num_stages + (1 if s < layers % num_stages else 0) for s in range(num_stages)]
    last = num_stages - 1
    return _build([_Cut(s == 0, c, s == last, s == last) for s, c in enumerate(counts)], sizes, seed=seed,
                  recompute=recompute, selective=selective)


def build_partitioned(partition: Sequence[Sequence[str]], sizes: GPTSizes, *, layers: int | None, seed: int,
                      recompute: Collection[str] = (), selective: Collection[str] = ()) -> list[nn.Module]:
    """The GPT of ``sizes`` cut as ``partition`` names each stage's layers (a schedule document's partition:
    ``embed``, ``blocks.0`` ..., ``norm``, ``head`` in order), the same weights for the same ``seed`` however it is
    cut; the blocks ``recompute`` names (the document's ``partition.recompute``, by name) checkpointed, those
    ``selective`` names selectively recomputed (``Block``).

    ``layers`` (None: the partition's) must be the number of blocks the partition names. An ``InputError`` line
    names the stage or layer at fault otherwise.
    """
    for s, names in enumerate(partition):
        if not names:
            raise InputError(f"partition stage {s} holds no layers; every stage needs at least one")
    if partition[0][0] != "embed":
        raise InputError(f"partition stage 0 starts with layer {partition[0][0]!r}, but the GPT's first stage must "
                         "start with 'embed'")
    if partition[-1][-1] != "head":
        raise InputError(f"partition stage {len(partition) - 1} ends with layer {partition[-1][-1]!r}, but the GPT's "
                         "last stage must end with 'head' (it takes the loss)")
    names = [name for stage in partition for name in stage]
    blocks = sum(1 for name in names if name.startswith("blocks."))
    expected = ["embed", *(f"blocks.{i}" for i in range(blocks)), "norm", "head"]
    if names != expected:  # both end with "head", so the first difference lies within names
        i = next((i for i, (got, want) in enumerate(zip(names, expected)) if got != want), len(expected))
        raise InputError(f"partition layer {i} = {names[i]!r}, but the GPT's layers are embed, blocks.0, blocks.1, "
                         "..., norm, head, in that order")
    if layers is not None and layers != blocks:
        raise InputError(f"layers = {layers}, but the partition holds {blocks} GPT blocks; leave layers out or give "
                         f"{blocks}")
    cuts = [_Cut("embed" in stage, sum(1 for name in stage if name.startswith("blocks.")), "norm" in stage,
                 "head" in stage) for stage in partition]
    return _build(cuts, sizes, seed=seed, recompute=recompute, selective=selective)


def _build(cuts: list[_Cut], sizes: GPTSizes, *, seed: int, recompute: Collection[str],
           selective: Collection[str]) -> list[nn.Module]:
    """One ``GPTStage`` per cut, built in forward order under ``seed`` so that the weights do not depend on the cut;
    block ``blocks.i`` is the i-th block in forward order, checkpointed when ``recompute`` names it, selectively
    recomputed when ``selective`` does (never both)."""
    if sizes.hidden < 1 or sizes.heads < 1 or sizes.hidden % sizes.heads:
        raise InputError(f"hidden = {sizes.hidden} must be a positive multiple of heads = {sizes.heads}")
    if sizes.vocab < 2 or sizes.seq_len < 1:
        raise InputError(f"vocab = {sizes.vocab} must be >= 2 and seq_len = {sizes.seq_len} >= 1")
    firsts = [sum(c.blocks for c in cuts[:s]) for s in range(len(cuts) + 1)]
    blocks = [f"blocks.{i}" for i in range(firsts[-1])]
    for what, names in (("recompute", recompute), ("selective", selective)):
        for name in names:
            if name not in blocks:
                raise InputError(f"{what} names layer {name!r}, which is not one of the GPT's {len(blocks)} blocks "
                                 "(blocks.0, blocks.1, ...); only blocks recompute")
    both = [name for name in blocks if name in recompute and name in selective]
    if both:
        raise InputError(f"{', '.join(both)} named by both recompute and selective; a block recomputes either whole "
                         "or selectively")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return [GPTStage(c.blocks, embed=c.embed, norm=c.norm, head=c.head, sizes=sizes,
                         recompute={i for i in range(c.blocks) if blocks[a + i] in recompute},
                         selective={i for i in range(c.blocks) if blocks[a + i] in selective})
                for c, a in zip(cuts, firsts)]


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of logits (batch, seq_len, vocab) against token ids (batch, seq_len)."""
    return functional.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))


def make_batch(batch_size: int, *, vocab: int, seq_len: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random token ids and their next-token targets, the same for the same ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (batch_size, seq_len + 1), generator=gen)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


@dataclass(frozen=True)
class StagedModel:
    """What the executor and the profiler need of a model: its stages, its loss and a batch maker."""

    stages: list[nn.Module]
    """The model cut into consecutive stages."""
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    """Loss of the last stage's output against the target."""
    make_batch: Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]
    """(batch_size, seed) -> (inputs of stage 0, target)."""


@dataclass(frozen=True)
class ModelSpec:
    """Which model ``load_model`` builds; the sizes and the seed apply to the built-in GPT."""

    name: str = "gpt"
    """"gpt" (the built-in small GPT) or a user's "module:function" returning the stages."""
    layers: int | None = None
    """GPT blocks (None: the partition's, else one per stage)."""
    partition: tuple[tuple[str, ...], ...] | None = None
    """The GPT's layer names per stage (a schedule document's partition, see ``build_partitioned``); None: blocks
    spread evenly over the stages. A user's model ignores it."""
    recompute: tuple[str, ...] = ()
    """The GPT's blocks (``blocks.i``, a schedule document's ``partition.recompute`` by name) that run under
    ``zbsolve.execute.recompute.checkpoint`` (recomputed once, by their first backward); a user's model takes none."""
    selective: tuple[str, ...] = ()
    """The GPT's blocks (``blocks.i``) whose norms' and GELU's outputs are recomputed (``Block``), none of
    ``recompute``; a user's model takes none."""
    hidden: int = GPTSizes.hidden
    """GPT hidden size."""
    heads: int = GPTSizes.heads
    """GPT attention heads."""
    vocab: int = GPTSizes.vocab
    """GPT vocabulary size."""
    seq_len: int = GPTSizes.seq_len
    """GPT sequence length."""
    seed: int = 0
    """Seed of the GPT's weights."""

    @property
    def sizes(self) -> GPTSizes:
        """The GPT's sizes."""
        return GPTSizes(hidden=self.hidden, heads=self.heads, vocab=self.vocab, seq_len=self.seq_len)


def load_model(spec: ModelSpec, num_stages: int) -> StagedModel:
    """The model of ``spec`` cut into ``num_stages`` stages, with its loss and batch maker.

    "gpt" is the small GPT of ``build_stages`` (``build_partitioned`` with ``spec.partition``) on random token
    batches, the blocks ``spec.recompute`` names checkpointed, those ``spec.selective`` names selective. A user's
    ``module:function`` is called with ``num_stages`` and returns that many modules; the module must also define
    ``make_batch(batch_size, seed) -> (inputs, target)`` and ``loss_fn(output, target)``.
    """
    if spec.name == "gpt":
        return _gpt(spec, num_stages)
    if spec.recompute:
        raise InputError(f"model = {spec.name!r}: recompute = {', '.join(spec.recompute)}, but only the built-in "
                         "gpt's blocks can be checkpointed")
    if spec.selective:
        raise InputError(f"model = {spec.name!r}: selective = {', '.join(spec.selective)}, but only the built-in "
                         "gpt's blocks can be selectively recomputed")
    return _user(spec.name, num_stages)


@dataclass(frozen=True)
class NamedLayer:
    """One layer of a model, as the per-layer profiler measures it."""

    name: str
    """The module's FQN in the model, e.g. ``blocks.0``."""
    module: nn.Module
    """The layer: takes the previous layer's output (the first, the model's inputs)."""
    block: bool
    """One of the model's repeated blocks."""


@dataclass(frozen=True)
class LayeredModel:
    """A model as its layers in forward order, with its loss (of the last layer's output) and a batch maker."""

    layers: list[NamedLayer]
    """The layers in the order the forward pass runs them."""
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    """Loss of the last layer's output against the target."""
    make_batch: Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]
    """(batch_size, seed) -> (inputs of the first layer, target)."""


def load_layers(spec: ModelSpec) -> LayeredModel:
    """The model of ``spec`` built as one stage (``load_model(spec, 1)``) and cut into its layers.

    "gpt": ``embed`` (token embedding and positions), ``blocks.0`` ... (``spec.layers`` of them, None: 1), ``norm``
    and ``head``; the blocks are its only blocks. A user's ``module:function`` must return one
    ``torch.nn.Sequential`` when called with 1: its children are the layers, named as in it, and a child is a block
    when its class occurs more than once among them.
    """
    staged = load_model(spec, 1)
    stage = staged.stages[0]
    if isinstance(stage, GPTStage):
        assert stage.embed is not None and stage.pos is not None and stage.norm is not None and \
            stage.head is not None, "a GPT of one stage holds every layer"
        layers = [NamedLayer("embed", Embedding(stage.embed, stage.pos), False),
                  *(NamedLayer(f"blocks.{i}", block, True) for i, block in enumerate(stage.blocks)),
                  NamedLayer("norm", stage.norm, False), NamedLayer("head", stage.head, False)]
    elif isinstance(stage, nn.Sequential) and len(stage):
        kinds = [type(child) for child in stage]
        layers = [NamedLayer(name, child, kinds.count(type(child)) > 1) for name, child in stage.named_children()]
    else:
        raise InputError(f"model = {spec.name!r}: a per-layer profile needs it to return one non-empty "
                         f"torch.nn.Sequential for 1 stage (its children are the layers), got {type(stage).__name__}")
    return LayeredModel(layers, staged.loss_fn, staged.make_batch)


def _gpt(spec: ModelSpec, num_stages: int) -> StagedModel:
    if spec.partition is None:
        stages = build_stages(num_stages, spec.sizes, layers=num_stages if spec.layers is None else spec.layers,
                              seed=spec.seed, recompute=spec.recompute, selective=spec.selective)
    elif len(spec.partition) != num_stages:
        raise InputError(f"partition has {len(spec.partition)} stages, but the schedule's placement has {num_stages}")
    else:
        stages = build_partitioned(spec.partition, spec.sizes, layers=spec.layers, seed=spec.seed,
                                   recompute=spec.recompute, selective=spec.selective)
    vocab, seq_len = spec.vocab, spec.seq_len
    return StagedModel(stages, loss_fn,
                       lambda batch_size, seed: make_batch(batch_size, vocab=vocab, seq_len=seq_len, seed=seed))


def _user(name: str, num_stages: int) -> StagedModel:
    module, fn = _import(name)
    missing = [attr for attr in ("make_batch", "loss_fn") if not callable(getattr(module, attr, None))]
    if missing:
        raise InputError(f"model = {name!r}: module {module.__name__!r} must define {' and '.join(missing)}")
    stages = fn(num_stages)
    if not isinstance(stages, (list, tuple)) or not all(isinstance(s, nn.Module) for s in stages):
        raise InputError(f"model = {name!r} must return a list of torch.nn.Module, got {type(stages).__name__}")
    if len(stages) != num_stages:
        raise InputError(f"model = {name!r} returned {len(stages)} stages, but the schedule's placement has "
                         f"{num_stages}")
    return StagedModel(list(stages), module.loss_fn, module.make_batch)


def _import(spec: str) -> tuple[ModuleType, Callable]:
    """The module and the function that ``module:function`` names."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise InputError(f"model = {spec!r} must be 'gpt' or 'module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InputError(f"model = {spec!r}: cannot import {module_name!r}: {exc}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise InputError(f"model = {spec!r}: {module_name!r} has no function {attr!r}")
    return module, fn
