"""FSDP (zero 3) and context parallelism in the estimate: static bytes and gathered parameters by hand, the
per-layer transfers FSDP leaves exposed, a sequence split over cp devices (compute and activations halved, the
ring's key/value exchange not), the estimate's ``Layer.params`` and ``Model.step``, and refusals in one line."""

from __future__ import annotations

import pytest

from zbsolve.base.errors import InputError
from zbsolve.core.placement import sequential
from zbsolve.costmodel import context, nccl
from zbsolve.costmodel.constants import COLLECTIVE_INTERFERENCE, COMPUTE_INTERFERENCE, NCCL_NVLINK_SHARE, P2P_LATENCY
from zbsolve.costmodel.estimate import count_parameters, estimate
from zbsolve.costmodel.gpus import GPUS
from zbsolve.costmodel.hf_config import architecture, attended_pairs
from zbsolve.costmodel.kernels import Kernels
from zbsolve.problem.costs import device_static_bytes
from zbsolve.problem.partition import FSDP_LIVE_LAYERS, held_static_bytes

TINY = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 100, "tie_word_embeddings": False}
"""h = 64, L = 2, a = 4, k = 2 (d = 16), f = 128, V = 100: a block holds 36864 matmul weights and two norms of 64."""
BLOCK = 36992
S, B = 16, 2
NETWORK = 400e9 / 8


def tiny(**options):
    return estimate(TINY, seq_len=S, microbatch_size=B, **options)


def test_fsdp_shards_weights_gradients_and_optimizer_states_and_gathers_a_layer_at_a_time():
    model = tiny(dp=4, zero=3)
    block = model.layers[1]
    assert block.params == BLOCK
    assert block.static_bytes == BLOCK * 16 // 4  # (2 + 2 + 12) bytes a parameter over 4 replicas
    assert block.gathered_bytes == BLOCK * (2 + 2)  # its bf16 weights, and the gradient before the reduce-scatter
    assert tiny(dp=2, cp=2, zero=3).layers[1].static_bytes == block.static_bytes  # cp ranks shard it too
    assert tiny(dp=4, zero=1).layers[1].gathered_bytes is None
    # a device holds the two largest gathered layers beside its shards: two blocks, here
    static = [layer.static_bytes for layer in model.layers]
    assert FSDP_LIVE_LAYERS == 2 and held_static_bytes(model.layers) == sum(static) + 2 * BLOCK * 4


