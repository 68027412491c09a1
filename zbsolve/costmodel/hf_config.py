"""What the cost model reads of a Hugging Face ``config.json``: the ``Architecture`` of a dense decoder (Llama,
Mistral, Qwen2, GPT-2, GPT-NeoX), with each block's sliding window as transformers builds the model, or of a
mixture-of-experts decoder (Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V2 and V3, whose attention is latent, and
gpt-oss, whose blocks alternate sliding-window and full attention), with which blocks have experts
(``zbsolve.costmodel.hf_experts``). A config with layers of another kind (experts or latent attention in a dense
``model_type``, an expert key the estimate does not read, other ``layer_types``) or relabelled with another
``model_type`` is refused with one line naming the field and its value, never estimated as something else.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zbsolve.base.errors import InputError
from zbsolve.costmodel.config_values import MISSING, boolean, integer, probability, read_config
from zbsolve.costmodel.hf_experts import EXPERT_KEYS, MOE_TYPES, Experts, Latent, mixture

MODEL_TYPES = ("llama", "mistral", "qwen2", "gpt2", "gpt_neox")
"""The dense decoders' ``model_type`` values of config.json that ``estimate`` takes."""
CLASSES = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "gpt2": "GPT2", "gpt_neox": "GPTNeoX",
           "mixtral": "Mixtral", "qwen2_moe": "Qwen2Moe", "qwen3_moe": "Qwen3Moe", "deepseek_v2": "DeepseekV2",
           "deepseek_v3": "DeepseekV3", "gpt_oss": "GptOss"}
"""The name transformers' classes of each model_type start with (``LlamaForCausalLM``, ``GPT2LMHeadModel``)."""
HEADS = ("ForCausalLM", "LMHeadModel", "DoubleHeadsModel", "Model", "ForSequenceClassification",
         "ForTokenClassification", "ForQuestionAnswering")
"""What those names end with: the heads on the same decoder."""
LAYER_TYPES = ("full_attention", "sliding_attention")
"""The ``layer_types`` entries of a dense decoder."""
EXPERTS = re.compile(r"expert|(^|_)moe(_|$)")
"""Keys of mixture-of-experts configs (``num_local_experts``, ``n_routed_experts``, ``num_experts``,
``moe_intermediate_size``, ...)."""
LATENT_ATTENTION = ("kv_lora_rank", "q_lora_rank")
"""Keys of multi-head latent attention (DeepSeek, MiniCPM3), whose keys and values are no heads of size d."""
WINDOW: dict[str, int | None] = {"mistral": 4096, "qwen2": 4096, "mixtral": None, "gpt_oss": 128}
"""transformers' default ``sliding_window`` of the model types that have one."""
QWEN2_MAX_WINDOW_LAYERS = 28
"""transformers' default ``max_window_layers`` of Qwen2: the blocks from there on have the window."""


@dataclass(frozen=True)
class Architecture:
    """What the cost model needs of a decoder's config (a mixture of experts' adds its ``experts``)."""

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
    """Every other linear layer has a bias (GPT-2, GPT-NeoX; gpt-oss's o with ``attention_bias``, its router's and
    experts' are ``Experts.biases``)."""
    positions: int
    """Learned position embeddings (GPT-2), 0 for rotary models."""
    attention_dropout: bool
    """Dropout on the attention probabilities."""
    hidden_dropout: bool
    """Dropout after the attention and after the MLP."""
    windows: tuple[int | None, ...]
    """Each block's sliding window (the keys a query attends, itself included), None for full attention."""
    experts: Experts | None = None
    """The expert layers of a mixture-of-experts model, None for a dense decoder."""
    latent: Latent | None = None
    """Latent attention's sizes (DeepSeek), None for heads of size d."""
    qk_norm: bool = False
    """An RMSNorm on every query and key head (Qwen3-MoE)."""
    mtp: int = 0
    """Multi-token prediction layers after the blocks (DeepSeek-V3's num_nextn_predict_layers)."""
    sinks: bool = False
    """A learned sink logit per query head that each query's softmax also normalises over (gpt-oss): a parameters
    a block."""

    @property
    def q_width(self) -> int:
        """a·d: the width of the queries and of the attention output."""
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        """k·d: the width of the keys and of the values."""
        return self.kv_heads * self.head_dim

    @property
    def embedding_params(self) -> int:
        """Token (and learned position) embedding parameters."""
        return (self.vocab + self.positions) * self.hidden


