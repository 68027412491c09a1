"""Megatron's combined 1F1B (--overlap-moe-expert-parallel-comm --delay-wgrad-compute): where zbsolve says it runs,
each condition checked against megatron-core 0.16.1's own ``TransformerConfig`` validation."""

from __future__ import annotations

import warnings

import pytest
from conftest import export_toy

from zbsolve.costmodel.model import Layer, Model, Setting
from zbsolve.io.targets.megatron import DISPATCHER_FLAGS
from zbsolve.io.targets.megatron.overlap import combined_refusal


def _model(experts: bool = True, ep: int | None = 2, dtype: str = "bf16", mtp: int = 0) -> Model:
    """The export toy with a setting; its blocks with experts (half of F and B all-to-all) where asked, and ``mtp``
    MTP layers before the head."""
    toy = export_toy()
    layers = [layer.model_copy(update={"comm_f": 0.5, "comm_b": 0.5}) if layer.block and experts else layer
              for layer in toy.layers]
    extra = [Layer(name=f"mtp.{i}", t_f=1.0, t_b=1.0, t_w=0.5, mem_f=2, mem_b=-1, mem_w=-1, static_bytes=10,
                   out_bytes=1) for i in range(mtp)]
    setting = Setting(seq_len=16, microbatch_size=1, dp=4, ep=ep if experts else None, dtype=dtype)
    return Model(name="toy", setting=setting, layers=[*layers[:-1], *extra, layers[-1]])


CASES = {  # (model arguments, devices, chunks, full, modules)
    "interleaved": ({}, 2, 2, False, ()),
    "no pipeline": ({}, 1, 1, False, ()),
    "no virtual stages": ({}, 2, 1, False, ()),
    "ep 1": ({"ep": 1}, 2, 2, False, ()),
    "dense": ({"experts": False}, 2, 2, False, ()),
    "full recomputation": ({}, 2, 2, True, ()),
    "selective modules": ({}, 2, 2, False, ("mlp", "core_attn")),
    "fp16": ({"dtype": "fp16"}, 2, 2, False, ()),
    "fp32": ({"dtype": "fp32"}, 2, 2, False, ()),
    "one mtp layer": ({"mtp": 1}, 2, 2, False, ()),
    "two mtp layers": ({"mtp": 2}, 2, 2, False, ()),
    "mtp without pipeline": ({"mtp": 1}, 1, 1, False, ()),
}


def _megatron_core_takes(model: Model, devices: int, chunks: int, full: bool, modules: tuple[str, ...]) -> bool:
    """Whether megatron-core's ``TransformerConfig`` accepts the combined-1F1B flags for this plan, its fields as
    Megatron-LM makes them from the export's arguments (a layout of ``chunks`` virtual stages per rank; recomputed
    blocks as ``--recompute-granularity full --recompute-method uniform --recompute-num-layers 1``)."""
    config = pytest.importorskip("megatron.core.transformer.transformer_config",
                                 reason="megatron-core is not installed (the dev extra pins 0.16.1)")
    import torch

    setting = model.setting
    assert setting is not None
    flags = dict(zip(DISPATCHER_FLAGS["alltoall"][::2], DISPATCHER_FLAGS["alltoall"][1::2]))
    recompute = ({"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1} if full
                 else {"recompute_granularity": "selective", "recompute_modules": list(modules)} if modules else {})
    experts = any(layer.experts for layer in model.layers)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(setting.dtype, torch.float32)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            config.TransformerConfig(
                num_layers=6, hidden_size=8, num_attention_heads=2, pipeline_model_parallel_size=devices,
                virtual_pipeline_model_parallel_size=chunks if chunks > 1 else None, pipeline_dtype=dtype,
                bf16=setting.dtype == "bf16", fp16=setting.dtype == "fp16",
                num_moe_experts=8 if experts else None, expert_model_parallel_size=setting.ep or 1,
                moe_token_dispatcher_type=flags["--moe-token-dispatcher-type"], mtp_num_layers=len(model.mtp_layers)
                or None, overlap_moe_expert_parallel_comm=True, delay_wgrad_compute=True, **recompute)
    except AssertionError:
        return False
    return True


@pytest.mark.parametrize("case", list(CASES))
def test_each_condition_is_megatron_cores_verdict(case):
    arguments, devices, chunks, full, modules = CASES[case]
    model = _model(**arguments)
    why = combined_refusal(model, devices, chunks, full, modules)
    assert (why is None) == _megatron_core_takes(model, devices, chunks, full, modules), why


def test_moe_recomputation_is_refused_though_megatron_core_takes_it():
    """megatron-core accepts ``moe`` among the recomputed modules with the overlap, but then runs a MoE layer's
    parts itself (fine_grained_callables.py), so MoELayer.forward's checkpoint never runs: zbsolve refuses it."""
    model = _model()
    assert _megatron_core_takes(model, 2, 2, False, ("moe",))
    assert combined_refusal(model, 2, 2, False, ("moe",)) == (
        "'moe' is among the recomputed modules, which it runs as its parts without MoELayer.forward's checkpoint")
    assert combined_refusal(model.model_copy(update={"setting": None}), 2, 2, False) is not None
