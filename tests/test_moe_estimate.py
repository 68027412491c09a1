"""The cost model of mixture-of-experts decoders (docs/cost-model.md, "Mixture of experts"): figures written out by
hand for small Mixtral- and DeepSeek-V3-shaped configs, the closed form against torch's FLOP counter and saved
tensors on transformers' own modules (on CPU with random weights: routing needs values), expert parallelism's
static bytes and all-to-alls, the refusals, ``zbsolve estimate --ep`` and the shipped configs."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
from conftest import DEEPSEEK, LLAMA, MIXTRAL, QWEN2_MOE, ROOT
from typer.testing import CliRunner

from zbsolve.app.cli import app
from zbsolve.base.errors import InputError
from zbsolve.costmodel import counting
from zbsolve.costmodel.constants import NCCL_NVLINK_SHARE, P2P_LATENCY
from zbsolve.costmodel.estimate import count_parameters, estimate, reference_flops_per_token
from zbsolve.costmodel.gpus import GPUS
from zbsolve.costmodel.hf_config import architecture
from zbsolve.costmodel.model import Layer, Model

S, B = 16, 2
N = S * B
"""Sequence length, microbatch size and tokens of a microbatch (32)."""
H100 = GPUS["h100"]
PEAK = H100.flops * 0.4
"""The H100's BF16 peak at an explicit efficiency of 0.4: FLOPs over it, the model before the kernel model."""
CONFIGS = ROOT / "problems" / "models" / "configs"
RUNNER = CliRunner()


def small(config: dict, **options) -> Model:
    return estimate(config, seq_len=S, microbatch_size=B, **options)


def zbsolve(*args: object):
    return RUNNER.invoke(app, [str(a) for a in args], env={"COLUMNS": "100000"})


# -- by hand -------------------------------------------------------------------------------------------------
# Mixtral block, per token: attention 64*(64 + 2*32) + 64*64 = 12288 weights, router 64*4 = 256, two experts of
# 3*64*96 = 18432: 49408 weights, 2*32*49408 = 3162112 FLOPs in each pass; attention core 4*N*s*a*d = 131072 in
# F, twice that in B.
MIXTRAL_FLOPS = (3162112 + 131072, 3162112 + 262144, 3162112)


def test_mixtral_by_hand():
    model = small(MIXTRAL, efficiency=0.4, runtime="torchtitan")
    assert [layer.name for layer in model.layers] == ["tok_embeddings", "layers.0", "layers.1", "norm", "output"]
    block = model.layers[1]
    assert (block.flops_f, block.flops_b, block.flops_w) == MIXTRAL_FLOPS
    # Kept a token (bytes): norm and MLP inputs 2*64*2; attention as a dense block's, (2*64 + 2*64 + 2*32)*2; two
    # dispatched copies and two expert outputs 4*64*2 (torchtitan weighs the outputs before the combine), each
    # expert's gate, up and down input 2*3*96*2; the router's fp32 probabilities and top-2 weights (4 + 2)*4.
    m_b = 2 * 64 * 2 + (2 * 64 + 2 * 64 + 2 * 32) * 2 + 4 * 64 * 2 + 2 * 3 * 96 * 2 + 6 * 4
    # W: attention as dense, (64 + 128 + 64 + 64)*2; router input and output gradient (64 + 4)*2; each expert's
    # inputs and output gradients 2*(2*64 + 3*96)*2.
    m_w = (64 + 128 + 64 + 64) * 2 + (64 + 4) * 2 + 2 * (2 * 64 + 3 * 96) * 2
    assert (block.mem_f, block.mem_b, block.mem_w) == (N * m_b, N * (m_w - m_b), -N * m_w)
    # Megatron weighs the copies inside the experts' SwiGLU: its combine keeps no expert outputs (2*64*2 less), and
    # what W needs is then the larger.
    megatron = small(MIXTRAL, efficiency=0.4).layers[1]
    assert m_w > m_b - 2 * 64 * 2
    assert (megatron.mem_f, megatron.mem_b, megatron.mem_w) == (N * m_w, 0, -N * m_w)
    # Selective recomputation: the two norms (read and write h) and both experts' SwiGLU (read 2 f_e, write one).
    assert block.mem_sel == N * (2 * 64 + 2 * 96) * 2
    assert block.t_sel == pytest.approx(N * (4 * 64 + 3 * 2 * 96) * 2 / (H100.hbm_bytes_per_s * 0.4), rel=1e-12)
    # 16 bytes a parameter: attention 12288, router 256, two norms 128, four experts 4*18432.
    assert block.static_bytes == 16 * (12288 + 256 + 128 + 4 * 18432)
    assert (block.comm_f, block.comm_b) == (0.0, 0.0)  # ep = 1: no all-to-all
    assert block.t_f == pytest.approx(MIXTRAL_FLOPS[0] / PEAK, rel=1e-12)
    assert count_parameters(MIXTRAL) == 2 * 128 * 64 + 2 * (12288 + 256 + 128 + 4 * 18432) + 64
    assert count_parameters(MIXTRAL, active=True) == count_parameters(MIXTRAL) - 2 * 2 * 18432
    assert architecture({**MIXTRAL, "sliding_window": 6}).windows == (6, 6)  # as Mistral's, where set


