"""Memory as the runtimes allocate it: torchtitan's FP8 all-gather and FP32 gradients under FSDP, the pipeline
runtime's buffers, the CUDA context and NCCL's buffers, and ``predict``'s memory by part, which sums to what a
device needs and says by how much it does not fit."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from zbsolve.app.cli import app
from zbsolve.base.units import GIB
from zbsolve.configure.memory_parts import PARTS
from zbsolve.configure.predict import Configuration, predict
from zbsolve.costmodel.constants import CUDA_CONTEXT, FP8_GATHER_BYTES, NCCL_BUFFSIZE, NCCL_CHANNELS, NCCL_PEERS
from zbsolve.costmodel.estimate import estimate
from zbsolve.costmodel.runtime_memory import nccl_bytes, outside_allocator, pipeline_buffers
from zbsolve.costmodel.setup import Setup

CONFIG = "problems/models/configs/llama3-8b.json"
FSDP_PP = Configuration(config=CONFIG, dtype="fp8", seq_len=512, microbatch_size=1, global_batch=16, gpus=16, pp=4,
                        zero=3, recompute="full")


def block(setup: Setup):
    return estimate(CONFIG, setup).layers[1]


def test_torchtitan_gathers_fp8_weights_in_fp8_and_holds_fp32_gradients():
    kw = dict(seq_len=512, microbatch_size=1, dtype="fp8", zero=3, dp=8)
    megatron, titan = block(Setup(**kw)), block(Setup(**kw, runtime="torchtitan"))
    assert titan.params == megatron.params
    assert titan.gathered_grad_bytes == 4 * titan.params and megatron.gathered_grad_bytes == 2 * megatron.params
    weights = titan.gathered_bytes - titan.gathered_grad_bytes
    assert titan.params * FP8_GATHER_BYTES < weights < 2 * titan.params  # the norms' weights stay 16-bit
    assert titan.static_bytes < megatron.static_bytes  # no FP8 copy beside the shard


def test_static_parts_sum_to_the_static_bytes():
    layer = block(Setup(seq_len=512, microbatch_size=1, zero=1, dp=4))
    assert layer.grad_bytes == 2 * layer.params and layer.optimizer_bytes == 12 * layer.params // 4
    assert layer.static_bytes == 2 * layer.params + layer.grad_bytes + layer.optimizer_bytes


def test_nccl_and_the_context_count_each_communicator():
    assert nccl_bytes((1, 1, 1)) == 0
    assert nccl_bytes((8, 1, 4)) == 2 * NCCL_BUFFSIZE * NCCL_CHANNELS * NCCL_PEERS
    assert outside_allocator((8,)) == CUDA_CONTEXT + nccl_bytes((8,))
    assert Setup(seq_len=8, microbatch_size=1, tp=8).kept == outside_allocator((8,))
    assert Setup(seq_len=8, microbatch_size=1, tp=8, reserve=GIB).kept == GIB


def test_pipeline_buffers_are_torchtitan_s_per_microbatch():
    assert pipeline_buffers("megatron", 8, 10, 10, False, 5) == 0
    assert pipeline_buffers("torchtitan", 8, 0, 10, False, 5) == 80  # the first stage receives no activation
    assert pipeline_buffers("torchtitan", 8, 10, 0, True, 5) == 8 * (10 + 5)  # the last keeps its outputs


@pytest.mark.parametrize("runtime", ["megatron", "torchtitan"])
def test_the_parts_sum_to_what_a_device_needs(runtime):
    p = predict(FSDP_PP.replace(runtime=runtime))
    assert len(p.memory) == 4
    for m, allocated in zip(p.memory, p.peak_memory_gib):
        assert set(m.gib()) == set(PARTS) and min(m.gib().values()) >= 0
        assert sum(m.gib().values()) == pytest.approx(m.total / GIB)
        assert allocated == pytest.approx((m.total - m.outside) / GIB)
    buffers = [m.buffers for m in p.memory]
    assert (max(buffers) > 0) == (runtime == "torchtitan")
    assert p.memory[-1].logits > 0 and p.memory[0].logits == 0 and p.memory[0].recompute > 0


def test_a_device_that_does_not_fit_gives_its_shortfall_and_predict_exits_1():
    small = FSDP_PP.replace(device_memory=2 * GIB)
    p = predict(small)
    assert not p.fits
    assert p.shortfall_gib[0] == pytest.approx(p.memory[0].total / GIB - 2)
    args = [CONFIG, "--dtype", "fp8", "--seq-len", "512", "--microbatch-size", "1", "--global-batch", "16", "--gpus",
            "16", "--pp", "4", "--zero", "3", "--recompute", "full", "--device-memory", "2GiB"]
    run = CliRunner().invoke(app, ["predict", *args, "--json"])
    assert run.exit_code == 1
    assert json.loads(run.output)["shortfall_gib"][0] > 0
    run = CliRunner().invoke(app, ["predict", *args])
    assert run.exit_code == 1 and "short" in run.output
    assert CliRunner().invoke(app, ["predict", *args[:-2]]).exit_code == 0
