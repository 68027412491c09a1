"""Activation bytes a token of one Llama block, as eager torch and as a compiled (fused) block keep them, against
``zbsolve estimate``'s closed form (the default) and its count (``--method count``): which figure is the upper bound.

transformers' ``LlamaDecoderLayer`` (h = 256, f = 512, 4 heads, 2 key/value heads, s = 128, b = 2, bf16, SDPA) runs
forward on CPU, once as written and once under ``torch.compile``, whose kernels fuse RMSNorm and SwiGLU as
large-model training runs them; saved-tensor hooks count each saved storage once (parameters and the rotary table
left out). Needs transformers and a C++ compiler (for torch.compile). Run: .venv/bin/python
benchmarks/fused_activations.py
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

from zbsolve.costmodel.estimate import estimate

H, F, HEADS, KV_HEADS, S, B = 256, 512, 4, 2, 128, 2
CONFIG = {"model_type": "llama", "hidden_size": H, "intermediate_size": F, "num_attention_heads": HEADS,
          "num_key_value_heads": KV_HEADS, "num_hidden_layers": 1, "vocab_size": 100}


def saved_bytes(forward: Callable[[], Any], held: set[int]) -> int:
    """Bytes of the storages autograd saves while ``forward`` runs, each once, except those of ``held``."""
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        key = tensor.untyped_storage()._cdata
        if key not in held:
            saved[key] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        forward()
    return sum(saved.values())


def main() -> None:
    """Print bytes a token: eager, compiled, the closed form and the count."""
    config = LlamaConfig(**{k: v for k, v in CONFIG.items() if k != "model_type"})
    config._attn_implementation = "sdpa"
    layer = LlamaDecoderLayer(config, 0).to(torch.bfloat16).train()
    x = torch.randn(B, S, H, dtype=torch.bfloat16, requires_grad=True)
    positions = torch.arange(S)[None].expand(B, S)
    rotary = LlamaRotaryEmbedding(config)(x, positions)
    held = {t.untyped_storage()._cdata for t in (*layer.parameters(), *rotary)}
    compiled = torch.compile(layer)
    compiled(x, attention_mask=None, position_embeddings=rotary, position_ids=positions)  # compiles
    n = B * S
    rows = [("eager torch (transformers as written)",
             saved_bytes(lambda: layer(x, attention_mask=None, position_embeddings=rotary, position_ids=positions),
                         held)),
            ("torch.compile (fused kernels)",
             saved_bytes(lambda: compiled(x, attention_mask=None, position_embeddings=rotary,
                                          position_ids=positions), held)),
            ("zbsolve estimate --method formula", estimate(CONFIG, seq_len=S, microbatch_size=B).layers[1].mem_f),
            ("zbsolve estimate --method count",
             estimate(CONFIG, seq_len=S, microbatch_size=B, method="count").layers[1].mem_f)]
    print(f"{'activation bytes a token of one block':<40} {'bytes':>7}")
    for name, value in rows:
        print(f"{name:<40} {value / n:>7.1f}")


if __name__ == "__main__":
    main()
