"""torchtitan's per-op selective activation checkpointing (``--recompute op``): the grammar, the closed form of what a
block keeps and runs again, its costs between none and full, its document and exports, and the calibration runs
that use it."""

from __future__ import annotations

import json
import re

import pytest
from conftest import DEEPSEEK, LLAMA, MIXTRAL, load_torchtitan_config, torchtitan_export

from zbsolve import solve
from zbsolve.base.errors import InputError
from zbsolve.base.units import GIB
from zbsolve.configure.measured_runs import mapped, recompute_choice
from zbsolve.costmodel.estimate import estimate
from zbsolve.costmodel.hf_config import architecture
from zbsolve.costmodel.model import OP_POLICY
from zbsolve.costmodel.recompute_modules import LSE_BYTES
from zbsolve.io.targets import export_document
from zbsolve.planning.targets import recompute_choices
from zbsolve.problem.recompute import OP, RECOMPUTE_FORMS, parse_recompute
from zbsolve.problem.recompute_costs import layer_costs

S, B = 64, 2
OP_RUNS = ("llama3.1-8b-h100-8-bf16-fsdp", "llama3.1-8b-h100-128-bf16-fsdp", "llama3.1-8b-h200-32-fp8-fsdp")
"""The calibration runs measured under torchtitan's per-op policy."""


def small(config: dict, **options):
    return estimate(config, seq_len=S, microbatch_size=B, **options)


def test_the_grammar_reads_and_writes_op_and_refuses_it_among_megatrons_modules():
    assert parse_recompute("op") == parse_recompute(" op ") == OP and str(OP) == "op" and OP_POLICY in RECOMPUTE_FORMS
    assert OP.modules == (OP_POLICY,) and OP.mode == "none" and not OP.selective
    with pytest.raises(InputError, match="recompute = 'modules:op': module 'op' should be one of"):
        parse_recompute("modules:op")
    for text in ("op:2", "selective+op", "ops"):
        with pytest.raises(InputError, match=re.escape(f"recompute = {text!r}: should be one of ") + ".*, op "):
            parse_recompute(text)


def test_a_dense_block_keeps_what_the_rule_names():
    """Per token: the block input, q, v, the core's output, w1's and w2's outputs and the FP32 log-sum-exp a head;
    so the block keeps a share of what it keeps without recomputation, and more than its input alone."""
    model, arch = small(LLAMA), architecture(LLAMA)
    h, qd, kd, f, e, tokens = arch.hidden, arch.q_width, arch.kv_width, arch.ffn, 2, S * B
    index = next(i for i, layer in enumerate(model.layers) if layer.block)
    layer = model.layers[index]
    kept = tokens * (e * (2 * h + 2 * qd + kd + f) + LSE_BYTES * arch.heads)
    op, none, full = (layer_costs(model, index, False, modules=(OP_POLICY,)), layer_costs(model, index, False),
                      layer_costs(model, index, True))
    assert op["mem_f"] == kept == layer.mem_f - layer.recompute_modules[OP_POLICY].mem
    assert full["mem_f"] < op["mem_f"] < none["mem_f"]
    assert op["mem_f"] + op["mem_b"] + op["mem_w"] == 0
    assert op["mem_r"] == layer.mem_f - kept


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_b_runs_more_than_without_and_less_than_the_whole_forward(dtype):
    model = small(LLAMA, dtype=dtype)
    for index, layer in enumerate(model.layers):
        if not layer.block:
            continue
        op = layer_costs(model, index, False, modules=(OP_POLICY,))
        assert layer.t_b < op["t_b"] < layer_costs(model, index, True)["t_b"]
        assert layer_costs(model, index, True)["mem_f"] < op["mem_f"] < layer.mem_f


def test_only_dense_grouped_query_blocks_have_it():
    for config in (MIXTRAL, DEEPSEEK):
        model = small(config)
        assert all(OP_POLICY not in (layer.recompute_modules or {}) for layer in model.layers
                   if layer.block and layer.experts)
        with pytest.raises(InputError, match="recompute = 'op': block layers.* is not one torchtitan's per-op policy "
                                             "is costed for"):
            OP.module_names(model)


def test_torchtitan_plans_and_exports_it_and_megatron_refuses_it(tmp_path):
    model = small(LLAMA)
    assert recompute_choices("torchtitan", "op", model) == ("op",)
    with pytest.raises(InputError, match="recompute = 'op': .*megatron-core 0.16.1\\) has no per-op selective "
                                         "checkpointing .*use --target torchtitan"):
        recompute_choices("megatron", "op", model)
    result = solve(model, num_devices=2, num_microbatches=4, recompute="op", solver="heuristic",
                   device_memory=80 * GIB, reserve=0)
    assert result.costs.modules == (OP_POLICY,) and not result.costs.recomputed
    path = tmp_path / "plan.json"
    result.to_json(path)
    assert json.loads(path.read_text())["partition"]["modules"] == [OP_POLICY]
    config, args, _ = torchtitan_export(tmp_path, path)
    assert config["activation_checkpoint"] == "selective" and "override" not in config
    parsed = load_torchtitan_config(args)
    assert type(parsed.activation_checkpoint).__qualname__ == "SelectiveAC.Config"
    with pytest.raises(InputError, match="has no per-op selective checkpointing"):
        export_document(path, "megatron", tmp_path / "mg")


def test_the_calibration_runs_measured_under_it_are_predicted():
    import yaml

    from conftest import ROOT

    assert recompute_choice({"granularity": "selective", "method": "op"}) == "op"
    for name in OP_RUNS:
        run = yaml.safe_load((ROOT / "problems" / "calibration" / f"{name}.yaml").read_text())
        found = mapped(run)
        assert found.configuration is not None and found.configuration.recompute == "op", found.reason
