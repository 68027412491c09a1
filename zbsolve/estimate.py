"""Estimated costs: a ``Model`` from a Hugging Face ``config.json`` of a dense decoder (Llama, Mistral, Qwen2,
GPT-2, GPT-NeoX) and the closed-form cost model of ``docs/cost-model.md``: FLOPs per pass over a GPU preset's
peak throughput times an efficiency, activation bytes after Korthikanti et al. 2022, static bytes of
mixed-precision Adam after the ZeRO paper. Every figure is per device of the tensor-parallel group. With
``method="count"`` the FLOPs and activation bytes are counted by torch on the transformers model instead
(``zbsolve.counting``); the rest stays the closed form's.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zbsolve import counting
from zbsolve.checks import check_count
from zbsolve.errors import InputError
from zbsolve.gpus import LINKS, P2P_LATENCY, Gpu, get_gpu
from zbsolve.model import Layer, Link, Model, Setting
from zbsolve.profile import load_mapping

EFFICIENCY = 0.4
"""Default fraction of the peak FLOP/s and HBM bandwidth a pass reaches (an assumed model FLOPs utilization)."""
DTYPE_BYTES = {"bf16": 2, "fp16": 2}
"""Bytes per element of weights and activations, by ``dtype``."""
WEIGHT_BYTES, GRAD_BYTES, OPTIMIZER_BYTES = 2, 2, 12
"""Mixed-precision Adam per parameter (ZeRO, Rajbhandari et al. 2020, section 3.1): 16-bit weight and gradient,
fp32 master weight, momentum and variance."""
ID_BYTES = 8
"""Bytes of a token id (int64), which the embedding keeps for its weight gradient."""
FP32_BYTES = 4
"""Bytes of an fp32 element: gradient accumulators, the loss's log-probabilities, the loss itself."""
MODEL_TYPES = ("llama", "mistral", "qwen2", "gpt2", "gpt_neox")
"""The ``model_type`` values of config.json that ``estimate`` takes."""
METHODS = ("auto", "count", "formula")
"""Where FLOPs and activation bytes come from: counted by torch on the transformers model, the closed form, or
"auto": counted where transformers is installed."""


def resolve_method(method: str) -> str:
    """"count" or "formula": the method ``method`` comes to here ("auto" is "count" where transformers is
    installed)."""
    if method not in METHODS:
        raise InputError(f"method = {method!r}: should be one of {', '.join(METHODS)}")
    if method == "auto":
        return "count" if counting.available() else "formula"
    return method


@dataclass(frozen=True)
class Architecture:
    """What the cost model needs of a dense decoder's config."""

    model_type: str
    """config.json's model_type."""
    hidden: int
    """Hidden size h."""
    layers: int
    """Transformer blocks L."""
    heads: int
    """Query heads a."""
    kv_heads: int
    """Key/value heads k (k < a: grouped-query attention)."""
    head_dim: int
    """Size d of one head."""
    ffn: int
    """MLP inner size f."""
    vocab: int
    """Vocabulary size V."""
    tied: bool
    """The head uses the embedding's weights."""
    gated: bool
    """SwiGLU MLP (gate, up, down: 3 matrices) rather than two matrices around a GeLU."""
    norm_params: int
    """Parameters of one norm: h (RMSNorm) or 2h (LayerNorm)."""
    qkv_bias: bool
    """The q, k, v projections have biases."""
    biases: bool
    """Every other linear layer has a bias (GPT-2, GPT-NeoX)."""
    positions: int
    """Learned position embeddings (GPT-2), 0 for rotary models."""
    attention_dropout: bool
    """Dropout on the attention probabilities."""
    hidden_dropout: bool
    """Dropout after the attention and after the MLP."""

    @property
    def q_width(self) -> int:
        """a·d: the width of the queries and of the attention output."""
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        """k·d: the width of the keys and of the values."""
        return self.kv_heads * self.head_dim

    @property
    def matmul_params(self) -> int:
        """Weights of one block's matmuls: q, k, v, o and the MLP."""
        h = self.hidden
        return h * (self.q_width + 2 * self.kv_width) + self.q_width * h + (3 if self.gated else 2) * h * self.ffn

    @property
    def block_params(self) -> int:
        """Parameters of one block: matmuls, biases and its two norms."""
        h = self.hidden
        biases = (self.q_width + 2 * self.kv_width) * (self.qkv_bias or self.biases)
        biases += (h + self.ffn + h) * self.biases
        return self.matmul_params + biases + 2 * self.norm_params

    @property
    def embedding_params(self) -> int:
        """Token (and learned position) embedding parameters."""
        return (self.vocab + self.positions) * self.hidden


