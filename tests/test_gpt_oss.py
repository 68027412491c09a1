"""gpt-oss (model_type gpt_oss) as the estimate reads it: the shipped gpt-oss-120b config against the model card's
parameter counts, the sliding windows on alternate blocks, the parameters of transformers' own ``GptOssForCausalLM``
(biases, sinks), the refusals, and ``predict`` on the published calibration run's configuration."""

from __future__ import annotations

import re

import pytest
from conftest import ROOT

from zbsolve.base.errors import InputError
from zbsolve.configure.predict import Configuration, predict
from zbsolve.costmodel.estimate import count_parameters, estimate
from zbsolve.costmodel.hf_config import architecture

CONFIG = ROOT / "problems" / "models" / "configs" / "gpt-oss-120b.json"
SMALL = {"model_type": "gpt_oss", "architectures": ["GptOssForCausalLM"], "hidden_size": 64, "intermediate_size": 48,
         "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 24,
         "num_local_experts": 8, "num_experts_per_tok": 2, "experts_per_token": 2, "vocab_size": 128,
         "sliding_window": 8, "max_position_embeddings": 256}
"""A small gpt-oss: 4 blocks of 8 experts (top 2), head_dim 24 (a·d = 96 is not h), a window of 8."""


def test_the_shipped_config_has_the_model_cards_parameters():
    """The gpt-oss model card: 116.83e9 parameters, 5.13e9 active, the latter without the embedding (a gather; the
    unembedding is counted), both given to 0.01e9."""
    arch = architecture(CONFIG)
    total, active = count_parameters(CONFIG), count_parameters(CONFIG, active=True)
    assert abs(total - 116.83e9) <= 0.005e9
    assert abs(active - arch.embedding_params - 5.13e9) <= 0.005e9
    assert (arch.experts.routed, arch.experts.top_k, arch.experts.ffn, arch.experts.shared_ffn) == (128, 4, 2880, 0)
    assert all(arch.experts.layers) and arch.head_dim == 64 and arch.q_width == 4096 != arch.hidden
    assert arch.qkv_bias and arch.biases and arch.sinks and arch.experts.biases


def test_sliding_windows_alternate_from_the_first_block():
    """layer_types as published (and, left out, GptOssConfig's default: every other block from the first) gives the
    window to blocks 0, 2, 4, ...; without ``sliding_window`` (null) no block has one."""
    assert architecture(CONFIG).windows == (128, None) * 18
    assert architecture(SMALL).windows == (8, None, 8, None)
    types = ["full_attention", "full_attention", "sliding_attention", "full_attention"]
    assert architecture({**SMALL, "layer_types": types}).windows == (None, None, 8, None)
    assert architecture({**SMALL, "sliding_window": None}).windows == (None,) * 4


def test_parameters_are_transformers_own():
    """Every parameter of transformers' ``GptOssForCausalLM`` built from the small config (q/k/v/o biases, one sink
    a head, the router's bias, each expert's gate/up and down biases) is counted, with ``attention_bias`` on and
    off."""
    torch = pytest.importorskip("torch", reason="torch is not installed (the torch extra)")
    transformers = pytest.importorskip("transformers", reason="transformers is not installed (the dev extra)")
    for bias in (True, False):
        config = {**SMALL, "attention_bias": bias}
        settings = {key: value for key, value in config.items() if key not in ("model_type", "architectures")}
        with torch.device("meta"):
            built = transformers.AutoModelForCausalLM.from_config(
                transformers.AutoConfig.for_model("gpt_oss", **settings))
        assert count_parameters(config) == sum(p.numel() for p in built.parameters())


@pytest.mark.parametrize("change, message", [
    ({"model_type": "mixtral"}, "experts_per_token = 2: not read by the estimate of mixtral"),
    ({"model_type": "mixtral", "experts_per_token": None}, "architectures = ['GptOssForCausalLM']: not Mixtral's "
                                                           "classes"),
    ({"model_type": "llama", "architectures": None}, "num_local_experts = 8: mixture-of-experts layers are not "
                                                     "estimated"),
    ({"architectures": ["MixtralForCausalLM"]}, "architectures = ['MixtralForCausalLM']: not GptOss's classes"),
    ({"moe_intermediate_size": 32}, "moe_intermediate_size = 32: not read by the estimate of gpt_oss"),
    ({"n_shared_experts": 1}, "n_shared_experts = 1: not read by the estimate of gpt_oss"),
    ({"experts_per_token": 4}, "experts_per_token = 4: differs from num_experts_per_tok = 2"),
    ({"layer_types": ["sliding_attention", "chunked_attention", "sliding_attention", "full_attention"]},
     "layer_types[1] = 'chunked_attention': should be one of full_attention, sliding_attention"),
    ({"layer_types": ["sliding_attention", "full_attention"]}, "layer_types = ['sliding_attention', "
                                                              "'full_attention']: should have 4 entries"),
    ({"mlp_bias": True}, "mlp_bias = True: not estimated for gpt_oss"),
    ({"attention_bias": "yes"}, "attention_bias = 'yes': should be true or false"),
])
def test_refusals(change, message):
    with pytest.raises(InputError, match=re.escape(message)) as exc:
        architecture({**SMALL, **change})
    assert "\n" not in str(exc.value)


def test_windowed_blocks_cost_less_attention():
    """At s = 64 the windowed blocks' attention core counts the pairs less than 8 apart, the full blocks all s²:
    the same weights, fewer FLOPs."""
    layers = estimate(SMALL, seq_len=64, microbatch_size=1).layers
    windowed, full = layers[1], layers[2]
    assert windowed.params == full.params and windowed.flops_f < full.flops_f


def test_predict_takes_the_published_run():
    """The calibration run's configuration (64 H100, PP 4, EP 8, DP 16, selective recomputation of the norms and
    the experts' activation) predicts a step that fits."""
    run = Configuration(config=CONFIG, gpu="h100", dtype="bf16", seq_len=4096, microbatch_size=1, global_batch=1280,
                        gpus=64, pp=4, ep=8, recompute="modules:layernorm,moe_act")
    result = predict(run)
    assert result.step_time_s > 0 and result.fits and not result.warnings
    assert result.counts == (9 + 1, 9, 9, 9 + 2) and result.dp == 16 and result.num_microbatches == 80
