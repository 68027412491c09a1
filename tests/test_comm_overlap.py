"""Communication as runtimes overlap it (docs/cost-model.md, "Tensor parallelism" and "Mixture of experts"): the
expert all-to-all's NVLink and network parts with node-limited routing, by hand and against their bounds; the
groups read from DeepSeek configs; TP communication overlap's rule and flag; the stages' link in predict."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import ROOT

from zbsolve.base.errors import InputError
from zbsolve.configure.predict import Configuration, configured_model
from zbsolve.costmodel import moe
from zbsolve.costmodel.communication import bandwidth, collectives
from zbsolve.costmodel.constants import P2P_LATENCY
from zbsolve.costmodel.estimate import estimate
from zbsolve.costmodel.gpus import GPUS, get_gpu
from zbsolve.costmodel.hf_config import architecture
from zbsolve.costmodel.kernels import Matmul
from zbsolve.costmodel.layer_costs import LayerCosts, hiding
from zbsolve.costmodel.model import Interference

MIXTRAL = {"model_type": "mixtral", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "intermediate_size": 96, "num_local_experts": 8, "num_experts_per_tok": 2,
           "vocab_size": 128, "tie_word_embeddings": False}
"""Mixtral-shaped, 8 experts, top-2, h = 64."""
V3 = {"model_type": "deepseek_v3", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
      "num_key_value_heads": 4, "q_lora_rank": 32, "kv_lora_rank": 16, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
      "v_head_dim": 16, "intermediate_size": 128, "moe_intermediate_size": 32, "n_routed_experts": 16,
      "n_shared_experts": 1, "num_experts_per_tok": 4, "first_k_dense_replace": 1, "n_group": 4, "topk_group": 2,
      "vocab_size": 128, "tie_word_embeddings": False, "scoring_func": "sigmoid", "topk_method": "noaux_tc"}
"""DeepSeek-V3-shaped: 16 experts in 4 groups, top-4 from at most 2 groups."""
LLAMA = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 100, "tie_word_embeddings": False}
H100 = GPUS["h100"]
WIDTH = 32 * 64 * 2
"""Bytes of 32 tokens of h = 64 in bf16."""


def test_groups_read_where_routing_is_node_limited():
    experts = architecture(V3).experts
    assert (experts.groups, experts.group_limit) == (4, 2)
    assert (architecture(MIXTRAL).experts.groups, architecture(MIXTRAL).experts.group_limit) == (1, 1)
    v2 = {**V3, "model_type": "deepseek_v2", "scoring_func": "softmax", "topk_method": "greedy"}
    assert architecture(v2).experts.group_limit == 1
    assert architecture({**v2, "topk_method": "group_limited_greedy"}).experts.group_limit == 2
    with pytest.raises(InputError, match="n_group = 3, topk_group = 2: n_group should divide the 16 experts"):
        architecture({**V3, "n_group": 3})


def test_all_to_all_parts_by_hand():
    """alltoall: of top-2 copies over ep = 4 at 2 a node, 1/4 stays, 1/4 over NVLink, 2/4 over the network. flex
    under node-limited routing (ep = 8 at 2 a node: 4 nodes of 4 experts, groups of 4 experts = one node, at most
    2): the token crosses the network to at most 2 nodes, each remote with share 6/8, and 1 in 2 copies is
    forwarded over NVLink."""
    mixtral, v3 = architecture(MIXTRAL), architecture(V3)
    assert moe.all_to_all_bytes(32, mixtral, 2, 4, 2) == (WIDTH * 2 / 4, WIDTH * 2 * 2 / 4)
    assert moe.reached(v3, 4) == 2
    assert moe.all_to_all_bytes(32, v3, 2, 8, 2, "flex") == (WIDTH * 4 / 2, WIDTH * 2 * 6 / 8)
    # Within one node both send the (ep - 1)/ep copies over NVLink and none over the network.
    for dispatcher in moe.DISPATCHERS:
        assert moe.all_to_all_bytes(32, v3, 2, 8, 8, dispatcher) == (WIDTH * 4 * 7 / 8, 0)


@pytest.mark.parametrize("dispatcher", moe.DISPATCHERS)
@pytest.mark.parametrize("config", [MIXTRAL, V3])
def test_network_bytes_never_exceed_every_copy_off_node(config, dispatcher):
    """Never more network bytes than every copy that leaves the device; as many where every destination is off the
    node (one device a node, the token's copies on distinct nodes), and the time never above all of them over the
    network."""
    arch = architecture(config)
    k = arch.experts.top_k
    for ep in (2, 4, 8):
        before = WIDTH * k * (ep - 1) / ep
        for per_node in (1, 2, 4, 8):
            nvlink, network = moe.all_to_all_bytes(32, arch, 2, ep, per_node, dispatcher)
            assert network <= before + 1e-9
            assert max(nvlink / H100.nvlink_bytes_per_s, network / H100.network_bytes_per_s) <= (
                before / H100.network_bytes_per_s + 1e-15)
        if dispatcher == "alltoall" or arch.experts.group_limit == 1:
            assert moe.all_to_all_bytes(32, arch, 2, ep, 1, dispatcher)[1] == pytest.approx(
                WIDTH * min(k, ep) * (ep - 1) / ep if dispatcher == "flex" else before)


def test_the_estimate_sends_both_parts_at_once():
    two_a_node = dataclasses.replace(H100, gpus_per_node=2)
    nvlink, network = moe.all_to_all_bytes(32, architecture(V3), 2, 8, 2, "flex")
    block = estimate(V3, gpu=two_a_node, seq_len=16, microbatch_size=2, ep=8, dispatcher="flex").layers[2]
    once = (max(nvlink / bandwidth(two_a_node, "nvlink"), network / two_a_node.network_bytes_per_s)
            + P2P_LATENCY["network"])
    assert block.comm_f == pytest.approx(2 * once, rel=1e-12)
    every = estimate(V3, gpu=two_a_node, seq_len=16, microbatch_size=2, ep=8, dispatcher="flex", a2a_link="network")
    assert every.layers[2].comm_f == pytest.approx(2 * ((nvlink + network) / 50e9 + P2P_LATENCY["network"]), rel=1e-12)
    with pytest.raises(InputError, match="dispatcher = 'deepep': should be one of alltoall, flex"):
        estimate(V3, seq_len=16, microbatch_size=2, ep=8, dispatcher="deepep")


def test_a_collective_hides_behind_its_product_up_to_its_time():
    """Three collectives of 0.5 s; under overlap the first two hide behind 1.0 and 0.1 s, the third behind none."""
    costs = LayerCosts(flops=(0, 0, 0), traffic=(0, 0, 0), collectives=(3, 0, 0), m_b=0, m_w=0, params=0,
                       out_bytes=0, hiding=((1.0, 0.1), (), ()))
    assert collectives(costs, 0, 0.5, overlap=False) == 1.5
    assert collectives(costs, 0, 0.5, overlap=True) == pytest.approx(0.0 + 0.4 + 0.5)


def test_collectives_pair_with_the_tensor_parallel_products():
    """F and B pair with column- and row-parallel products in order, W with column-parallel ones; each hides behind
    (tp - 1)/tp of its product (one chunk of tp runs without a transfer)."""
    mms = (Matmul(8, 8), Matmul(8, 8, "whole"), Matmul(8, 8, "row"), Matmul(8, 8))
    times = [(1.0, 2.0, 3.0), (9.0, 9.0, 9.0), (4.0, 5.0, 6.0), (7.0, 8.0, 10.0)]
    assert hiding(mms, times, (2, 3, 2), 4) == ((0.75, 3.0), (1.5, 3.75, 6.0), (2.25, 7.5))
    assert hiding(mms, times, (0, 5, 0), 2)[1] == (1.0, 2.5, 4.0)


def test_the_flag_hides_tensor_parallel_collectives_only():
    """Where a collective and its product do not slow each other, the flag never adds time."""
    calm = dataclasses.replace(get_gpu("h100"), compute_interference=0.0, collective_interference=0.0)
    plain = estimate(LLAMA, gpu=calm, seq_len=256, microbatch_size=2, tp=2)
    hidden = estimate(LLAMA, gpu=calm, seq_len=256, microbatch_size=2, tp=2, tp_comm_overlap=True)
    for a, b in zip(plain.layers, hidden.layers):
        assert (b.t_f, b.t_b, b.t_w) <= (a.t_f, a.t_b, a.t_w)
    block, overlapped = plain.layers[1], hidden.layers[1]
    assert overlapped.t_f < block.t_f and overlapped.t_w < block.t_w
    # The embedding has no product beside its collectives: nothing hides.
    assert (hidden.layers[0].t_f, hidden.layers[0].t_w) == (plain.layers[0].t_f, plain.layers[0].t_w)
    one = estimate(LLAMA, seq_len=256, microbatch_size=2)
    assert one.layers == estimate(LLAMA, seq_len=256, microbatch_size=2, tp_comm_overlap=True).layers


def test_overlap_is_not_free():
    """A collective beside its product runs slower and slows it: the flag saves less than where they do not
    interfere, and a product much shorter than its collective ends later overlapped than one after the other."""
    costs = LayerCosts(flops=(0, 0, 0), traffic=(0, 0, 0), collectives=(2, 0, 0), m_b=0, m_w=0, params=0,
                       out_bytes=0, hiding=((1.0, 0.1), (), ()))
    felt = Interference(compute=0.2, collective=0.3)
    assert collectives(costs, 0, 0.5, True, felt) == pytest.approx((1.0 + 0.2 * 0.65 - 1.0) + (0.65 - 0.1))
    assert collectives(costs, 0, 0.5, True, felt) > collectives(costs, 0, 0.5, True)
    assert felt.overlapped(0.1, 0.5) > 0.1 + 0.5 - 0.1 and felt.overlapped(2.0, 0.0) == 2.0
    calm = dataclasses.replace(get_gpu("h100"), compute_interference=0.0, collective_interference=0.0)
    big = dict(config=LLAMA | {"hidden_size": 4096, "num_attention_heads": 32, "intermediate_size": 14336,
                                   "num_key_value_heads": 8},
               seq_len=4096, microbatch_size=1, tp=4)
    saved = [estimate(**big, gpu=gpu).layers[1].t_f - estimate(**big, gpu=gpu, tp_comm_overlap=True).layers[1].t_f
             for gpu in (calm, get_gpu("h100"))]
    assert saved[0] > saved[1] > 0


@pytest.mark.parametrize("gpus, pp, link", [(8, 2, "nvlink"), (16, 2, "network"), (16, 1, "nvlink")])
def test_stages_on_different_nodes_take_the_network(gpus, pp, link):
    c = Configuration(config=ROOT / "problems/models/configs/llama3-8b.json", gpu="h100", dtype="bf16", seq_len=1024,
                      microbatch_size=1, global_batch=gpus, gpus=gpus, tp=1, pp=pp)
    model = configured_model(c, gpus // pp)
    assert (model.link.name, model.link.bytes_per_s) == (link, bandwidth(H100, link))


def test_predict_passes_the_flag_to_the_estimate():
    c = Configuration(config=ROOT / "problems/models/configs/llama3-8b.json", gpu="h100", dtype="bf16", seq_len=1024,
                      microbatch_size=1, global_batch=8, gpus=8, tp=2, pp=2)
    plain, hidden = configured_model(c, 2), configured_model(c.replace(tp_comm_overlap=True), 2)
    assert hidden.layers[1].t_f < plain.layers[1].t_f
