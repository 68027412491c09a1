"""torchtitan's Llama block in eager PyTorch (``--no-compile``, ``costmodel.eager``): the memory-bound kernels
counted from its model code, their times in F, B and the per-op policy's recomputation, the refusals, and the
calibration runs that ran eager."""

from __future__ import annotations

import pytest
import yaml
from conftest import ROOT

from zbsolve.base.errors import InputError
from zbsolve.configure.measured_runs import mapped
from zbsolve.configure.predict import Configuration
from zbsolve.costmodel import eager
from zbsolve.costmodel.estimate import estimate
from zbsolve.costmodel.hf_config import architecture
from zbsolve.costmodel.setup import Setup

CONFIGS = ROOT / "problems" / "models" / "configs"
LLAMA_8B = CONFIGS / "llama3-8b.json"
EAGER_RUNS = ("llama3.1-8b-h100-8-bf16-fsdp", "llama3.1-8b-h100-128-bf16-fsdp")
"""The calibration runs torchtitan ran without torch.compile."""


def test_the_eager_llama_block_moves_what_its_ops_move():
    arch = architecture(LLAMA_8B)
    h, f = arch.hidden, arch.ffn
    (forward, backward, weights), kernels = eager.llama_block(arch, 2)
    # docs/cost-model.md's table at e = 2, h = qd = 4096, kd = 1024: norms 2 x 36h and 2 x 92h, rotary 20 bytes an
    # element of Q and K each way, repeat_kv 4 bytes an element of qd + kd, SwiGLU 10f and 18f, adds 12h and 30h
    assert forward == 2 * 36 * h + 20 * (h + 1024) + 4 * (h + 1024) + 10 * f + 12 * h == 149 * h
    assert backward == 2 * 92 * h + 20 * (h + 1024) + 4 * (h + 1024) + 18 * f + 30 * h == 307 * h
    assert weights == 0 and kernels == (28, 48, 0)
    assert eager.rms_norm(h, 2)[0][:2] == (36 * h, 92 * h)


def test_eager_slows_f_and_b_and_the_recomputation_but_not_w():
    setup = Setup(seq_len=1024, microbatch_size=1, runtime="torchtitan", recompute="op")
    fused, unfused = estimate(LLAMA_8B, setup), estimate(LLAMA_8B, setup.replace(compile=False))
    a, b = fused.layers[1], unfused.layers[1]
    assert b.t_f > a.t_f and b.t_b > a.t_b and b.t_w == pytest.approx(a.t_w)
    assert (b.flops_f, b.flops_b, b.flops_w, b.mem_f) == (a.flops_f, a.flops_b, a.flops_w, a.mem_f)
    assert a.recompute_modules is not None and b.recompute_modules is not None
    assert b.recompute_modules["op"].t > a.recompute_modules["op"].t
    assert b.recompute_modules["op"].mem == a.recompute_modules["op"].mem
    # the embedding and the head as they were: torchtitan 9dec370 compiles the blocks alone
    assert (unfused.layers[0].t_f, unfused.layers[-1].t_f) == (fused.layers[0].t_f, fused.layers[-1].t_f)


def test_eager_is_refused_outside_torchtitan_s_llama_block():
    with pytest.raises(InputError, match="compile = False: runtime = 'megatron'"):
        Setup(seq_len=1024, microbatch_size=1, compile=False)
    with pytest.raises(InputError, match="compile = False: eager kernels are counted for torchtitan's Llama"):
        estimate(CONFIGS / "qwen3-30b-a3b.json", seq_len=1024, microbatch_size=1, runtime="torchtitan",
                 compile=False)


def test_the_runs_torchtitan_ran_eager_are_predicted_eager():
    for path in sorted((ROOT / "problems" / "calibration").glob("*.yaml")):
        run = yaml.safe_load(path.read_text())
        found = mapped(run).configuration
        if found is None:
            continue
        assert found.compile == (run["name"] not in EAGER_RUNS), run["name"]
        assert ("--no-compile" in found.command().split()) == (not found.compile)


def test_predict_takes_no_compile():
    line = Configuration(config=LLAMA_8B, seq_len=8192, microbatch_size=2, global_batch=16, gpus=8, zero=3,
                         recompute="op", runtime="torchtitan", compile=False).command()
    assert line.endswith("--runtime torchtitan --no-compile")