# DeepSeek, per token: latent attention's down-projections 64*(32 + 16 + 8) = 3584, up-projections 32*4*24 +
# 16*4*(16 + 16) = 5120, o 4*16*64 = 4096: 12800 weights; its core 2*a*(24 + 16) = 320 FLOPs a pair. Block 0's
# MLP 3*64*128 = 24576; block 1's router 64*8 = 512, two experts and a shared one 3*3*64*32 = 18432.
DS_CORE = 320 * B * S * S


def test_deepseek_by_hand():
    model = small(DEEPSEEK)
    assert [(layer.name, layer.block) for layer in model.layers] == [
        ("tok_embeddings", False), ("layers.0", True), ("layers.1", True), ("mtp.0", False), ("norm", False),
        ("output", False)]
    dense, moe_block, mtp, head = model.layers[1], model.layers[2], model.layers[3], model.layers[5]
    assert (dense.flops_f, dense.flops_b, dense.flops_w) == (2 * N * (12800 + 24576) + DS_CORE,
                                                             2 * N * (12800 + 24576) + 2 * DS_CORE,
                                                             2 * N * (12800 + 24576))
    assert moe_block.flops_w == 2 * N * (12800 + 512 + 18432)
    assert dense.comm_f is None and moe_block.comm_f == 0.0  # a dense block has no all-to-all
    # Kept a token by latent attention: norm and down-projection inputs 2*64, each latent before and after its norm
    # 2*(32 + 16), Q and K 2*4*24, V and o's input 2*4*16 (x 2 bytes).
    attention = (2 * 64 + 2 * (32 + 16) + 2 * 4 * 24 + 2 * 4 * 16) * 2
    assert dense.mem_f == N * (attention + (2 * 64 + 3 * 128) * 2)
    # Weights: attention's 12800 and its norms 64 + 32 + 16 (the latents'), the MLP's 24576 and its norm.
    assert dense.static_bytes == 16 * (12800 + 112 + 24576 + 64)
    # The multi-token prediction layer: the next tokens' embedding (a copy of its weights), the 2h -> h
    # projection of the two normed inputs, a block with experts, its norm and the loss through the head, whose
    # weights are output's.
    head_flops = 2 * N * 64 * 128
    assert mtp.flops_w == 2 * N * 2 * 64 * 64 + moe_block.flops_w + head_flops
    assert mtp.flops_f == 2 * N * 2 * 64 * 64 + moe_block.flops_f + head_flops
    assert mtp.static_bytes == 16 * (128 * 64 + 2 * 64 * 64 + 2 * 64 + 64) + moe_block.static_bytes
    assert head.static_bytes == 16 * 128 * 64
    assert mtp.comm_f == moe_block.comm_f and mtp.out_bytes == moe_block.out_bytes == N * 64 * 2
    # 6·N over the active parameters, the multi-token prediction layer's use of the head and its attention pairs.
    reference = reference_flops_per_token(DEEPSEEK, S)
    assert reference == 6 * (count_parameters(DEEPSEEK, active=True) + 128 * 64) + 3 * 320 * 3 * S


