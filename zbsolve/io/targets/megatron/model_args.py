"""Megatron-LM's model arguments of a Hugging Face config: the sizes, attention, position embedding, normalisation,
activation, biases, dropout, embeddings and experts that ``zbsolve estimate`` read (``costmodel.hf_config``), so
that ``pretrain_gpt.py`` builds the model the costs are for.

Checked against Megatron-LM at tag core_v0.16.1: ``megatron/training/arguments.py`` (``_add_network_size_args``:
``--max-position-embeddings``, ``--position-embedding-type``, ``--rotary-base``, ``--use-rope-scaling``,
``--rope-scaling-factor``, ``--swiglu``, ``--untie-embeddings-and-output-weights``, ``--group-query-attention``; the
others are megatron-core 0.16.1's ``TransformerConfig`` and ``MLATransformerConfig`` fields made flags by
``ArgumentGroupFactory``: ``--num-layers``, ``--hidden-size``, ``--ffn-hidden-size``, ``--num-attention-heads``,
``--num-query-groups``, ``--kv-channels``, ``--normalization``, ``--norm-epsilon``, ``--add-bias-linear``
(``--disable-bias-linear``), ``--add-qkv-bias``, ``--attention-dropout``, ``--hidden-dropout``, ``--qk-layernorm``,
``--moe-*``, ``--q-lora-rank``, ``--kv-lora-rank``, ``--qk-head-dim``, ``--qk-pos-emb-head-dim``, ``--v-head-dim``,
``--mtp-num-layers``; ``_add_moe_args``: ``--num-experts``, ``--moe-layer-freq``; ``_add_mla_args``:
``--multi-latent-attention``; ``_add_tokenizer_args``: ``--vocab-size``). Megatron's defaults differ from a Llama's
(dropout 0.1, biases on, learned positions, LayerNorm, GeLU, tied embeddings), so every one is written.
"""

from __future__ import annotations

from pathlib import Path

from zbsolve.base.errors import InputError
from zbsolve.costmodel.config_values import read_config
from zbsolve.costmodel.hf_config import Architecture, architecture

NORM_EPSILON = {"gpt2": "layer_norm_epsilon", "gpt_neox": "layer_norm_eps"}
"""config.json's key of the norms' epsilon where it is not ``rms_norm_eps``."""
ROPE_BASE = {"gpt_neox": "rotary_emb_base"}
"""config.json's key of RoPE's base where it is not ``rope_theta``."""
LLAMA3_ROPE = "llama3"
"""The ``rope_scaling.rope_type`` Megatron's ``--use-rope-scaling`` applies (Llama 3.1's frequency scaling)."""


def model_arguments(config: dict | str | Path, seq_len: int) -> list[str]:
    """Megatron-LM's arguments building the decoder of the Hugging Face ``config`` (a mapping or a config.json) for
    sequences of ``seq_len`` tokens. ``--max-position-embeddings`` is the config's (``validate_args`` asks for it to
    be at least ``--seq-length``: ``rules``). A config Megatron cannot build as transformers does (a sliding window,
    rope scaling other than Llama 3's, a partial rotary embedding) is an ``InputError`` naming the field."""
    data, where = read_config(config)
    arch = architecture(config)
    if any(window is not None for window in arch.windows):
        raise InputError(f"{where}: sliding_window: Megatron's --window-size is not written by the export; the "
                         "costs assume windowed blocks")
    args = ["--num-layers", str(arch.layers), "--hidden-size", str(arch.hidden),
            "--ffn-hidden-size", str(arch.ffn), "--num-attention-heads", str(arch.heads)]
    if arch.latent is None:
        if arch.kv_heads < arch.heads:
            args += ["--group-query-attention", "--num-query-groups", str(arch.kv_heads)]
        if arch.head_dim * arch.heads != arch.hidden:
            args += ["--kv-channels", str(arch.head_dim)]
    args += ["--max-position-embeddings", str(_max_positions(data, arch, where)), "--vocab-size", str(arch.vocab),
             *_positions(data, arch, where), *_norms(data, arch, where)]
    args += ["--swiglu"] * arch.gated + ["--untie-embeddings-and-output-weights"] * (not arch.tied)
    args += ["--disable-bias-linear"] * (not arch.biases) + ["--add-qkv-bias"] * (arch.qkv_bias and not arch.biases)
    args += ["--attention-dropout", _dropout(data, arch, "attention"),
             "--hidden-dropout", _dropout(data, arch, "hidden")]
    args += ["--qk-layernorm"] * arch.qk_norm
    return args + _experts(arch) + _latent(arch)


def _max_positions(data: dict, arch: Architecture, where: str) -> int:
    """The config's position limit: GPT-2's learned positions, else ``max_position_embeddings``."""
    if arch.positions:
        return arch.positions
    value = data.get("max_position_embeddings")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{where}: max_position_embeddings = {value!r}: Megatron needs it (--max-position-embeddings)")
    return value