def architecture(config: dict | str | Path) -> Architecture:
    """The architecture of a Hugging Face config (a mapping, or the path of a config.json)."""
    data, where = _config(config)
    kind = data.get("model_type")
    if kind not in MODEL_TYPES:
        raise InputError(f"{where}: model_type = {kind!r}: should be one of {', '.join(MODEL_TYPES)} (dense "
                         "decoders)")
    if kind == "gpt2":
        h = _int(data, "n_embd", where)
        heads = _int(data, "n_head", where)
        inner = data.get("n_inner")
        ffn = 4 * h if inner is None else _int(data, "n_inner", where)
        arch = dict(hidden=h, layers=_int(data, "n_layer", where), heads=heads, kv_heads=heads,
                    head_dim=_head_dim(data, h, heads, where), ffn=ffn, tied=_bool(data, "tie_word_embeddings", True,
                                                                                   where),
                    gated=False, norm_params=2 * h, qkv_bias=True, biases=True,
                    positions=_int(data, "n_positions", where),
                    attention_dropout=_probability(data, "attn_pdrop", 0.1, where) > 0,
                    hidden_dropout=_probability(data, "resid_pdrop", 0.1, where) > 0)
    else:
        h = _int(data, "hidden_size", where)
        heads = _int(data, "num_attention_heads", where)
        neox = kind == "gpt_neox"
        arch = dict(hidden=h, layers=_int(data, "num_hidden_layers", where), heads=heads,
                    kv_heads=_int(data, "num_key_value_heads", where, heads), head_dim=_head_dim(data, h, heads, where),
                    ffn=_int(data, "intermediate_size", where), tied=_bool(data, "tie_word_embeddings", False, where),
                    gated=not neox, norm_params=2 * h if neox else h,
                    qkv_bias=kind == "qwen2" or _bool(data, "attention_bias", neox, where),
                    biases=neox, positions=0,
                    attention_dropout=_probability(data, "attention_dropout", 0.0, where) > 0,
                    hidden_dropout=neox and _probability(data, "hidden_dropout", 0.0, where) > 0)
    arch["vocab"] = _int(data, "vocab_size", where)
    if heads % arch["kv_heads"]:
        raise InputError(f"{where}: num_key_value_heads = {arch['kv_heads']} must divide the {heads} attention heads")
    return Architecture(model_type=kind, **arch)


def _config(config: dict | str | Path) -> tuple[dict, str]:
    """The config's mapping and the name its errors start with."""
    if isinstance(config, dict):
        return config, "config"
    if isinstance(config, (str, Path)):
        return load_mapping(config), str(config)
    raise InputError(f"config = {config!r}: should be a mapping or the path of a config.json")


_MISSING: Any = object()


def _int(data: dict, key: str, where: str, default: int = _MISSING) -> int:
    """``data[key]`` as a positive integer (``default`` when absent or null, if given)."""
    value = data.get(key)
    if value is None:
        if default is _MISSING:
            raise InputError(f"{where}: {key} is missing")
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{where}: {key} = {value!r}: should be an integer >= 1")
    return value


def _bool(data: dict, key: str, default: bool, where: str) -> bool:
    value = data.get(key, default)
    if not isinstance(value, bool):
        raise InputError(f"{where}: {key} = {value!r}: should be true or false")
    return value


def _probability(data: dict, key: str, default: float, where: str) -> float:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise InputError(f"{where}: {key} = {value!r}: should be a probability in [0, 1]")
    return float(value)


def _head_dim(data: dict, hidden: int, heads: int, where: str) -> int:
    """config.json's head_dim, else hidden / heads (which must divide)."""
    if data.get("head_dim") is not None:
        return _int(data, "head_dim", where)
    if hidden % heads:
        raise InputError(f"{where}: hidden size {hidden} is not a multiple of the {heads} attention heads (and no "
                         "head_dim is given)")
    return hidden // heads