# -- counted by torch on transformers' modules -----------------------------------------------------------------
@pytest.mark.parametrize("config", [MIXTRAL, DEEPSEEK, QWEN2_MOE], ids=["mixtral", "deepseek-v3", "qwen2-moe"])
def test_counted_agrees_with_the_formula(config):
    """transformers' blocks on CPU with random weights, eager attention (two matmuls over all s² pairs, the
    closed form without flash attention) and eager experts (each token through its top-k experts' matmuls), counted
    as the counting path counts: the FLOPs of F, B and W are the closed form's exactly, whatever the routing. M_W
    is the closed form's exactly too, but for DeepSeek's router, which runs in fp32 and so keeps an fp32 copy of
    its input (4h) and an fp32 gradient of its logits (4E where the closed form counts 2E). M_B is an upper bound:
    run as written, transformers' modules keep more than fused kernels (the RMSNorms' fp32 copies, the SiLU's
    output, eager attention's fp32 softmax and the K and V repeated over the heads, the router's logits), within
    twice the closed form's figure here."""
    torch = pytest.importorskip("torch", reason="torch is not installed (the torch extra)")
    transformers = pytest.importorskip("transformers", reason="transformers is not installed (the dev extra)")
    settings = {key: value for key, value in config.items() if key != "model_type"}
    hf_config = transformers.AutoConfig.for_model(config["model_type"], **settings)
    torch.manual_seed(0)
    built = transformers.AutoModelForCausalLM.from_config(hf_config, attn_implementation="eager",
                                                          experts_implementation="eager", dtype=torch.bfloat16)
    built.train()
    counted = counting.count_layers(built, torch.randint(0, hf_config.vocab_size, (B, S)))
    model, arch = small(config, flash_attention=False), architecture(config)
    blocks = model.layers[1:1 + arch.layers]
    assert len(counted) == len(blocks)
    for i, (c, k) in enumerate(zip(counted, blocks)):
        assert c.flops == (k.flops_f, k.flops_b, k.flops_w)
        fp32_router = arch.latent is not None and arch.experts.layers[i]
        assert c.m_w == -k.mem_w + fp32_router * N * (4 * arch.hidden + 2 * arch.experts.routed)
        assert k.mem_f <= c.m_b <= 2 * k.mem_f