def _positions(data: dict, arch: Architecture, where: str) -> list[str]:
    """The position embedding: learned (GPT-2) or RoPE with its base, and Llama 3's frequency scaling."""
    if arch.positions:
        return ["--position-embedding-type", "learned_absolute"]
    key = ROPE_BASE.get(arch.model_type, "rope_theta")
    base = data.get(key, 10000)
    if isinstance(base, bool) or not isinstance(base, (int, float)) or base <= 0 or base != int(base):
        raise InputError(f"{where}: {key} = {base!r}: Megatron's --rotary-base takes a whole number")
    if data.get("rotary_pct", data.get("partial_rotary_factor", 1.0)) != 1.0:
        raise InputError(f"{where}: a partial rotary embedding (rotary_pct, partial_rotary_factor) is not written by "
                         "the export")
    args = ["--position-embedding-type", "rope", "--rotary-base", str(int(base))]
    scaling = data.get("rope_scaling")
    if scaling and arch.latent is not None and isinstance(scaling, dict) and scaling.get("type") == "yarn":
        return args + [token for flag, value in (("--rotary-scaling-factor", scaling.get("factor", 1.0)),
                                                 ("--mscale", scaling.get("mscale", 1.0)),
                                                 ("--mscale-all-dim", scaling.get("mscale_all_dim", 0.0)))
                       for token in (flag, f"{float(value):g}")]
    if scaling:
        kind = scaling.get("rope_type", scaling.get("type")) if isinstance(scaling, dict) else None
        factor = scaling.get("factor") if isinstance(scaling, dict) else None
        if kind != LLAMA3_ROPE or isinstance(factor, bool) or not isinstance(factor, (int, float)):
            raise InputError(f"{where}: rope_scaling = {scaling!r}: Megatron's --use-rope-scaling is Llama 3's "
                             "(rope_type llama3, with a factor) only; YaRN with latent attention (DeepSeek)")
        args += ["--use-rope-scaling", "--rope-scaling-factor", f"{float(factor):g}"]
    return args


def _norms(data: dict, arch: Architecture, where: str) -> list[str]:
    """The normalisation (RMSNorm where a norm has h parameters, else LayerNorm) and its epsilon."""
    key = NORM_EPSILON.get(arch.model_type, "rms_norm_eps")
    eps = data.get(key, 1e-5)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or eps <= 0:
        raise InputError(f"{where}: {key} = {eps!r}: should be a number > 0")
    return ["--normalization", "RMSNorm" if arch.norm_params == arch.hidden else "LayerNorm",
            "--norm-epsilon", f"{eps:g}"]


def _dropout(data: dict, arch: Architecture, which: str) -> str:
    """The attention or hidden dropout the config states (0 where the costs count none)."""
    on = arch.attention_dropout if which == "attention" else arch.hidden_dropout
    if not on:
        return "0.0"
    keys = {"gpt2": {"attention": "attn_pdrop", "hidden": "resid_pdrop"}}.get(arch.model_type, {})
    return f"{float(data.get(keys.get(which, f'{which}_dropout'), 0.1)):g}"


def _experts(arch: Architecture) -> list[str]:
    """A mixture of experts' arguments: its experts, router, experts' size, shared experts and which blocks have
    experts (``--moe-layer-freq`` as a Python list expression)."""
    experts = arch.experts
    if experts is None:
        return []
    args = ["--num-experts", str(experts.routed), "--moe-router-topk", str(experts.top_k),
            "--moe-ffn-hidden-size", str(experts.ffn)]
    if experts.shared_ffn:
        args += ["--moe-shared-expert-intermediate-size", str(experts.shared_ffn)]
        args += ["--moe-shared-expert-gate"] * experts.shared_gate
    if not all(experts.layers):
        args += ["--moe-layer-freq", _pattern(experts.layers)]
    if experts.groups > 1:
        args += ["--moe-router-num-groups", str(experts.groups), "--moe-router-group-topk", str(experts.group_limit)]
    if arch.model_type == "deepseek_v3":
        args += ["--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias"]
    return args


def _pattern(layers: tuple[bool, ...]) -> str:
    """Which blocks have experts as Megatron's list expression: ``([0]*3+[1]*58)``."""
    runs: list[tuple[int, int]] = []
    for flag in layers:
        if runs and runs[-1][0] == int(flag):
            runs[-1] = (int(flag), runs[-1][1] + 1)
        else:
            runs.append((int(flag), 1))
    return "(" + "+".join(f"[{flag}]*{n}" for flag, n in runs) + ")"


def _latent(arch: Architecture) -> list[str]:
    """Multi-head latent attention's sizes (DeepSeek) and its multi-token prediction layers."""
    latent = arch.latent
    args = [] if latent is None else [
        "--multi-latent-attention", "--kv-lora-rank", str(latent.kv_rank), "--qk-head-dim", str(latent.nope),
        "--qk-pos-emb-head-dim", str(latent.rope), "--v-head-dim", str(latent.v),
        *(["--q-lora-rank", str(latent.q_rank)] if latent.q_rank else [])]
    return args + (["--mtp-num-layers", str(arch.mtp)] if arch.mtp else [])
