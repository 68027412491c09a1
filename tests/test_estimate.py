"""The cost model of docs/cost-model.md against figures written out by hand for a tiny config, against torch's
FLOP counter on the same layers built in plain torch and on the transformers model (the counting path, where
transformers is installed), and through ``zbsolve estimate``; the model files under problems/models/ are what their
recorded command writes."""

from __future__ import annotations

import json
import math
import re
import shlex

import pytest
from conftest import ROOT
from typer.testing import CliRunner

from zbsolve.app.cli import app
from zbsolve.base.errors import InputError
from zbsolve.costmodel import counting
from zbsolve.costmodel.constants import (
    KERNEL_GAP,
    KERNEL_LAUNCH,
    NCCL_BASE_LATENCY,
    NCCL_NVLINK_HOP,
    NCCL_NVLINK_SHARE,
    NCCL_PROTOCOL_SHARE,
    P2P_LATENCY,
)
from zbsolve.costmodel.estimate import (
    FP8_WEIGHT_BYTES,
    count_parameters,
    estimate,
    reference_flops_per_token,
    saving_windows,
)
from zbsolve.costmodel.gpus import GPUS
from zbsolve.costmodel.hf_config import architecture, attended_pairs
from zbsolve.costmodel.kernels import Kernels, Matmul
from zbsolve.costmodel.model import Model
from zbsolve.problem.partition import partition, stage_profile

TINY = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 100, "tie_word_embeddings": False}
"""A Llama-shaped config: h = 64, L = 2, a = 4, k = 2 (d = 16), f = 128, V = 100."""
WINDOWED = {**TINY, "model_type": "mistral", "sliding_window": 6}
"""TINY as Mistral, whose attention has a sliding window: 6 keys a query, itself included."""
MIXED = {**TINY, "model_type": "qwen2", "use_sliding_window": True, "sliding_window": 6, "max_window_layers": 1}
"""TINY as Qwen2 with a sliding window from its second block on (transformers' Qwen2: blocks >= max_window_layers)."""
MISTRAL_7B = {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 4096,
              "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
              "head_dim": 128, "max_position_embeddings": 32768, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
              "sliding_window": 4096, "tie_word_embeddings": False, "vocab_size": 32000, "attention_dropout": 0.0}
"""Mistral-7B-v0.1's config.json (its public fields)."""
S, B = 16, 2
N = S * B
"""Sequence length, microbatch size and tokens of a microbatch (32)."""
H100 = GPUS["h100"]
PEAK = H100.flops * 0.4
HBM = H100.hbm_bytes_per_s * 0.4
"""The H100 preset's FLOP/s and HBM bytes/s at an explicit efficiency of 0.4 (the model before the kernel model)."""
MODELS = sorted((ROOT / "problems" / "models").glob("*.yaml"))
CONFIGS = ROOT / "problems" / "models" / "configs"
RUNNER = CliRunner()


def tiny(**options) -> Model:
    return estimate(TINY, seq_len=S, microbatch_size=B, **options)


def zbsolve(*args: object):
    return RUNNER.invoke(app, [str(a) for a in args], env={"COLUMNS": "100000"})


# -- the cost model, by hand ---------------------------------------------------------------------------------
# Block matmul weights: q 64*64 = 4096, k and v 64*32 = 2048 each, o 4096, MLP 3*64*128 = 24576; 36864 in all.
# F = B = W = 2 * 32 * 36864 = 2359296 for the matmuls; attention core F = 4 * N * s * a * d = 4*32*16*64 = 131072,
# its backward twice that, all in B.
BLOCK_FLOPS = (2359296 + 131072, 2359296 + 262144, 2359296)
HEAD_FLOPS = 2 * 32 * 64 * 100  # 409600 in each of F, B and W


def test_flops_by_hand():
    model = tiny()
    assert [layer.name for layer in model.layers] == ["tok_embeddings", "layers.0", "layers.1", "norm", "output"]
    for layer in model.layers[1:3]:
        assert (layer.flops_f, layer.flops_b, layer.flops_w) == BLOCK_FLOPS
    assert (model.layers[-1].flops_f, model.layers[-1].flops_b, model.layers[-1].flops_w) == (HEAD_FLOPS,) * 3
    for layer in (model.layers[0], model.layers[3]):
        assert (layer.flops_f, layer.flops_b, layer.flops_w) == (0, 0, 0)