# -- expert parallelism: static bytes and the all-to-all ------------------------------------------------------
def test_static_bytes_sharded_by_ep():
    """Each device holds E/ep whole experts (not split by tp); under ZeRO-1 their optimizer states are sharded over
    their tp·dp/ep replicas, the other weights' over dp."""
    others, expert = 12288 + 256 + 128, 3 * 64 * 96
    assert small(MIXTRAL, ep=2).layers[1].static_bytes == 16 * (others + 2 * expert)
    assert small(MIXTRAL, ep=4).layers[1].static_bytes == 16 * (others + expert)
    # tp = 2 splits attention (12288), not the router, the norms or the experts.
    assert small(MIXTRAL, tp=2, ep=2).layers[1].static_bytes == 16 * (12288 // 2 + 256 + 128 + 2 * expert)
    # ZeRO-1 over dp = 4: 2 + 2 + 12/4 bytes a parameter for the others, 2 + 2 + 12/(1*4/2) for the experts.
    assert small(MIXTRAL, ep=2, dp=4, zero=1).layers[1].static_bytes == others * 7 + 2 * expert * 10
    # The embedding and the head are as in a dense model.
    model = small(MIXTRAL, ep=4)
    assert (model.layers[0].static_bytes, model.layers[-1].static_bytes) == (16 * 128 * 64, 16 * 128 * 64)


def test_all_to_all_by_hand():
    """Two all-to-alls (dispatch, combine) in F and two in B of a block with experts, none in W: each sends the
    device's tokens' top-k copies of h, less the (1/ep) that stay, over NVLink while ep fits a node; across nodes
    the copies within the node over NVLink and the others over the network at once; or every byte over the link
    named; t_f and t_b include them."""
    sent = N * 2 * 64 * 2 * 3 // 4  # 32 tokens, top-2, h = 64, bf16; ep = 4 keeps a quarter
    fast = 450e9 * NCCL_NVLINK_SHARE  # NVLink as NCCL drives it
    nvlink, network = sent / fast + P2P_LATENCY["nvlink"], sent / 50e9 + P2P_LATENCY["network"]
    block = small(MIXTRAL, ep=4, efficiency=0.4).layers[1]
    assert (block.comm_f, block.comm_b) == pytest.approx((2 * nvlink, 2 * nvlink), rel=1e-12)
    assert (block.t_f, block.t_b, block.t_w) == pytest.approx(
        (MIXTRAL_FLOPS[0] / PEAK + 2 * nvlink, MIXTRAL_FLOPS[1] / PEAK + 2 * nvlink, MIXTRAL_FLOPS[2] / PEAK),
        rel=1e-12)
    two_a_node = dataclasses.replace(H100, gpus_per_node=2)
    # Two a node: of 4 devices' copies a quarter stays, a quarter goes over NVLink and a half over the network.
    off_node = sent * 2 // 3 / 50e9 + P2P_LATENCY["network"]
    assert small(MIXTRAL, ep=4, gpu=two_a_node).layers[1].comm_f == pytest.approx(2 * off_node, rel=1e-12)
    assert small(MIXTRAL, ep=4, a2a_link="network").layers[1].comm_f == pytest.approx(2 * network, rel=1e-12)
    assert (small(MIXTRAL, ep=4, gpu=two_a_node, a2a_link="nvlink").layers[1].comm_f
            == pytest.approx(2 * nvlink, rel=1e-12))
    # Under tp = 2 a device dispatches its half of the tokens (sequence parallelism).
    assert small(MIXTRAL, ep=4, tp=2).layers[1].comm_f == pytest.approx(2 * (sent / 2 / fast + P2P_LATENCY["nvlink"]))


def test_layer_comm_is_part_of_its_time():
    fields = dict(name="x", t_f=1.0, t_b=1.0, t_w=1.0, mem_f=1, mem_b=0, mem_w=-1, static_bytes=0, out_bytes=0)
    assert Layer(**fields, comm_f=1.0, comm_b=0.5).comm_f == 1.0
    with pytest.raises(InputError, match=re.escape("comm_f = 2.0 must be at most t_f = 1.0")):
        Layer(**fields, comm_f=2.0)
    with pytest.raises(InputError, match=re.escape("comm_b = 1.5 must be at most t_b = 1.0")):
        Layer(**fields, comm_b=1.5)
    assert all(layer.comm_f is None for layer in small(LLAMA).layers)


# -- refusals ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("config, options, message", [
    ({**MIXTRAL, "model_type": "gemma"}, {}, "config: model_type = 'gemma': should be one of llama"),
    ({**DEEPSEEK, "moe_layer_freq": 2}, {}, "config: moe_layer_freq = 2: only 1 is estimated"),
    ({**DEEPSEEK, "scoring_func": "softmax"}, {}, "config: scoring_func = 'softmax': transformers' deepseek_v3 "
                                                  "routes by sigmoid"),
    ({**DEEPSEEK, "topk_method": "group_limited_greedy"}, {}, "config: topk_method = 'group_limited_greedy'"),
    ({**MIXTRAL, "moe_shared_expert_intermediate_size": 64}, {},
     "config: moe_shared_expert_intermediate_size = 64: not read by the estimate of mixtral"),
    ({**MIXTRAL, "num_experts_per_tok": 5}, {}, "config: num_experts_per_tok = 5: should be at most "
                                                "num_local_experts = 4"),
    ({**QWEN2_MOE, "use_sliding_window": True}, {}, "config: use_sliding_window = True: not estimated for qwen2_moe"),
    ({**{k: v for k, v in QWEN2_MOE.items() if k != "shared_expert_intermediate_size"}, "model_type": "qwen3_moe",
      "attention_bias": True}, {}, "config: attention_bias = True: not estimated for qwen3_moe"),
    ({**QWEN2_MOE, "model_type": "qwen3_moe"}, {},
     "config: shared_expert_intermediate_size = 48: not read by the estimate of qwen3_moe"),
    ({**MIXTRAL, "kv_lora_rank": 16}, {}, "config: kv_lora_rank = 16: multi-head latent attention is not estimated"),
    (MIXTRAL, {"ep": 3}, "ep = 3: should divide num_local_experts = 4"),
    (DEEPSEEK, {"ep": 16}, "ep = 16: should divide n_routed_experts = 8"),
    (LLAMA, {"ep": 2}, "ep = 2: model_type 'llama' has no experts"),
    (LLAMA, {"a2a_link": "nvlink"}, "a2a_link = 'nvlink': model_type 'llama' has no experts"),
    (MIXTRAL, {"a2a_link": "pcie"}, "a2a_link = 'pcie': should be one of nvlink, network"),
    (MIXTRAL, {"ep": 2, "zero": 1}, "ep = 2: should divide tp·dp = 1 under zero = 1"),
    (MIXTRAL, {"ep": 0}, "ep = 0 must be an integer >= 1"),
    (MIXTRAL, {"method": "count"}, "method = 'count': mixtral's experts route tokens by their values"),
    (DEEPSEEK, {"tp": 8}, "tp = 8: num_attention_heads = 4 is not a multiple of it"),
    ({**QWEN2_MOE, "shared_expert_intermediate_size": 33}, {"tp": 2},
     "tp = 2: the shared experts' inner size = 33 is not a multiple of it"),
])
def test_refusals(config, options, message):
    with pytest.raises(InputError, match=re.escape(message)) as exc:
        small(config, **options)
    assert "\n" not in str(exc.value)


