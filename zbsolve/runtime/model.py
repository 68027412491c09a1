"""Models split into pipeline stages: a small GPT, or a user's ``module:function``."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import torch
from torch import nn
from torch.nn import functional

from zbsolve.errors import InputError


class Block(nn.Module):
    """One pre-norm transformer block: causal self-attention then an MLP."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(n, t, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        a = functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(n, t, h))
        return x + self.mlp(self.ln2(x))


class GPTStage(nn.Module):
    """A run of consecutive blocks; the first stage embeds token ids, the last ends with the LM head."""

    def __init__(self, blocks: int, *, first: bool, last: bool, hidden: int, heads: int, vocab: int,
                 seq_len: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden) if first else None
        self.pos = nn.Parameter(0.02 * torch.randn(seq_len, hidden)) if first else None
        self.blocks = nn.ModuleList(Block(hidden, heads) for _ in range(blocks))
        self.norm = nn.LayerNorm(hidden) if last else None
        self.head = nn.Linear(hidden, vocab, bias=False) if last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x) + self.pos[: x.shape[1]]
        for block in self.blocks:
            x = block(x)
        if self.head is not None:
            x = self.head(self.norm(x))
        return x


def build_stages(num_stages: int, *, layers: int, hidden: int, heads: int, vocab: int, seq_len: int,
                 seed: int) -> list[nn.Module]:
    """A GPT of ``layers`` blocks cut into ``num_stages`` stages, the same weights for the same ``seed``.

    Stage 0 takes token ids (batch, seq_len); the last stage returns logits (batch, seq_len, vocab).
    """
    if num_stages < 1 or layers < num_stages:
        raise InputError(f"layers = {layers} must be >= num_stages = {num_stages} >= 1")
    if hidden < 1 or heads < 1 or hidden % heads:
        raise InputError(f"hidden = {hidden} must be a positive multiple of heads = {heads}")
    if vocab < 2 or seq_len < 1:
        raise InputError(f"vocab = {vocab} must be >= 2 and seq_len = {seq_len} >= 1")
    counts = [layers // num_stages + (1 if s < layers % num_stages else 0) for s in range(num_stages)]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return [GPTStage(c, first=s == 0, last=s == num_stages - 1, hidden=hidden, heads=heads, vocab=vocab,
                         seq_len=seq_len) for s, c in enumerate(counts)]


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
    """GPT blocks (None: one per stage)."""
    hidden: int = 32
    """GPT hidden size."""
    heads: int = 2
    """GPT attention heads."""
    vocab: int = 64
    """GPT vocabulary size."""
    seq_len: int = 16
    """GPT sequence length."""
    seed: int = 0
    """Seed of the GPT's weights."""


def load_model(spec: ModelSpec, num_stages: int) -> StagedModel:
    """The model of ``spec`` cut into ``num_stages`` stages, with its loss and batch maker.

    "gpt" is the small GPT of ``build_stages`` on random token batches. A user's ``module:function`` is called
    with ``num_stages`` and returns that many modules; the module must also define
    ``make_batch(batch_size, seed) -> (inputs, target)`` and ``loss_fn(output, target)``.
    """
    return _gpt(spec, num_stages) if spec.name == "gpt" else _user(spec.name, num_stages)


def _gpt(spec: ModelSpec, num_stages: int) -> StagedModel:
    stages = build_stages(num_stages, layers=num_stages if spec.layers is None else spec.layers, hidden=spec.hidden,
                          heads=spec.heads, vocab=spec.vocab, seq_len=spec.seq_len, seed=spec.seed)
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