def architecture(config: dict | str | Path) -> Architecture:
    """The architecture of a Hugging Face config (a mapping, or the path of a config.json); a file's is read once
    while its modification time and size stay the same (a search estimates its model many times)."""
    stat = os.stat(config) if isinstance(config, (str, Path)) and os.path.isfile(config) else None
    return _architecture(config) if stat is None else _read(str(config), stat.st_mtime_ns, stat.st_size)


_read = functools.lru_cache(maxsize=32)(lambda path, modified, size: _architecture(path))  # the file as it was then


def _architecture(config: dict | str | Path) -> Architecture:
    """The architecture of a Hugging Face config, read and checked."""
    data, where = read_config(config)
    kind = data.get("model_type")
    if kind not in MODEL_TYPES + MOE_TYPES:
        raise InputError(f"{where}: model_type = {kind!r}: should be one of {', '.join(MODEL_TYPES)} (dense "
                         f"decoders) or {', '.join(MOE_TYPES)} (mixture of experts)")
    _check_layers(data, kind, where)
    arch: dict[str, Any]  # the Architecture's fields, by name
    if kind == "gpt2":
        h = integer(data, "n_embd", where)
        heads = integer(data, "n_head", where)
        inner = data.get("n_inner")
        ffn = 4 * h if inner is None else integer(data, "n_inner", where)
        arch = dict(hidden=h, layers=integer(data, "n_layer", where), heads=heads, kv_heads=heads,
                    head_dim=_head_dim(data, h, heads, where), ffn=ffn, tied=boolean(data, "tie_word_embeddings", True,
                                                                                   where),
                    gated=False, norm_params=2 * h, qkv_bias=True, biases=True,
                    positions=integer(data, "n_positions", where),
                    attention_dropout=probability(data, "attn_pdrop", 0.1, where) > 0,
                    hidden_dropout=probability(data, "resid_pdrop", 0.1, where) > 0)
    else:
        h = integer(data, "hidden_size", where)
        heads = integer(data, "num_attention_heads", where)
        neox = kind == "gpt_neox"
        arch = dict(hidden=h, layers=integer(data, "num_hidden_layers", where), heads=heads,
                    kv_heads=integer(data, "num_key_value_heads", where, heads),
                    head_dim=_head_dim(data, h, heads, where), ffn=integer(data, "intermediate_size", where),
                    tied=boolean(data, "tie_word_embeddings", False, where),
                    gated=not neox, norm_params=2 * h if neox else h,
                    qkv_bias=kind == "qwen2" or boolean(data, "attention_bias", neox, where),
                    biases=neox, positions=0,
                    attention_dropout=probability(data, "attention_dropout", 0.0, where) > 0,
                    hidden_dropout=neox and probability(data, "hidden_dropout", 0.0, where) > 0)
    arch["vocab"] = integer(data, "vocab_size", where)
    arch["windows"] = _windows(data, kind, arch["layers"], where)
    if heads % arch["kv_heads"]:
        raise InputError(f"{where}: num_key_value_heads = {arch['kv_heads']} must divide the {heads} attention heads")
    if kind in MOE_TYPES:
        arch.update(mixture(data, kind, arch, where))
    return Architecture(model_type=kind, **arch)


def _head_dim(data: dict, hidden: int, heads: int, where: str) -> int:
    """config.json's head_dim, else hidden / heads (which must divide)."""
    if data.get("head_dim") is not None:
        return integer(data, "head_dim", where)
    if hidden % heads:
        raise InputError(f"{where}: hidden size {hidden} is not a multiple of the {heads} attention heads (and no "
                         "head_dim is given)")
    return hidden // heads