def test_routed_experts_are_not_split_by_tp():
    """Mixtral's intermediate_size is its experts' (whole on every device): tp need not divide it."""
    assert small({**MIXTRAL, "intermediate_size": 97}, tp=2).layers[1].flops_w == 2 * N * (49408 + 2 * 3 * 64) // 2


# -- the command line and the shipped configs ------------------------------------------------------------------
def test_cli_ep(tmp_path):
    config, output = tmp_path / "mixtral.json", tmp_path / "mixtral.yaml"
    config.write_text(json.dumps(MIXTRAL))
    result = zbsolve("estimate", config, "--seq-len", S, "-b", B, "--ep", 4, "-o", output)
    assert result.exit_code == 0, result.output
    assert "ep 4" in result.stdout and "all-to-all of a block with experts" in result.stdout
    model = Model.load(output)
    assert " --link nvlink --ep 4 --method formula " in model.source
    assert model == estimate(config, seq_len=S, microbatch_size=B, ep=4, source=model.source)
    result = zbsolve("estimate", config, "--seq-len", S, "-b", B, "--ep", 4, "--a2a-link", "network", "-o", output)
    assert result.exit_code == 0, result.output
    model = Model.load(output)
    assert " --ep 4 --a2a-link network --method formula " in model.source
    assert model == estimate(config, seq_len=S, microbatch_size=B, ep=4, a2a_link="network", source=model.source)


