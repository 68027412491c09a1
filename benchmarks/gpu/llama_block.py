"""Llama-style layers in BF16 on CUDA for ``zbsolve profile --per-layer --model llama_block:FUNCTION`` (with
``benchmarks/gpu`` on ``PYTHONPATH``): the token embedding, two decoder blocks (RMSNorm, grouped-query attention
with rotary embeddings through ``scaled_dot_product_attention``, RMSNorm, SwiGLU MLP, both residuals), the final
norm and the LM head, at one microbatch of ``SEQ_LEN`` tokens, in eager torch.

``llama3_8b``: Llama-3-8B's sizes. ``llama3_70b_tp4``: one tensor-parallel rank's share of a Llama-3-70B block at
TP 4 (a quarter of the heads and of the MLP width; the vocabulary over 4), without its collectives.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

SEQ_LEN = 8192
"""Tokens of a microbatch (micro-batch size 1)."""
ROPE_THETA = 500000.0
"""Llama-3's rotary base."""


class RMSNorm(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, eps=1e-5)


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the two halves of each head (``x``: batch, heads, tokens, head_dim)."""
    a, b = x.chunk(2, dim=-1)
    return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)


class Block(nn.Module):
    """A Llama decoder block: x + attention(norm(x)), then + mlp(norm(.))."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, ffn: int, head_dim: int = 128) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.attention_norm, self.ffn_norm = RMSNorm(hidden), RMSNorm(hidden)
        self.wq = nn.Linear(hidden, heads * head_dim, bias=False)
        self.wkv = nn.Linear(hidden, 2 * kv_heads * head_dim, bias=False)
        self.wo = nn.Linear(heads * head_dim, hidden, bias=False)
        self.w13 = nn.Linear(hidden, 2 * ffn, bias=False)
        self.w2 = nn.Linear(ffn, hidden, bias=False)
        freqs = 1.0 / ROPE_THETA ** (torch.arange(0, head_dim, 2).float() / head_dim)
        angles = torch.outer(torch.arange(SEQ_LEN).float(), freqs)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, _ = x.shape
        h = self.attention_norm(x)
        q = self.wq(h).view(n, t, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.wkv(h).view(n, t, 2, self.kv_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        cos, sin = self.cos[:t].to(x.dtype), self.sin[:t].to(x.dtype)
        q, k = rotary(q, cos, sin), rotary(k, cos, sin)
        group = self.heads // self.kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo(a.transpose(1, 2).reshape(n, t, -1))
        gate, up = self.w13(self.ffn_norm(x)).chunk(2, dim=-1)
        return x + self.w2(F.silu(gate) * up)


class Head(nn.Module):
    """The LM head: logits over the vocabulary."""

    def __init__(self, hidden: int, vocab: int) -> None:
        super().__init__()
        self.output = nn.Linear(hidden, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output(x)


VOCAB = 128256
"""Llama-3's vocabulary."""


def _layers(hidden: int, heads: int, kv_heads: int, ffn: int, vocab: int, device: str = "cuda") -> list[nn.Module]:
    """The embedding, two blocks, the norm and the head, made on ``device`` in BF16."""
    torch.manual_seed(0)
    with torch.device(device):
        layers = nn.Sequential()
        layers.add_module("embed", nn.Embedding(vocab, hidden))
        for i in range(2):
            layers.add_module(f"block_{i}", Block(hidden, heads, kv_heads, ffn))
        layers.add_module("norm", RMSNorm(hidden))
        layers.add_module("head", Head(hidden, vocab))
    for p in layers.parameters():
        if p.dim() > 1:
            nn.init.normal_(p, std=0.02)
    return [layers.to(torch.bfloat16)]


def llama3_8b(num_stages: int) -> list[nn.Module]:
    """Llama-3-8B's layers (hidden 4096, 32 heads, 8 KV heads, MLP 14336) as one stage."""
    assert num_stages == 1, "a per-layer profile asks for one stage"
    return _layers(4096, 32, 8, 14336, VOCAB)


def llama3_70b_tp4(num_stages: int) -> list[nn.Module]:
    """One TP-4 rank's share of Llama-3-70B's layers (hidden 8192, 16 heads, 2 KV heads, MLP 7168, vocabulary
    over 4) as one stage."""
    assert num_stages == 1, "a per-layer profile asks for one stage"
    return _layers(8192, 16, 2, 7168, VOCAB // 4)


def make_batch(batch_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and next-token targets of ``batch_size`` sequences of ``SEQ_LEN``."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB // 4, (batch_size, SEQ_LEN + 1), generator=gen)
    return ids[:, :-1], ids[:, 1:]


def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of next-token logits."""
    return F.cross_entropy(logits.flatten(0, 1).float(), target.flatten())
