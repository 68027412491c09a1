"""What the cost model reads of a Hugging Face ``config.json``: the ``Architecture`` of a dense decoder (Llama,
Mistral, Qwen2, GPT-2, GPT-NeoX), with each block's sliding window as transformers builds the model. A config with
layers of another kind (mixture-of-experts, latent attention, other ``layer_types``) or relabelled with another
``model_type`` is refused with one line naming the field and its value, never estimated as a dense decoder.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zbsolve.base.errors import InputError
from zbsolve.base.inputs import load_mapping

MODEL_TYPES = ("llama", "mistral", "qwen2", "gpt2", "gpt_neox")
"""The ``model_type`` values of config.json that ``estimate`` takes."""
CLASSES = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "gpt2": "GPT2", "gpt_neox": "GPTNeoX"}
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
WINDOW = {"mistral": 4096, "qwen2": 4096}
"""transformers' default ``sliding_window`` of the model types that have one."""
QWEN2_MAX_WINDOW_LAYERS = 28
"""transformers' default ``max_window_layers`` of Qwen2: the blocks from there on have the window."""


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
    windows: tuple[int | None, ...]
    """Each block's sliding window (the keys a query attends, itself included), None for full attention."""

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
    data, where = read_config(config)
    kind = data.get("model_type")
    if kind not in MODEL_TYPES:
        raise InputError(f"{where}: model_type = {kind!r}: should be one of {', '.join(MODEL_TYPES)} (dense "
                         "decoders)")
    _check_layers(data, kind, where)
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
    arch["windows"] = _windows(data, kind, arch["layers"], where)
    if heads % arch["kv_heads"]:
        raise InputError(f"{where}: num_key_value_heads = {arch['kv_heads']} must divide the {heads} attention heads")
    return Architecture(model_type=kind, **arch)


def read_config(config: dict | str | Path) -> tuple[dict, str]:
    """The config's mapping and the name its errors start with."""
    if isinstance(config, dict):
        return config, "config"
    if isinstance(config, (str, Path)):
        return load_mapping(config), str(config)
    raise InputError(f"config = {config!r}: should be a mapping or the path of a config.json")


_MISSING: Any = object()


def _int(data: dict, key: str, where: str, default: int = _MISSING, minimum: int = 1) -> int:
    """``data[key]`` as an integer >= ``minimum`` (``default`` when absent or null, if given)."""
    value = data.get(key)
    if value is None:
        if default is _MISSING:
            raise InputError(f"{where}: {key} is missing")
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InputError(f"{where}: {key} = {value!r}: should be an integer >= {minimum}")
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


def _check_layers(data: dict, kind: str, where: str) -> None:
    """Refuse a config whose layers are of a kind the cost model does not know: experts, latent attention, a
    ``layer_types`` entry other than full or sliding-window attention, or ``architectures`` of another model than
    ``model_type`` says (a relabelled config)."""
    for key, value in data.items():
        if value in (None, 0, False, "", [], {}):
            continue
        if EXPERTS.search(key):
            raise InputError(f"{where}: {key} = {value!r}: mixture-of-experts layers are not estimated (dense "
                             "decoders only)")
        if key in LATENT_ATTENTION:
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
    """Each block's sliding window as transformers builds the model (None: full attention): Mistral's
    ``sliding_window`` on every block; Qwen2's only with ``use_sliding_window``, on the blocks ``layer_types`` names
    (by default those from ``max_window_layers`` on); the other model types have none."""
    if (kind not in WINDOW or kind == "qwen2" and not _bool(data, "use_sliding_window", False, where)
            or data.get("sliding_window", WINDOW[kind]) is None):
        return (None,) * layers
    window = _int(data, "sliding_window", where, WINDOW[kind])
    if kind == "mistral":
        return (window,) * layers
    types = data.get("layer_types")
    if types is None:
        first = _int(data, "max_window_layers", where, QWEN2_MAX_WINDOW_LAYERS, minimum=0)
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