def test_cli_refuses_ep_without_experts(tmp_path):
    config = tmp_path / "llama.json"
    config.write_text(json.dumps(LLAMA))
    result = zbsolve("estimate", config, "--seq-len", S, "-b", B, "--ep", 2, "-o", tmp_path / "m.yaml")
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == ("error: ep = 2: model_type 'llama' has no experts (expert parallelism needs a "
                                     "mixture-of-experts model)")
    assert not (tmp_path / "m.yaml").exists()


def test_shipped_configs():
    """DeepSeek-V3: 671.0e9 parameters and 37.6e9 active in the main model, one multi-token prediction layer of
    11.6e9 more (DeepSeek's 14e9 also count its copies of the embedding and the head); Qwen3-30B-A3B: 30.5e9 and
    3.35e9 active, as published."""
    deepseek, qwen = CONFIGS / "deepseek-v3.json", CONFIGS / "qwen3-30b-a3b.json"
    main = {**json.loads(deepseek.read_text()), "num_nextn_predict_layers": 0}
    assert (count_parameters(main), count_parameters(main, active=True)) == (671026404352, 37552282624)
    assert count_parameters(deepseek) == 682636472320
    assert (count_parameters(qwen), count_parameters(qwen, active=True)) == (30532122624, 3353032704)
    model = estimate(deepseek, seq_len=4096, microbatch_size=1, tp=2, ep=64)
    assert [layer.name for layer in model.layers[-3:]] == ["mtp.0", "norm", "output"]
    assert sum(layer.comm_f is not None for layer in model.layers) == 58 + 1  # blocks 3..60 and mtp.0
    assert model.flops_per_token() == pytest.approx(reference_flops_per_token(deepseek, 4096), rel=0.03)


def test_kernel_launches_of_a_block_with_experts():
    """Mixtral's block (4 experts, top 2) on ep 2: two local experts, so the alltoall dispatcher sorts the received
    copies by expert and back (two kernels more in F and B than the flex dispatcher) and moves 4·K·h·e bytes more
    a token; each local expert launches its own products."""
    from zbsolve.costmodel import moe
    from zbsolve.costmodel.kernels import Matmul, product_launches
    arch = architecture(MIXTRAL)
    assert moe.sorts("alltoall", 2) and not moe.sorts("alltoall", 1) and not moe.sorts("flex", 2)
    plain, sorted_ = moe.routed(arch, 2), moe.routed(arch, 2, sort=True)
    assert sorted_.launches == (5, 5, 0) and plain.launches == (3, 3, 0)
    assert [s - p for s, p in zip(sorted_.elementwise, plain.elementwise)] == [4 * 2 * 64 * 2] * 2 + [0]
    experts = (Matmul(64, 192, "expert", copies=2), Matmul(96, 64, "expert", copies=2))
    assert product_launches(experts, 2, fp8=False) == (4, 4, 4)
    assert product_launches(experts, 2, fp8=True) == (6, 6, 4)
    launches = [small(MIXTRAL, ep=2, dispatcher=d).layers[1] for d in ("alltoall", "flex")]
    assert launches[0].t_f > launches[1].t_f


def test_a_pass_of_many_small_kernels_runs_at_their_launch_rate():
    """A tiny block is host-bound: each pass takes its kernels' launches (KERNEL_LAUNCH each), not their time."""
    from zbsolve.costmodel.constants import KERNEL_LAUNCH
    block = small(MIXTRAL).layers[1]
    # F: attention's norm, residual add, rotary, core and q/k/v and o products (6); the MLP's norm, residual add,
    # router product and its two kernels, the permutation, its reverse, the sort by local expert and its reverse
    # (the alltoall dispatcher sorts wherever a device holds several experts) and the activation, the experts' two
    # products (4 local experts under ep 1, each its own): 6 + 10 + 8.
    assert block.t_f == pytest.approx(24 * KERNEL_LAUNCH)