def test_fsdp_under_pipeline_parallelism_holds_every_layer_of_its_stages_gathered():
    """A pipelined device keeps its stages' parameters gathered and their gradients unsharded over the step
    (torchtitan's reshard policy under PP, torch pipelining's gradient sync at the last microbatch)."""
    model = tiny(dp=4, zero=3)
    static = [layer.static_bytes for layer in model.layers]
    gathered = [layer.gathered_bytes or 0 for layer in model.layers]
    assert held_static_bytes(model.layers, pipelined=True) == sum(static) + sum(gathered)
    halves = [(0, len(model.layers) // 2), (len(model.layers) // 2, len(model.layers))]
    two = device_static_bytes(model.layers, halves, sequential(2))
    assert two == tuple(sum(static[a:b]) + sum(gathered[a:b]) for a, b in halves)


def test_fsdp_adds_only_what_of_a_layer_s_transfers_outlasts_its_pass():
    """16 replicas of one GPU each span two nodes: a block's 2-byte parameters cross the network (NCCL's ring over
    8 ranks a node), an all-gather before F and before B, a reduce-scatter after W; overlapped with the pass, the
    longer of the two counts, the transfer COLLECTIVE_INTERFERENCE slower beside the pass and the pass losing
    COMPUTE_INTERFERENCE a second of their overlap."""
    sharded, fsdp = tiny(dp=16, zero=1), tiny(dp=16, zero=3)
    move = nccl.ring(BLOCK * 2, 16, min(8 * NETWORK, 450e9 * NCCL_NVLINK_SHARE), 8) * (1 + COLLECTIVE_INTERFERENCE)

    def beside(t: float) -> float:
        return max(t + COMPUTE_INTERFERENCE * min(t, move), move)

    for a, b in zip(sharded.layers, fsdp.layers):
        if a.block:
            assert (b.t_f, b.t_b, b.t_w) == pytest.approx((beside(a.t_f), beside(a.t_b), beside(a.t_w)))
        assert (b.t_f, b.t_b, b.t_w) >= (a.t_f, a.t_b, a.t_w)
    assert fsdp.layers[1].t_f > sharded.layers[1].t_f  # a tiny block's compute hides none of it


def test_context_parallelism_halves_a_block_s_compute_and_activations_but_not_the_ring_s_exchange():
    whole, split = tiny(efficiency=0.4), tiny(efficiency=0.4, cp=2)
    a, b = whole.layers[1], split.layers[1]
    assert (b.flops_f, b.flops_b, b.flops_w) == (a.flops_f / 2, a.flops_b / 2, a.flops_w / 2)
    assert (b.mem_f, b.mem_b, b.mem_w) == (a.mem_f / 2, a.mem_b / 2, a.mem_w / 2)
    assert split.flops_per_token() == pytest.approx(whole.flops_per_token())
    # one step of the ring passes the device's 16 tokens' K and V (2 x 32 x 2 bytes each) over NVLink, beside
    # half of the device's attention core (F: 4 x 64 FLOPs a pair, half of the microbatch's pairs, at sequence 8)
    exchange = 16 * 2 * 32 * 2 / (450e9 * NCCL_NVLINK_SHARE) + P2P_LATENCY["nvlink"]
    attention = Kernels(GPUS["h100"], "bf16").attention(4 * 64 * B * attended_pairs(S, None) // 2, 16, S // 2, True)
    exposed = (max(0.0, exchange - attention[0] / 2), max(0.0, 2 * exchange - attention[1] / 2))
    assert b.t_f == pytest.approx(a.t_f / 2 + exposed[0]) and b.t_b == pytest.approx(a.t_b / 2 + exposed[1])
    assert b.t_w == pytest.approx(a.t_w / 2) and exposed[0] > 0
    assert split.setting.cp == 2 and whole.setting.cp is None


def test_the_ring_hides_an_exchange_shorter_than_its_step():
    assert context.exposed((4.0, 8.0), 1.0, 4) == (0.0, 0.0)
    assert context.exposed((4.0, 8.0), 1.5, 4) == (3 * 0.5, 3 * 1.0)
    assert context.exposed((4.0, 8.0), 9.0, 1) == (0.0, 0.0)
    assert context.kv_bytes(architecture(TINY), 2) == 2 * 32 * 2


def test_the_estimate_records_each_layer_s_parameters_and_how_the_step_ends():
    model = tiny()
    assert sum(layer.params for layer in model.layers) == count_parameters(TINY)
    assert model.step is None and tiny(step=True).step.dp == 1
    step = tiny(dp=2, cp=2, zero=1, overlap_grad_reduce=True).step
    assert (step.dp, step.zero, step.overlap_grad_reduce, step.overlap_param_gather) == (4, 1, True, False)
    assert step.bucket_params == 40_000_000 and step.link.name == "nvlink"
    assert tiny(dp=64, tp=2, zero=1).step.bucket_params == 64_000_000  # max(40M, 1M x 64) over the network
    assert tiny(dp=64, tp=2, zero=1).step.link.name == "network"
    assert tiny(tp=2).layers[1].params == 36864 // 2 + 2 * 64  # matmul weights split, the norms whole


@pytest.mark.parametrize("options, line", [
    (dict(cp=3), "cp = 3: seq_len = 16 is not a multiple of 2·cp = 6 (load-balanced causal chunks)"),
    (dict(cp=2, flash_attention=False), "cp = 2: ring attention runs on flash attention; drop --no-flash-attention"),
    (dict(cp=2, method="count"), "cp = 2: method = 'count' counts the whole sequence on one device; use --method "
                                 "formula"),
    (dict(cp=0), "cp = 0 must be an integer >= 1 (smallest valid: 1)"),
    (dict(zero=2), "zero = 2: should be 0, 1 or 3"),
])
def test_refusals_in_one_line(options, line):
    with pytest.raises(InputError) as error:
        tiny(**options)
    assert str(error.value) == line