def test_activation_bytes_by_hand():
    model = tiny()
    emb, block, norm, head = model.layers[0], model.layers[1], model.layers[3], model.layers[4]
    # Saved by F, per token (elements): norm inputs 2*64, q/k/v input 64, Q 64, K 32, V 32, o input 64, MLP input
    # 64, gate, up and down input 3*128: 832 elements, 2 bytes each, 32 tokens.
    assert block.mem_f == 832 * 2 * 32 == 53248
    # Kept for W (matmul inputs and output gradients): q/k/v 64 + 128, o 64 + 64, gate/up 64 + 256, down 128 + 64.
    assert (block.mem_b, block.mem_w) == (53248 - 53248, -53248)
    # Embedding: F keeps the int64 token ids (256) and reserves its output gradient (32*64*2 bytes), which arrives
    # at B and waits for W: F allocates, B and W only free.
    assert (emb.mem_f, emb.mem_b, emb.mem_w) == (256 + 4096, 0, -4352)
    assert (norm.mem_f, norm.mem_b, norm.mem_w) == (4096, -4096, 0)
    # Head under torchtitan's eager loss: F keeps its input (4096) and fp32 log-probabilities (32*100*4); W keeps
    # the input and the logits' gradient (32*100*2); B holds two fp32 gradients of the logits beside.
    titan = tiny(runtime="torchtitan").layers[4]
    assert (titan.mem_f, titan.mem_b, titan.mem_w) == (4096 + 12800, 6400 - 12800, -(4096 + 6400))
    assert titan.held_b == 2 * 12800
    # Under Megatron (Transformer Engine's fused cross entropy) F keeps the 16-bit logits, which hold their
    # gradient from F on (32*100*2): W needs no more, B holds nothing beside.
    assert (head.mem_f, head.mem_b, head.mem_w, head.held_b) == (4096 + 6400, 0, -(4096 + 6400), None)
    assert [layer.out_bytes for layer in model.layers] == [4096, 4096, 4096, 4096, 4]
    # Without flash attention the probabilities stay: a * s elements a token, 2 bytes, 32 tokens.
    assert tiny(flash_attention=False).layers[1].mem_f == 53248 + 4 * 16 * 2 * 32


def test_korthikanti_and_zero_bubble_memory():
    """GPT-2 style (dropout, no flash attention): F keeps 34·s·b·h + 5·a·s²·b bytes (Korthikanti et al. 2022,
    Table 2), W needs 32·s·b·h (the Zero Bubble paper, Table 1)."""
    gpt = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 100, "n_positions": 16}
    block = estimate(gpt, seq_len=S, microbatch_size=B, flash_attention=False).layers[1]
    assert block.mem_f == 34 * S * B * 64 + 5 * 4 * S * S * B
    assert block.mem_w == -32 * S * B * 64
    assert estimate(gpt, seq_len=S, microbatch_size=B).layers[1].mem_f == 34 * S * B * 64


def test_times_static_and_comm_by_hand():
    """An explicit efficiency: FLOPs over that share of the BF16 peak, the end layers' bytes over that share of
    HBM bandwidth."""
    model = tiny(efficiency=0.4)
    emb, block, norm, head = model.layers[0], model.layers[1], model.layers[3], model.layers[4]
    assert (block.t_f, block.t_b, block.t_w) == pytest.approx([f / PEAK for f in BLOCK_FLOPS], rel=1e-12)
    # Memory-bound: the embedding moves 2*32*64*2 bytes in F and 32*64*(2 + 8) in W; the norm 2 and 3 times its
    # 4096-byte activation in F and B; the loss 32*100*(2 + 4) bytes in F and in B.
    assert (emb.t_f, emb.t_b, emb.t_w) == pytest.approx((8192 / HBM, 0, 20480 / HBM), rel=1e-12)
    assert (norm.t_f, norm.t_b, norm.t_w) == pytest.approx((8192 / HBM, 12288 / HBM, 0), rel=1e-12)
    assert (head.t_f, head.t_b, head.t_w) == pytest.approx(
        (HEAD_FLOPS / PEAK + 19200 / HBM, HEAD_FLOPS / PEAK + 19200 / HBM, HEAD_FLOPS / PEAK), rel=1e-12)
    # 16 bytes a parameter: embedding and head 100*64, a block 36864 + two norms of 64, the final norm 64.
    assert [layer.static_bytes for layer in model.layers] == [102400, 591872, 591872, 1024, 102400]
    # ZeRO-1 over 4 replicas: 2 + 2 + 12/4 = 7 bytes a parameter.
    assert tiny(zero=1, dp=4).layers[1].static_bytes == 36992 * 7
    # Between stages: 4096 bytes over NVLink (450 GB/s a direction, as NCCL drives it) plus the latency.
    assert stage_profile(model, partition(model, 2)).t_comm == pytest.approx(
        4096 / (450e9 * NCCL_NVLINK_SHARE) + P2P_LATENCY["nvlink"])