def count_parameters(config: Architecture | dict | str | Path) -> int:
    """Parameters of the whole model (tied embedding weights counted once)."""
    arch = config if isinstance(config, Architecture) else architecture(config)
    head = 0 if arch.tied else arch.vocab * arch.hidden
    return arch.embedding_params + arch.layers * arch.block_params + arch.norm_params + head


def reference_flops_per_token(config: Architecture | dict | str | Path, seq_len: int) -> float:
    """Training FLOPs per token by the usual rule, 6·N + 12·L·a·d·s (N parameters; PaLM, Chowdhery et al. 2022,
    appendix B), to compare an estimate's total with."""
    arch = config if isinstance(config, Architecture) else architecture(config)
    return 6 * count_parameters(arch) + 12 * arch.layers * arch.q_width * seq_len


@dataclass(frozen=True)
class _Costs:
    """One layer's costs before they become times: per pass (F, B, W) its FLOPs, its HBM traffic in bytes
    (memory-bound work) and its tensor-parallel collectives; its activation bytes M_B and M_W, its parameters and
    the bytes of its output."""

    flops: tuple[int, int, int]
    traffic: tuple[int, int, int]
    collectives: tuple[int, int, int]
    m_b: int
    m_w: int
    params: int
    out_bytes: int


def estimate(config: dict | str | Path, *, gpu: str | Gpu = "h100", seq_len: int, microbatch_size: int, tp: int = 1,
             dp: int = 1, zero: int = 0, dtype: str = "bf16", efficiency: float = EFFICIENCY,
             flash_attention: bool = True, link: str = "nvlink", name: str | None = None,
             source: str | None = None, method: str = "formula") -> Model:
    """The model description of a Hugging Face config under the cost model of ``docs/cost-model.md``.

    ``tp`` divides compute, weights and activations (Megatron-LM's tensor parallelism with sequence parallelism);
    ``zero=1`` shards the optimizer states over the ``dp`` replicas; ``link`` ("nvlink" or "network") carries the
    activations between stages. Layers are named as torchtitan names them: ``tok_embeddings``, ``layers.0``, ...,
    ``norm``, ``output``. ``method`` (``METHODS``): "count" takes each layer's FLOPs and activation bytes from
    ``zbsolve.counting`` (divided over ``tp``, rounded up) and the rest from the closed form.
    """
    used = resolve_method(method)
    arch = architecture(config)
    device = gpu if isinstance(gpu, Gpu) else get_gpu(gpu)
    for what, value in (("seq_len", seq_len), ("microbatch_size", microbatch_size), ("tp", tp), ("dp", dp)):
        check_count(what, value)
    if zero not in (0, 1) or isinstance(zero, bool):
        raise InputError(f"zero = {zero!r}: should be 0 or 1")
    if dtype not in DTYPE_BYTES:
        raise InputError(f"dtype = {dtype!r}: should be one of {', '.join(DTYPE_BYTES)}")
    if isinstance(efficiency, bool) or not isinstance(efficiency, (int, float)) or not 0 < efficiency <= 1:
        raise InputError(f"efficiency = {efficiency!r}: should be a number in (0, 1]")
    if link not in LINKS:
        raise InputError(f"link = {link!r}: should be one of {', '.join(LINKS)}")
    if arch.positions and seq_len > arch.positions:
        raise InputError(f"seq_len = {seq_len}: the config has {arch.positions} learned positions")
    for what, value in (("num_attention_heads", arch.heads), ("num_key_value_heads", arch.kv_heads),
                        ("intermediate_size", arch.ffn)):
        if value % tp:
            raise InputError(f"tp = {tp}: {what} = {value} is not a multiple of it")

    tokens, e = seq_len * microbatch_size, DTYPE_BYTES[dtype]
    shard = _Shard(tokens, tp)
    parts = [_embedding(arch, shard, e), _block(arch, shard, e, seq_len, flash_attention), _norm(arch, shard, e),
             _output(arch, shard, e)]
    if used == "count":
        counted = counting.count(config, seq_len=seq_len, microbatch_size=microbatch_size, dtype=dtype,
                                 flash_attention=flash_attention)
        parts = [_counted(part, counts, tp) for part, counts in
                 zip(parts, (counted.embedding, counted.block, counted.norm, counted.output))]
    block = parts[1]
    costs = ([("tok_embeddings", parts[0])] + [(f"layers.{i}", block) for i in range(arch.layers)]
             + [("norm", parts[2]), ("output", parts[3])])
    collective = (tp - 1) / tp * tokens * arch.hidden * e / device.nvlink_bytes_per_s + P2P_LATENCY if tp > 1 else 0.0

    def seconds(c: _Costs, p: int) -> float:
        return (c.flops[p] / (device.flops * efficiency) + c.traffic[p] / (device.hbm_bytes_per_s * efficiency)
                + c.collectives[p] * collective)

    optimizer_shards = dp if zero else 1
    layers = [Layer(name=n, block=c is block, t_f=seconds(c, 0), t_b=seconds(c, 1), t_w=seconds(c, 2),
                    mem_f=max(c.m_b, c.m_w), mem_b=c.m_w - max(c.m_b, c.m_w), mem_w=-c.m_w,
                    static_bytes=c.params * (WEIGHT_BYTES + GRAD_BYTES)
                    + math.ceil(c.params * OPTIMIZER_BYTES / optimizer_shards),
                    out_bytes=c.out_bytes, flops_f=c.flops[0], flops_b=c.flops[1], flops_w=c.flops[2],
                    shares="tok_embeddings" if n == "output" and arch.tied else None)
              for n, c in costs]
    gpu_name = gpu.lower() if isinstance(gpu, str) else device.name
    where = _config(config)[1]
    return Model(name=name or (Path(where).stem if where != "config" else "model"),
                 source=source or f"zbsolve.estimate.estimate({where}, gpu={gpu_name!r}, seq_len={seq_len}, "
                                  f"microbatch_size={microbatch_size}, tp={tp}, dp={dp}, zero={zero}, "
                                  f"dtype={dtype!r}, efficiency={efficiency}, flash_attention={flash_attention}, "
                                  f"link={link!r}, method={used!r}); cost model: docs/cost-model.md",
                 link=Link(name=link, bytes_per_s=device.link(link), latency_s=P2P_LATENCY),
                 setting=Setting(seq_len=seq_len, microbatch_size=microbatch_size, tp=tp, dp=dp, zero=zero,
                                 dtype=dtype, gpu=gpu_name, efficiency=efficiency),
                 layers=layers)


