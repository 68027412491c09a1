"""What the cost model reads of a mixture-of-experts ``config.json`` beyond a dense decoder's fields
(``zbsolve.costmodel.hf_config``): its ``Experts`` (Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V2 and V3, gpt-oss),
DeepSeek's latent attention (``Latent``) and multi-token prediction layers, gpt-oss's attention sinks and biases,
each as transformers builds the model. An expert setting the estimate does not know (another routing, another
placement of the experts, biases where the model type has none) is refused with one line naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zbsolve.base.errors import InputError
from zbsolve.costmodel.config_values import MISSING, boolean, integer

MOE_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3", "gpt_oss")
"""The mixture-of-experts ``model_type`` values ``estimate`` takes."""
_DEEPSEEK_KEYS = {"n_routed_experts", "n_shared_experts", "num_experts_per_tok", "moe_intermediate_size",
                  "moe_layer_freq"}
"""The expert keys of DeepSeek-V2 and V3 configs."""
EXPERT_KEYS = {"mixtral": {"num_local_experts", "num_experts_per_tok"},
               "qwen2_moe": {"num_experts", "num_experts_per_tok", "moe_intermediate_size",
                             "shared_expert_intermediate_size"},
               "qwen3_moe": {"num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size"},
               "deepseek_v2": _DEEPSEEK_KEYS, "deepseek_v3": _DEEPSEEK_KEYS,
               "gpt_oss": {"num_local_experts", "num_experts", "num_experts_per_tok", "experts_per_token"}}
"""The expert keys the estimate reads of each mixture-of-experts model_type; any other with a value is refused.
gpt-oss's ``experts_per_token`` is OpenAI's name of ``num_experts_per_tok``, which its published config.json
repeats (transformers reads ``num_experts_per_tok``; ``num_experts`` is ``GptOssConfig``'s alias of
``num_local_experts``)."""
ROUTING: dict[str, dict[str, tuple[str, ...]]] = {
    "deepseek_v2": {"scoring_func": ("softmax",), "topk_method": ("greedy", "group_limited_greedy")},
    "deepseek_v3": {"scoring_func": ("sigmoid",), "topk_method": ("noaux_tc",)}}
"""The routing transformers' DeepSeek models run, by key: a config asking for another is refused."""
LATENT_DEFAULTS = {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
                   "v_head_dim": 128}
"""transformers' defaults of DeepSeek's latent attention sizes (V2 and V3 alike)."""
GROUP_DEFAULTS = {"deepseek_v3": {"n_group": 8, "topk_group": 4}}
"""transformers' defaults of the router's groups (DeepSeek-V2 has none: a group-limited config names them)."""
DEEPSEEK_DEFAULTS = {"deepseek_v2": {"n_shared_experts": 2, "first_k_dense_replace": 0, "num_nextn_predict_layers": 0},
                     "deepseek_v3": {"n_shared_experts": 1, "first_k_dense_replace": 3, "num_nextn_predict_layers": 1}}
"""transformers' defaults of the DeepSeek keys a config may leave out (V3's ``num_mtp_layers`` is
``num_nextn_predict_layers``)."""
ATTENTION_BIAS = {"gpt_oss": True}
"""transformers' default ``attention_bias`` of the mixture-of-experts types that take one (``GptOssConfig``: biases
on q, k, v and o); the others' attention has no biases."""


@dataclass(frozen=True)
class Experts:
    """What the cost model needs of a mixture-of-experts config's expert layers (gated SwiGLU experts)."""

    key: str
    """config.json's key of the number of routed experts (named in errors)."""
    routed: int
    """Routed experts E."""
    top_k: int
    """Experts each token is routed to, k."""
    ffn: int
    """Inner size f_e of one routed expert."""
    shared_ffn: int
    """Inner size of the shared experts together, which every token runs through (0: none)."""
    shared_gate: bool
    """A sigmoid gate, an h x 1 matmul, scales the shared experts' output (Qwen2-MoE)."""
    layers: tuple[bool, ...]
    """Which blocks have experts; the others have a dense MLP of inner size ``Architecture.ffn``."""
    groups: int = 1
    """Groups of consecutive experts the router limits a token to (``n_group`` where routing is group-limited:
    DeepSeek-V3's ``noaux_tc``, DeepSeek-V2's ``group_limited_greedy``; 1 otherwise)."""
    group_limit: int = 1
    """Groups a token's experts may come from (``topk_group``; ``groups`` where routing is not limited)."""
    biases: bool = False
    """The router and each expert's products have biases (gpt-oss: E on the router, 2·f_e on an expert's gate/up
    and h on its down)."""


@dataclass(frozen=True)
class Latent:
    """Multi-head latent attention (DeepSeek-V2, V3): queries, keys and values up-projected from low-rank latents."""

    q_rank: int
    """q_lora_rank, 0 where the queries are projected from h directly (q_lora_rank null)."""
    kv_rank: int
    """kv_lora_rank: the latent of keys and values."""
    nope: int
    """qk_nope_head_dim: a query or key head's part without rotary embedding."""
    rope: int
    """qk_rope_head_dim: its rotary part (one key head of it, shared by all heads)."""
    v: int
    """v_head_dim: a value head's size."""