def test_kernel_times_by_hand():
    """The kernel model (the default): a block's pass is its four products by shape (fused q/k/v, o, fused
    gate/up, down), the attention core at flash attention's rate and its memory-bound bytes a token at the fused
    rate (F: two norms 2·2h·e, two residual adds 2·3h·e, rotary 2·(a + k)·d·e, SwiGLU 3·f·e: 2432; B: 2·3h·e,
    2·3h·e, 2·(a + k)·d·e, 5·f·e: 3200); the head its product (BF16) and the loss's bytes; the norm its bytes.
    Each pass a gap after each kernel it launches, and no faster than their launches (the block: four products,
    the core, two norms, two residual adds, rotary and SwiGLU in F, the core's three kernels in B, the products in
    W; the norm one kernel in F and B; the head its product in each pass and the loss's two kernels in F and B)."""
    kernels = Kernels(H100, "bf16")

    def launched(seconds: float, kernels: int) -> float:
        return max(seconds + kernels * KERNEL_GAP, kernels * KERNEL_LAUNCH)

    model = tiny()
    block, norm, head = model.layers[1], model.layers[3], model.layers[4]
    products = [kernels.matmul(mm, N, 1) for mm in (Matmul(64, 128), Matmul(64, 64, "row"), Matmul(64, 256),
                                                    Matmul(128, 64, "row"))]
    f, b, w = map(sum, zip(*products))
    core_f, core_b = kernels.attention(131072, 16, S, True)
    assert (block.t_f, block.t_b, block.t_w) == pytest.approx(
        (launched(f + core_f + kernels.memory(N * 2432), 11), launched(b + core_b + kernels.memory(N * 3200), 13),
         launched(w, 4)), rel=1e-12)
    assert (norm.t_f, norm.t_b, norm.t_w) == pytest.approx(
        (launched(kernels.memory(8192), 1), launched(kernels.memory(12288), 1), 0))
    product = kernels.matmul(Matmul(64, 100, fp8=False), N, 1)
    assert (head.t_f, head.t_b, head.t_w) == pytest.approx(
        (launched(product[0] + kernels.memory(19200), 3), launched(product[1] + kernels.memory(19200), 3),
         launched(product[2], 1)), rel=1e-12)
    assert model.setting.efficiency is None and tiny(efficiency=0.4).setting.efficiency == 0.4


def test_fp8_by_hand():
    """FP8: the block's four products in FP8 (the head stays BF16), each holding an FP8 weight and its transpose
    (2 bytes a parameter more); their inputs saved in FP8 (q/k/v's 64, gate/up's 64 and down's 128 elements a
    token one byte less each; o's input kept beside flash attention's BF16 output: one byte more), W needing
    only the FP8 copies (320 bytes a token less)."""
    fp8, bf16 = tiny(dtype="fp8"), tiny()
    block = fp8.layers[1]
    assert block.static_bytes == bf16.layers[1].static_bytes + FP8_WEIGHT_BYTES * 36864
    assert (block.mem_f, block.mem_b, block.mem_w) == (53248 - 192 * N, -4096, -(53248 - 320 * N))
    assert (block.flops_f, block.flops_b, block.flops_w) == BLOCK_FLOPS
    assert fp8.layers[4] == bf16.layers[4]
    big = {**TINY, "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
           "num_key_value_heads": 8}
    fast, slow = (estimate(big, seq_len=4096, microbatch_size=1, dtype=d).layers[1] for d in ("fp8", "bf16"))
    assert fast.t_f < 0.8 * slow.t_f and fast.t_w < 0.8 * slow.t_w