def _check_layers(data: dict, kind: str, where: str) -> None:
    """Refuse a config whose layers are of a kind the cost model does not know: experts, latent attention, a
    ``layer_types`` entry other than full or sliding-window attention, or ``architectures`` of another model than
    ``model_type`` says (a relabelled config)."""
    for key, value in data.items():
        if value in (None, 0, False, "", [], {}):
            continue
        if EXPERTS.search(key) and kind not in MOE_TYPES:
            raise InputError(f"{where}: {key} = {value!r}: mixture-of-experts layers are not estimated (dense "
                             "decoders only)")
        if EXPERTS.search(key) and key not in EXPERT_KEYS[kind]:
            raise InputError(f"{where}: {key} = {value!r}: not read by the estimate of {kind} (it reads "
                             f"{', '.join(sorted(EXPERT_KEYS[kind]))})")
        if key in LATENT_ATTENTION and not kind.startswith("deepseek"):
            raise InputError(f"{where}: {key} = {value!r}: multi-head latent attention is not estimated (dense "
                             "decoders only)")
    names, prefix = data.get("architectures"), CLASSES[kind]
    if names is not None and not (isinstance(names, list) and all(
            isinstance(name, str) and name.startswith(prefix) and name[len(prefix):] in HEADS for name in names)):
        raise InputError(f"{where}: architectures = {names!r}: not {prefix}'s classes ({prefix}ForCausalLM, ...), "
                         f"yet model_type = {kind!r}: a relabelled config is not estimated")
    types = data.get("layer_types")
    if types is not None and not isinstance(types, list):
        raise InputError(f"{where}: layer_types = {types!r}: should be a list of {', '.join(LAYER_TYPES)}")
    for i, layer_type in enumerate(types or ()):
        if layer_type not in LAYER_TYPES:
            raise InputError(f"{where}: layer_types[{i}] = {layer_type!r}: should be one of {', '.join(LAYER_TYPES)} "
                             "(other kinds of layer are not estimated)")


def _windows(data: dict, kind: str, layers: int, where: str) -> tuple[int | None, ...]:
    """Each block's sliding window as transformers builds the model (None: full attention): Mistral's and
    Mixtral's ``sliding_window`` on every block; Qwen2's only with ``use_sliding_window``, on the blocks
    ``layer_types`` names (by default those from ``max_window_layers`` on); gpt-oss's on the blocks ``layer_types``
    names (by default every other one from the first: ``GptOssConfig``); the other model types have none."""
    if (kind not in WINDOW or kind == "qwen2" and not boolean(data, "use_sliding_window", False, where)
            or data.get("sliding_window", WINDOW[kind]) is None):
        return (None,) * layers
    default = WINDOW[kind]  # None: the config names its window (else it has none, as checked above)
    window = integer(data, "sliding_window", where, MISSING if default is None else default)
    if kind in ("mistral", "mixtral"):
        return (window,) * layers
    types = data.get("layer_types")
    if types is None and kind == "gpt_oss":
        types = [LAYER_TYPES[(i + 1) % 2] for i in range(layers)]
    if types is None:
        first = integer(data, "max_window_layers", where, QWEN2_MAX_WINDOW_LAYERS, minimum=0)
        types = [LAYER_TYPES[i >= first] for i in range(layers)]
    if len(types) != layers:
        raise InputError(f"{where}: layer_types = {types!r}: should have {layers} entries, one a layer")
    return tuple(window if layer_type == "sliding_attention" else None for layer_type in types)


def attended_pairs(seq_len: int, window: int | None) -> int:
    """The (query, key) pairs of a sequence whose attention scores the cost model counts: all s² (causal masking is
    not discounted), or, under a sliding window of w < s keys, the pairs less than w apart either way,
    s² - (s - w)(s - w + 1): twice the pairs the causal window lets through less the diagonal, as s² is for the
    causal triangle."""
    if window is None or window >= seq_len:
        return seq_len * seq_len
    return seq_len * seq_len - (seq_len - window) * (seq_len - window + 1)