@dataclass(frozen=True)
class _Shard:
    """A microbatch of ``tokens`` tokens on one device of ``tp``: what a per-token size comes to."""

    tokens: int
    tp: int

    def bytes(self, per_token: int) -> int:
        """Bytes of an activation of ``per_token`` bytes a token, split over the tensor-parallel group
        (sequence parallelism: each device holds a 1/tp slice, rounded up)."""
        return -(-self.tokens * per_token // self.tp)


def _counted(part: _Costs, counts: counting.Counts, tp: int) -> _Costs:
    """``part`` with the counted FLOPs and activation bytes, each divided over the ``tp`` devices (rounded up)."""
    f, b, w = (-(-flops // tp) for flops in counts.flops)
    return dataclasses.replace(part, flops=(f, b, w), m_b=-(-counts.m_b // tp), m_w=-(-counts.m_w // tp))


def _embedding(arch: Architecture, shard: _Shard, e: int) -> _Costs:
    """A gather: no FLOPs; F reads the rows and writes the output, W reads the output gradient and reads and
    writes fp32 gradient rows (scatter-add); B has nothing to do (its input is token ids)."""
    n, h, t = shard.tokens, arch.hidden, shard.tp
    ids = n * ID_BYTES
    grad = shard.bytes(h * e)
    params = -(-arch.vocab // t) * h + arch.positions * h
    return _Costs(flops=(0, 0, 0), traffic=(2 * n * h * e, 0, n * h * (e + 2 * FP32_BYTES)),
                  collectives=(1, 0, 1) if t > 1 else (0, 0, 0), m_b=ids, m_w=ids + grad, params=params,
                  out_bytes=shard.bytes(h * e))


def _block(arch: Architecture, shard: _Shard, e: int, seq_len: int, flash_attention: bool) -> _Costs:
    """Matmuls: 2·tokens·weights FLOPs each for F, B and W; attention core (QK^T, AV) 4·tokens·s·a·d in F and
    twice that in B, none in W; four collectives in F and B and two in W under tensor parallelism."""
    n, h, t, f = shard.tokens, arch.hidden, shard.tp, arch.ffn
    qd, kd = arch.q_width, arch.kv_width
    matmul = 2 * n * arch.matmul_params // t
    attention = 4 * n * seq_len * qd // t
    mlp_out = 3 if arch.gated else 2
    saved = e * (2 * h + 2 * qd + 2 * kd) + e * (2 * h + mlp_out * f)
    if arch.hidden_dropout:
        saved += 2 * h
    if not flash_attention:
        saved += e * arch.heads * seq_len
        if arch.attention_dropout:
            saved += arch.heads * seq_len + e * arch.heads * seq_len
    for_w = e * ((h + qd + 2 * kd) + (qd + h) + (h + (mlp_out - 1) * f) + (f + h))
    params = -(-(arch.block_params - 2 * arch.norm_params) // t) + 2 * arch.norm_params
    return _Costs(flops=(matmul + attention, matmul + 2 * attention, matmul), traffic=(0, 0, 0),
                  collectives=(4, 4, 2) if t > 1 else (0, 0, 0), m_b=shard.bytes(saved), m_w=shard.bytes(for_w),
                  params=params, out_bytes=shard.bytes(h * e))


def _norm(arch: Architecture, shard: _Shard, e: int) -> _Costs:
    """Memory-bound: F reads and writes the activation, B reads it and the output gradient and writes the input
    gradient (and its weight gradient: only matmul weights wait for W)."""
    slice_bytes = shard.bytes(arch.hidden * e)
    return _Costs(flops=(0, 0, 0), traffic=(2 * slice_bytes, 3 * slice_bytes, 0), collectives=(0, 0, 0),
                  m_b=slice_bytes, m_w=0, params=arch.norm_params, out_bytes=slice_bytes)


def _output(arch: Architecture, shard: _Shard, e: int) -> _Costs:
    """The head's matmul (2·tokens·h·V FLOPs in each of F, B and W, V split over tp) and the loss: F writes fp32
    log-probabilities, B reads them and writes the logits' gradient, which W keeps with the head's input."""
    n, h, t = shard.tokens, arch.hidden, shard.tp
    vocab = -(-arch.vocab // t)
    matmul = 2 * n * h * vocab
    logits = n * vocab
    x = shard.bytes(h * e)
    return _Costs(flops=(matmul, matmul, matmul), traffic=(logits * (e + FP32_BYTES), logits * (FP32_BYTES + e), 0),
                  collectives=(1, 1, 1) if t > 1 else (0, 0, 0), m_b=x + logits * FP32_BYTES, m_w=x + logits * e,
                  params=vocab * h, out_bytes=FP32_BYTES)


def flops_note(model: Model, config: dict | str | Path) -> str:
    """One line comparing the estimate's training FLOPs per token with 6·N + 12·L·a·d·s."""
    arch = architecture(config)
    if model.setting is None:
        raise InputError(f"model {model.name} has no setting: its tokens per microbatch are unknown")
    params = count_parameters(arch)
    attention = 12 * arch.layers * arch.q_width * model.setting.seq_len
    reference = 6 * params + attention
    ours = model.flops_per_token()
    no_matmul = params - arch.layers * arch.matmul_params - arch.vocab * arch.hidden
    counted = ours - reference + 6 * no_matmul
    return (f"FLOPs per token: estimate {ours / 1e9:.2f} G (F + B + W of every layer) vs 6·N + 12·L·a·d·s = "
            f"{reference / 1e9:.2f} G (N = {params / 1e9:.3f}e9 parameters: 6·N = {6 * params / 1e9:.2f} G, "
            f"attention {attention / 1e9:.2f} G), ratio {ours / reference:.3f}; 6·N also counts the "
            f"{no_matmul / 1e6:.1f}e6 weights that are no matmul here (input embedding, norms, biases)"
            + (f"; the estimate counts {counted / 1e9:.2f} G more (counted by torch: flash attention's recomputation "
               "of QK^T in B)" if abs(counted) >= 5e6 else ""))