def test_tensor_parallel_by_hand():
    model = tiny(tp=2, efficiency=0.4)
    block, head = model.layers[1], model.layers[4]
    assert (block.flops_f, block.flops_b, block.flops_w) == tuple(f // 2 for f in BLOCK_FLOPS)
    assert (block.mem_f, block.out_bytes) == (53248 // 2, 4096 // 2)
    # Matmul weights and biases split, the two norms replicated: 36864 / 2 + 128 parameters.
    assert block.static_bytes == (36864 // 2 + 128) * 16
    # Each collective moves (t - 1) / t of the 4096-byte activation over NVLink: four in F and B, two in W; so
    # small a message goes at NCCL's LL protocol (half the bandwidth, the least latency), one ring step.
    collective = (NCCL_BASE_LATENCY["LL"] + NCCL_NVLINK_HOP["LL"]
                  + 4096 / 2 / (450e9 * NCCL_NVLINK_SHARE * NCCL_PROTOCOL_SHARE["LL"]))
    assert (block.t_f, block.t_b, block.t_w) == pytest.approx(
        (BLOCK_FLOPS[0] / 2 / PEAK + 4 * collective, BLOCK_FLOPS[1] / 2 / PEAK + 4 * collective,
         BLOCK_FLOPS[2] / 2 / PEAK + 2 * collective), rel=1e-12)
    assert head.flops_f == 2 * 32 * 64 * 50
    assert model.flops_per_token() == tiny().flops_per_token()


def test_parameters_and_flops_per_token():
    # 100*64 embedding + 2 blocks of 36864 + 128 + final norm 64 + head 100*64.
    assert count_parameters(TINY) == 6400 + 2 * 36992 + 64 + 6400
    tied = {**TINY, "tie_word_embeddings": True}
    assert count_parameters(tied) == 6400 + 2 * 36992 + 64
    assert estimate(tied, seq_len=S, microbatch_size=B).layers[-1].shares == "tok_embeddings"
    # 6·N + 12·L·a·d·s against F + B + W over the layers: they differ by 6 x the weights used in no matmul (the
    # embedding, 6400, and the norms, 5 x 64).
    reference = reference_flops_per_token(TINY, S)
    assert reference == 6 * 86848 + 12 * 2 * 64 * 16
    assert tiny().flops_per_token() == (2 * sum(BLOCK_FLOPS) + 3 * HEAD_FLOPS) / N == reference - 6 * (6400 + 320)


# A sliding window of 6 over 16 positions: the pairs less than 6 apart either way, 16² - 10·11 = 146 of the 256
# (twice the 81 the causal window lets through, less the diagonal of 16). Attention core F = 4·b·146·a·d =
# 4*2*146*64 = 74752 (131072 without the window), B twice that.
WINDOWED_FLOPS = (2359296 + 74752, 2359296 + 149504, 2359296)


def test_sliding_window_by_hand():
    assert attended_pairs(S, 6) == sum(abs(i - j) < 6 for i in range(S) for j in range(S)) == 146
    assert sum(0 <= i - j < 6 for i in range(S) for j in range(S)) == 81
    model = estimate(WINDOWED, seq_len=S, microbatch_size=B)
    for layer in model.layers[1:3]:
        assert (layer.flops_f, layer.flops_b, layer.flops_w) == WINDOWED_FLOPS
        assert (layer.mem_f, layer.mem_b, layer.mem_w) == (53248, 0, -53248)  # flash attention: as without window
    # 6·N + 12·a·d·(146 pairs / 16 positions) per block: the estimate is that less 6 x the no-matmul weights.
    reference = reference_flops_per_token(WINDOWED, S)
    assert reference == 6 * 86848 + 12 * 64 * 2 * 146 / 16
    assert model.flops_per_token() == (2 * sum(WINDOWED_FLOPS) + 3 * HEAD_FLOPS) / N == reference - 6 * (6400 + 320)
    # A window as long as the sequence or longer, or none, saves nothing; nor does one without flash attention,
    # whose kernel computes (and keeps) all s² scores.
    for window in (S, 2 * S, None):
        assert estimate({**WINDOWED, "sliding_window": window}, seq_len=S, microbatch_size=B).layers == tiny().layers
    assert (estimate(WINDOWED, seq_len=S, microbatch_size=B, flash_attention=False).layers
            == tiny(flash_attention=False).layers)
    # transformers' MistralConfig has a window of 4096 when the config names none.
    assert architecture({k: v for k, v in WINDOWED.items() if k != "sliding_window"}).windows == (4096, 4096)


def test_sliding_window_on_some_blocks():
    """Qwen2's window is on the blocks from max_window_layers on, or on those layer_types names, and only with
    use_sliding_window; the blocks without it keep the full attention's costs."""
    assert architecture(MIXED).windows == (None, 6)
    assert architecture({**MIXED, "layer_types": ["sliding_attention", "full_attention"]}).windows == (6, None)
    assert architecture({**MIXED, "use_sliding_window": False}).windows == (None, None)
    model = estimate(MIXED, seq_len=S, microbatch_size=B)
    assert [(layer.name, layer.block) for layer in model.layers[1:3]] == [("layers.0", True), ("layers.1", True)]
    assert [(layer.flops_f, layer.flops_b, layer.flops_w) for layer in model.layers[1:3]] == [BLOCK_FLOPS,
                                                                                                WINDOWED_FLOPS]
    assert saving_windows(architecture(MIXED), S, flash_attention=True) == [None, 6]
    assert saving_windows(architecture(MIXED), S, flash_attention=False) == [None, None]


# -- FLOPs counted by torch on the same layers --------------------------------------------------------------
def test_flop_counter_agrees():
    """A Llama block and head built in plain torch (attention as matmuls: CPU's fused attention has no FLOP
    formula), counted by FlopCounterMode: the forward is F, the backward B + W."""
    torch = pytest.importorskip("torch", reason="torch is not installed (the torch extra)")
    from torch import nn
    from torch.nn import functional
    from torch.utils.flop_counter import FlopCounterMode

    h, a, k, d, f, vocab = 64, 4, 2, 16, 128, 100

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attention_norm, self.ffn_norm = nn.RMSNorm(h), nn.RMSNorm(h)
            self.wq, self.wk, self.wv = (nn.Linear(h, n * d, bias=False) for n in (a, k, k))
            self.wo = nn.Linear(a * d, h, bias=False)
            self.w1, self.w3 = nn.Linear(h, f, bias=False), nn.Linear(h, f, bias=False)
            self.w2 = nn.Linear(f, h, bias=False)

        def forward(self, x):
            y = self.attention_norm(x)
            q = self.wq(y).view(B, S, a, d).transpose(1, 2)
            keys, values = (w(y).view(B, S, k, d).transpose(1, 2).repeat_interleave(a // k, dim=1)
                            for w in (self.wk, self.wv))
            mask = torch.full((S, S), -math.inf).triu(1)
            probs = (q @ keys.transpose(-2, -1) / math.sqrt(d) + mask).softmax(-1)
            x = x + self.wo((probs @ values).transpose(1, 2).reshape(B, S, a * d))
            y = self.ffn_norm(x)
            return x + self.w2(functional.silu(self.w1(y)) * self.w3(y))

    def counted(module, x):
        with FlopCounterMode(display=False) as forward:
            out = module(x)
        with FlopCounterMode(display=False) as backward:
            out.float().pow(2).mean().backward()
        return forward.get_total_flops(), backward.get_total_flops()

    block_f, block_bw = counted(Block(), torch.randn(B, S, h, requires_grad=True))
    assert (block_f, block_bw) == (BLOCK_FLOPS[0], BLOCK_FLOPS[1] + BLOCK_FLOPS[2])
    head_f, head_bw = counted(nn.Linear(h, vocab, bias=False), torch.randn(B, S, h, requires_grad=True))
    assert (head_f, head_bw) == (HEAD_FLOPS, 2 * HEAD_FLOPS)
    model = tiny()
    assert (model.layers[1].flops_f, model.layers[1].flops_b + model.layers[1].flops_w) == (block_f, block_bw)


# -- FLOPs and activation bytes counted on the transformers model ----------------------------------------------
@pytest.mark.parametrize("config, seq_len, batch", [
    (TINY, S, B), (WINDOWED, S, B), (MIXED, S, B), (CONFIGS / "llama3-8b.json", 8192, 1),
    (CONFIGS / "qwen2-7b.json", 4096, 2), (MISTRAL_7B, 8192, 1), (MISTRAL_7B, 4096, 1)],
    ids=["tiny", "tiny-window", "tiny-mixed", "llama3-8b", "qwen2-7b", "mistral-7b", "mistral-7b-window-of-s"])
def test_counted_agrees_with_the_formula(config, seq_len, batch):
    """Counted and closed-form figures differ by what each of them is known to leave out or add, exactly. A
    sliding window runs in flash attention's kernel too (the window as its argument, no mask), whatever its length."""
    pytest.importorskip("transformers", reason="transformers is not installed (the dev extra)")
    counted = estimate(config, seq_len=seq_len, microbatch_size=batch, method="count")
    # torch's eager loss, as transformers' model computes it and torchtitan runs it
    formula = estimate(config, seq_len=seq_len, microbatch_size=batch, runtime="torchtitan")
    arch, n = architecture(config), seq_len * batch
    h, f, a = arch.hidden, arch.ffn, arch.heads
    windows = dict(zip([f"layers.{i}" for i in range(arch.layers)], saving_windows(arch, seq_len, True)))
    assert [layer.name for layer in counted.layers] == [layer.name for layer in formula.layers]
    assert "method='count'" in counted.source
    for c, k in zip(counted.layers, formula.layers):
        # torch's counter adds flash attention's recomputation of QK^T in the backward (2·b·pairs·a·d), which the
        # closed form leaves out, and in some transformers releases (5.17) the rotary table's matmul in the
        # embedding's F (s·d); everything else is the same FLOPs.
        recompute = 2 * batch * attended_pairs(seq_len, windows[c.name]) * arch.q_width if c.block else 0
        rotary = seq_len * arch.head_dim if c.name == "tok_embeddings" and c.flops_f else 0
        assert (c.flops_f, c.flops_b, c.flops_w) == (k.flops_f + rotary, k.flops_b + recompute, k.flops_w)
        assert (c.static_bytes, c.out_bytes) == (k.static_bytes, k.out_bytes)
        assert c.mem_w == k.mem_w  # what W needs: matmul inputs and output gradients (and the embedding's)
    emb, norm, head = (counted.layers[i] for i in (0, -2, -1))
    # F keeps more than the closed form: transformers' RMSNorm keeps its input in fp32 (4h), the reciprocal root
    # (4) and the normalized input (2h) where the closed form counts the input (2h); the SiLU keeps its output
    # (2f); flash attention its log-sum-exp (4a a token) and its random seed and offset (24 bytes).
    for block, k in zip(counted.layers[1:-2], formula.layers[1:-2]):
        assert block.mem_f == k.mem_f + n * (2 * (4 * h + 4) + 2 * f + 4 * a) + 24
    assert norm.mem_f == n * (4 * h + 4 + 2 * h)
    # The loss also keeps a total (4) and its shifted labels (int64; with b = 1 a view of n + 1 padded ones).
    assert head.mem_f - formula.layers[-1].mem_f - 4 == 8 * (n + (batch == 1))
    assert emb.mem_f == formula.layers[0].mem_f  # token ids until W, and the output gradient


def test_counted_without_flash_attention():
    """Without flash attention, attention runs as torch's math kernel: its backward is four products, as in the
    closed form, and it keeps the s x s probabilities (more than the closed form: scores, weights, GQA copies)."""
    pytest.importorskip("transformers", reason="transformers is not installed (the dev extra)")
    counted = tiny(method="count", flash_attention=False).layers[1]
    formula = tiny(flash_attention=False).layers[1]
    assert (counted.flops_f, counted.flops_b, counted.flops_w) == (formula.flops_f, formula.flops_b, formula.flops_w)
    assert counted.mem_f > formula.mem_f > tiny().layers[1].mem_f


def test_counted_tensor_parallel():
    pytest.importorskip("transformers", reason="transformers is not installed (the dev extra)")
    whole, split = tiny(method="count").layers[1], tiny(method="count", tp=2).layers[1]
    assert (split.flops_f, split.flops_b, split.mem_f) == (whole.flops_f / 2, whole.flops_b / 2,
                                                           -(-whole.mem_f // 2))


def test_cli_counts(tmp_path):
    pytest.importorskip("transformers", reason="transformers is not installed (the dev extra)")
    config, output = tmp_path / "tiny.json", tmp_path / "count.yaml"
    config.write_text(json.dumps(TINY))
    result = zbsolve("estimate", config, "--seq-len", S, "-b", B, "--method", "count", "-o", output)
    assert result.exit_code == 0, result.output
    assert "method: count (" in result.stdout and "upper bound" in result.stdout
    model = Model.load(output)
    assert "--method count " in model.source
    assert model == estimate(config, seq_len=S, microbatch_size=B, method="count", source=model.source)


def test_cli_takes_the_formula_by_default(tmp_path):
    """The closed form, whether transformers is installed or not: its figures are those of fused kernels."""
    config, output = tmp_path / "tiny.json", tmp_path / "tiny.yaml"
    config.write_text(json.dumps(TINY))
    result = zbsolve("estimate", config, "--seq-len", S, "-b", B, "-o", output)
    assert result.exit_code == 0, result.output
    assert "method: formula (" in result.stdout and "an upper bound" in result.stdout
    assert "--method formula " in Model.load(output).source
    assert Model.load(output).layers == tiny().layers


def test_count_without_transformers(tmp_path, monkeypatch):
    """Where transformers is missing, count is one line of error."""
    monkeypatch.setattr(counting, "available", lambda: False)
    config = tmp_path / "tiny.json"
    config.write_text(json.dumps(TINY))
    result = zbsolve("estimate", config, "--seq-len", S, "-b", B, "--method", "count", "-o", tmp_path / "m.yaml")
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == ("error: method = 'count': transformers is not installed (pip install "
                                     "transformers), or use --method formula")
    assert not (tmp_path / "m.yaml").exists()


# -- bad input -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("config, options, message", [
    ({**TINY, "model_type": "gemma"}, {}, "config: model_type = 'gemma': should be one of llama"),
    ({**MISTRAL_7B, "num_local_experts": 8, "num_experts_per_tok": 2}, {},
     "config: num_local_experts = 8: mixture-of-experts layers are not estimated (dense decoders only)"),
    ({**TINY, "n_routed_experts": 64}, {}, "config: n_routed_experts = 64: mixture-of-experts layers are not"),
    ({**TINY, "model_type": "qwen2", "num_experts": 60}, {}, "config: num_experts = 60: mixture-of-experts"),
    ({**TINY, "moe_intermediate_size": 1408}, {}, "config: moe_intermediate_size = 1408: mixture-of-experts"),
    ({**TINY, "kv_lora_rank": 512}, {}, "config: kv_lora_rank = 512: multi-head latent attention is not estimated"),
    ({**MISTRAL_7B, "architectures": ["MixtralForCausalLM"]}, {},
     "config: architectures = ['MixtralForCausalLM']: not Mistral's classes (MistralForCausalLM, ...), yet "
     "model_type = 'mistral': a relabelled config is not estimated"),
    ({**TINY, "model_type": "qwen2", "architectures": ["Qwen2MoeForCausalLM"]}, {},
     "config: architectures = ['Qwen2MoeForCausalLM']: not Qwen2's classes"),
    ({**TINY, "architectures": "LlamaForCausalLM"}, {}, "config: architectures = 'LlamaForCausalLM': not Llama's"),
    ({**TINY, "layer_types": ["full_attention", "linear_attention"]}, {},
     "config: layer_types[1] = 'linear_attention': should be one of full_attention, sliding_attention (other kinds"),
    ({**MIXED, "layer_types": ["sliding_attention"]}, {},
     "config: layer_types = ['sliding_attention']: should have 2 entries, one a layer"),
    ({**WINDOWED, "sliding_window": 0}, {}, "config: sliding_window = 0: should be an integer >= 1"),
    ({**MIXED, "max_window_layers": -1}, {}, "config: max_window_layers = -1: should be an integer >= 0"),
    ({k: v for k, v in TINY.items() if k != "hidden_size"}, {}, "config: hidden_size is missing"),
    ({**TINY, "num_attention_heads": "4"}, {}, "config: num_attention_heads = '4': should be an integer >= 1"),
    ({**TINY, "num_key_value_heads": 3}, {}, "num_key_value_heads = 3 must divide the 4 attention heads"),
    ({**TINY, "tie_word_embeddings": "no"}, {}, "tie_word_embeddings = 'no': should be true or false"),
    (TINY, {"tp": 4}, "tp = 4: num_key_value_heads = 2 is not a multiple of it"),
    (TINY, {"gpu": "tpu"}, "gpu = 'tpu': should be one of h100, h200, a100, b200"),
    (TINY, {"dtype": "int8"}, "dtype = 'int8': should be one of bf16, fp16, fp8"),
    (TINY, {"dtype": "fp8", "gpu": "a100"}, "dtype = 'fp8': the NVIDIA A100 SXM4 80GB has no FP8 tensor cores"),
    (TINY, {"zero": 2}, "zero = 2: should be 0, 1 or 3"),
    (TINY, {"efficiency": 1.5}, "efficiency = 1.5: should be a number in (0, 1], or None for the kernel model"),
    (TINY, {"link": "pcie"}, "link = 'pcie': should be one of nvlink, network"),
    (TINY, {"method": "auto"}, "method = 'auto': should be one of formula, count"),
    (TINY, {"seq_len": 0}, "seq_len = 0 must be an integer >= 1"),
    ({"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 100, "n_positions": 8}, {},
     "seq_len = 16: the config has 8 learned positions"),
])
def test_bad_config(config, options, message):
    with pytest.raises(InputError, match=re.escape(message)) as exc:
        estimate(config, **{"seq_len": S, "microbatch_size": B, **options})
    assert "\n" not in str(exc.value)


def test_dense_configs_pass():
    """Expert keys left empty, the decoder's own classes and layer kinds are a dense decoder's."""
    dense = {**TINY, "num_experts": None, "num_local_experts": 0, "use_expert_bias": False, "moe_layers": [],
             "architectures": ["LlamaForCausalLM"], "layer_types": ["full_attention", "full_attention"]}
    assert estimate(dense, seq_len=S, microbatch_size=B).layers == tiny().layers
    gpt = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 64, "n_layer": 2, "n_head": 4,
           "vocab_size": 100, "n_positions": 16}
    assert architecture(gpt).windows == (None, None)


def test_cli_refuses_a_relabelled_config(tmp_path):
    config = tmp_path / "mixtral.json"
    config.write_text(json.dumps({**MISTRAL_7B, "num_local_experts": 8, "num_experts_per_tok": 2}))
    result = zbsolve("estimate", config, "--seq-len", 4096, "-b", 1, "-o", tmp_path / "m.yaml")
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == (f"error: {config}: num_local_experts = 8: mixture-of-experts layers are not "
                                     "estimated (dense decoders only)")
    assert not (tmp_path / "m.yaml").exists()


def test_bad_config_file_is_named(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**TINY, "vocab_size": -1}))
    with pytest.raises(InputError, match=f"^{re.escape(str(path))}: vocab_size = -1: should be an integer >= 1$"):
        estimate(path, seq_len=S, microbatch_size=B)


# -- the command line and the model files --------------------------------------------------------------------
def test_cli_writes_a_loadable_model(tmp_path):
    config, output = tmp_path / "tiny.json", tmp_path / "tiny.yaml"
    config.write_text(json.dumps(TINY))
    result = zbsolve("estimate", config, "--seq-len", S, "--microbatch-size", B, "--method", "formula", "-o", output)
    assert result.exit_code == 0, result.output
    assert "layers.0..1 (x2)" in result.stdout and "FLOPs per token" in result.stdout
    model = Model.load(output)
    assert model.source == (f"zbsolve estimate {config} --gpu h100 --seq-len 16 --microbatch-size 2 --tp 1 --dp 1 "
                            f"--zero 0 --dtype bf16 --flash-attention --link nvlink "
                            f"--method formula -o {output}")
    assert model == estimate(config, seq_len=S, microbatch_size=B, source=model.source)


@pytest.mark.parametrize("args, message", [
    (["--gpu", "tpu"], "error: gpu = 'tpu': should be one of h100, h200, a100, b200"),
    (["--tp", "3"], "error: tp = 3: num_attention_heads = 4 is not a multiple of it"),
])
def test_cli_bad_input(tmp_path, args, message):
    config = tmp_path / "tiny.json"
    config.write_text(json.dumps(TINY))
    result = zbsolve("estimate", config, "--seq-len", S, "-b", B, "-o", tmp_path / "m.yaml", *args)
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == message
    assert not (tmp_path / "m.yaml").exists()


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.stem)
def test_model_files_are_what_their_command_writes(path, tmp_path, monkeypatch):
    model = Model.load(path)
    args = shlex.split(model.source)
    assert args[:2] == ["zbsolve", "estimate"] and args[-2:] == ["-o", f"problems/models/{path.name}"]
    monkeypatch.chdir(ROOT)
    result = zbsolve(*args[1:-1], tmp_path / path.name)
    assert result.exit_code == 0, result.output
    assert Model.load(tmp_path / path.name).model_copy(update={"source": model.source}) == model


def test_tour_plans_the_model_its_estimate_writes(tmp_path, monkeypatch):
    """The command tour (docs/cli.md) estimates Llama-3-8B, then solves and plans problems/models/llama3-8b.yaml:
    one model."""
    commands = [shlex.split(line.split(" #")[0]) for line in (ROOT / "docs" / "cli.md").read_text().splitlines()
                if line.startswith("zbsolve ")]
    command = next(args[1:] for args in commands if args[1] == "estimate" and "llama3-8b" in args[2])
    planned = {args[2] for args in commands if args[1] in ("solve", "plan") and args[2].startswith("problems/models/")}
    assert planned == {"problems/models/llama3-8b.yaml"}
    monkeypatch.chdir(ROOT)
    result = zbsolve(*command[:command.index("-o")], "-o", tmp_path / "tour.yaml")
    assert result.exit_code == 0, result.output
    shipped = Model.load(ROOT / "problems" / "models" / "llama3-8b.yaml")
    assert Model.load(tmp_path / "tour.yaml").model_copy(update={"source": shipped.source}) == shipped