def mixture(data: dict, kind: str, arch: dict[str, Any], where: str) -> dict[str, Any]:
    """What a mixture-of-experts config adds to a decoder's fields, as transformers builds the model: its experts,
    DeepSeek's latent attention and multi-token prediction layers, Qwen2-MoE's q/k/v biases, Qwen3-MoE's q/k
    norms, gpt-oss's biases and attention sinks."""
    read = ("attention_bias",) if kind in ATTENTION_BIAS else ()
    for key in ("attention_bias", "mlp_bias", "use_sliding_window"):
        if key not in read and boolean(data, key, False, where):
            raise InputError(f"{where}: {key} = True: not estimated for {kind} (biases, sliding windows)")
    top_k, layers = integer(data, "num_experts_per_tok", where), arch["layers"]
    shared, gate, extra = 0, False, {}
    if kind in ("mixtral", "gpt_oss"):
        key = "num_experts" if kind == "gpt_oss" and "num_local_experts" not in data else "num_local_experts"
        ffn, moe = integer(data, "intermediate_size", where), [True] * layers
        extra = _gpt_oss(data, top_k, where) if kind == "gpt_oss" else {}
    elif kind.startswith("qwen"):
        key = "num_experts" if kind == "qwen2_moe" or "num_local_experts" not in data else "num_local_experts"
        ffn = integer(data, "moe_intermediate_size", where)
        if kind == "qwen2_moe":
            shared, gate = integer(data, "shared_expert_intermediate_size", where, minimum=0), True
        step, only = integer(data, "decoder_sparse_step", where, 1), data.get("mlp_only_layers") or []
        if not isinstance(only, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in only):
            raise InputError(f"{where}: mlp_only_layers = {only!r}: should be a list of block indices")
        moe = [i not in only and (i + 1) % step == 0 for i in range(layers)]
        extra = {"qkv_bias": kind == "qwen2_moe" and boolean(data, "qkv_bias", True, where),
                 "qk_norm": kind == "qwen3_moe"}
    else:
        key, ffn = "n_routed_experts", integer(data, "moe_intermediate_size", where)
        extra = {**_deepseek(data, kind, where), "kv_heads": arch["heads"]}
        defaults = DEEPSEEK_DEFAULTS[kind]
        shared = ffn * integer(data, "n_shared_experts", where, defaults["n_shared_experts"], minimum=0)
        first = integer(data, "first_k_dense_replace", where, defaults["first_k_dense_replace"], minimum=0)
        moe = [i >= first for i in range(layers)]
    routed = integer(data, key, where)
    if top_k > routed:
        raise InputError(f"{where}: num_experts_per_tok = {top_k}: should be at most {key} = {routed}")
    groups, limit = _groups(data, kind, routed, where)
    return {**extra, "experts": Experts(key=key, routed=routed, top_k=top_k, ffn=ffn, shared_ffn=shared,
                                        shared_gate=gate, layers=tuple(moe), groups=groups, group_limit=limit,
                                        biases=kind == "gpt_oss")}


def _gpt_oss(data: dict, top_k: int, where: str) -> dict[str, Any]:
    """gpt-oss's attention as transformers 5.24's ``GptOssAttention`` builds it (``modeling_gpt_oss.py``): biases
    on q, k, v and o with ``attention_bias`` (default true), and one learned sink logit per query head
    (``self.sinks``). OpenAI's ``experts_per_token``, where the config repeats it, must agree with
    ``num_experts_per_tok``."""
    repeated = data.get("experts_per_token")
    if repeated is not None and repeated != top_k:
        raise InputError(f"{where}: experts_per_token = {repeated!r}: differs from num_experts_per_tok = {top_k} "
                         "(transformers routes by num_experts_per_tok)")
    bias = boolean(data, "attention_bias", ATTENTION_BIAS["gpt_oss"], where)
    return {"qkv_bias": bias, "biases": bias, "sinks": True}


def _groups(data: dict, kind: str, routed: int, where: str) -> tuple[int, int]:
    """(``n_group``, ``topk_group``) where transformers limits a token's experts to ``topk_group`` of ``n_group``
    groups of consecutive experts (DeepSeek-V3 always, DeepSeek-V2 with ``group_limited_greedy``), else (1, 1).
    The groups must divide the experts, and ``topk_group`` be at most ``n_group``."""
    if not (kind == "deepseek_v3" or kind == "deepseek_v2" and data.get("topk_method") == "group_limited_greedy"):
        return 1, 1
    defaults = GROUP_DEFAULTS.get(kind, {})
    groups = integer(data, "n_group", where, defaults.get("n_group", MISSING))
    limit = integer(data, "topk_group", where, defaults.get("topk_group", MISSING))
    if routed % groups or limit > groups:
        raise InputError(f"{where}: n_group = {groups}, topk_group = {limit}: n_group should divide the {routed} "
                         "experts and topk_group be at most n_group")
    return groups, limit


def _deepseek(data: dict, kind: str, where: str) -> dict[str, Any]:
    """DeepSeek's latent attention (its heads: queries and keys of nope + rope, values of v) and multi-token
    prediction layers; a routing or expert placement transformers does not build is refused."""
    for key, ways in ROUTING[kind].items():
        if data.get(key) is not None and data[key] not in ways:
            raise InputError(f"{where}: {key} = {data[key]!r}: transformers' {kind} routes by {', '.join(ways)}; "
                             "another routing is not estimated")
    if data.get("moe_layer_freq", 1) != 1:
        raise InputError(f"{where}: moe_layer_freq = {data['moe_layer_freq']!r}: only 1 is estimated (experts in "
                         "every block from first_k_dense_replace on, as transformers builds it)")
    sizes = {key: integer(data, key, where, default) for key, default in LATENT_DEFAULTS.items()}
    if "q_lora_rank" in data and data["q_lora_rank"] is None:
        sizes["q_lora_rank"] = 0
    latent = Latent(*sizes.values())
    return {"latent": latent, "head_dim": latent.nope + latent.rope,
            "mtp": integer(data, "num_nextn_predict_layers", where,
                        DEEPSEEK_DEFAULTS[kind]["num_nextn_predict_layers"], minimum=0)}
