"""Megatron's combined 1F1B (--overlap-moe-expert-parallel-comm --delay-wgrad-compute): where zbsolve says it runs,
each condition checked against megatron-core 0.16.1's own ``TransformerConfig`` validation."""

from __future__ import annotations

import warnings

import pytest
from conftest import COMBINED_CASES, combined_toy

from zbsolve.costmodel.model import Model
from zbsolve.io.targets.megatron import DISPATCHER_FLAGS
from zbsolve.io.targets.megatron.overlap import combined_refusal


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


@pytest.mark.parametrize("case", list(COMBINED_CASES))
def test_each_condition_is_megatron_cores_verdict(case):
    arguments, devices, chunks, full, modules = COMBINED_CASES[case]
    model = combined_toy(**arguments)
    why = combined_refusal(model, devices, chunks, full, modules)
    assert (why is None) == _megatron_core_takes(model, devices, chunks, full, modules), why


def test_moe_recomputation_is_refused_though_megatron_core_takes_it():
    """megatron-core accepts ``moe`` among the recomputed modules with the overlap, but then runs a MoE layer's
    parts itself (fine_grained_callables.py), so MoELayer.forward's checkpoint never runs: zbsolve refuses it."""
    model = combined_toy()
    assert _megatron_core_takes(model, 2, 2, False, ("moe",))
    assert combined_refusal(model, 2, 2, False, ("moe",)) == (
        "'moe' is among the recomputed modules, which it runs as its parts without MoELayer.forward's checkpoint")
    assert combined_refusal(model.model_copy(update={"setting": None}), 2, 2, False) is not None
