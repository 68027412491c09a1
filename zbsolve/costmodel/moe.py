"""The closed form's parts of a mixture-of-experts decoder's layers (``docs/cost-model.md``, "Mixture of experts"),
per token on one device before tensor and expert parallelism: the routed and shared experts with their router, the
entry of a multi-token prediction layer, and the bytes of an expert-parallel all-to-all; each block of any decoder
(``block``: attention and the dense MLP from ``zbsolve.costmodel.block``, routed experts where the config has
them); and the settings a mixture-of-experts estimate refuses. ``zbsolve.costmodel.estimate`` turns a layer's
parts into its costs per device.

Routing is assumed balanced: every device of the expert-parallel group receives as many tokens as it sends, so
each processes ``top_k`` expert MLPs per token of its own microbatch. Experts are not split by tensor parallelism
(Megatron-LM's ``--expert-tensor-parallel-size 1``): a device holds ``E / ep`` whole experts, and its tokens
(``1/tp`` of the microbatch under sequence parallelism) are dispatched to them by all-to-all.
"""

from __future__ import annotations

from zbsolve.base.errors import InputError
from zbsolve.costmodel.block import Part, activation, attention, dense_mlp, half
from zbsolve.costmodel.constants import FP32_BYTES
from zbsolve.costmodel.gpus import LINKS
from zbsolve.costmodel.hf_config import Architecture
from zbsolve.costmodel.kernels import Matmul

DISPATCHERS = ("alltoall", "flex")
"""How a dispatch reaches the experts: "alltoall" (Megatron-LM's alltoall dispatcher: one copy of a token per routed
expert, in NCCL's all-to-all) or "flex" (DeepEP or HybridEP: a token crosses the network once per node it is routed
to, to the GPU of the same local index there, which forwards it over NVLink to the GPUs of its experts)."""


def check(arch: Architecture, method: str, replicas: int, ep: int, a2a_link: str | None,
          dispatcher: str = "alltoall") -> None:
    """Refuse expert parallelism and an all-to-all link without experts, an unknown dispatcher, an ``ep`` that does
    not divide the routed experts (or, ``replicas`` = tp·dp under ZeRO-1, those replicas), and counting experts."""
    if dispatcher not in DISPATCHERS:
        raise InputError(f"dispatcher = {dispatcher!r}: should be one of {', '.join(DISPATCHERS)}")
    experts = arch.experts
    if experts is None:
        if ep > 1 or a2a_link is not None:
            what = f"ep = {ep}" if ep > 1 else f"a2a_link = {a2a_link!r}"
            raise InputError(f"{what}: model_type {arch.model_type!r} has no experts (expert parallelism needs a "
                             "mixture-of-experts model)")
        return
    if a2a_link is not None and a2a_link not in LINKS:
        raise InputError(f"a2a_link = {a2a_link!r}: should be one of {', '.join(LINKS)}")
    if experts.routed % ep:
        raise InputError(f"ep = {ep}: should divide {experts.key} = {experts.routed} (each device holds "
                         "as many whole experts)")
    if replicas % ep:
        raise InputError(f"ep = {ep}: should divide tp·dp = {replicas} under zero = 1 (the experts' optimizer "
                         "states are sharded over their tp·dp/ep replicas)")
    if method == "count":
        raise InputError(f"method = 'count': {arch.model_type}'s experts route tokens by their values, which the "
                         "meta device counting runs on lacks; use --method formula")


def split_by_tp(arch: Architecture) -> list[tuple[str, int]]:
    """The sizes tensor parallelism splits, by their config key: heads, and the inner sizes of dense MLPs and of
    the shared experts (routed experts stay whole)."""
    sizes = [("num_attention_heads", arch.heads), ("num_key_value_heads", arch.kv_heads)]
    experts = arch.experts
    if experts is None or not all(experts.layers):
        sizes.append(("intermediate_size", arch.ffn))
    if experts is not None and experts.shared_ffn:
        sizes.append(("the shared experts' inner size", experts.shared_ffn))
    return sizes


def block(arch: Architecture, e: int, index: int, sort: bool = False, combined: int = 1) -> Part:
    """Block ``index`` (a multi-token prediction layer's block for an index past the last: of the last's kind): its
    attention and its MLP, routed experts where the config has them (``sort``, ``combined``: ``routed``'s), else
    dense."""
    routed = arch.experts is not None and arch.experts.layers[min(index, arch.layers - 1)]
    return attention(arch, e) + (_experts(arch, e, sort, combined) if routed else dense_mlp(arch, e))


def _experts(arch: Architecture, e: int, sort: bool, combined: int) -> Part:
    """The MLP half of a block with experts, its norm included (``block.half``): the router, the routed experts and
    the shared experts (``router``, ``routed``, ``shared``)."""
    return half(arch, e, router(arch, e) + routed(arch, e, sort, combined) + shared(arch, e))


def sorts(dispatcher: str, local_experts: int) -> bool:
    """Whether the dispatch sorts the received copies by local expert and the combine restores their order
    (megatron-core's ``MoEAlltoAllTokenDispatcher``: ``sort_chunks_by_idxs`` after the all-to-all where a device
    holds more than one expert; DeepEP's dispatch delivers them grouped)."""
    return dispatcher == "alltoall" and local_experts > 1


def router(arch: Architecture, e: int) -> Part:
    """The router (h x E, and Qwen2-MoE's h x 1 shared-expert gate), whole on every device. Kept: the MLP's input
    (h), the fp32 probabilities (E) and top-k weights (k); W needs that input and the router's output gradient.
    Kernels: its product in 16 bits (Transformer Engine keeps the router out of FP8); the scores read the logits and
    write fp32 probabilities in F, the reverse in B: two kernels a pass (megatron-core's fused top-k with its
    score function, and the auxiliary loss's scores), each with its backward in B. gpt-oss's router has a bias
    (E parameters, ``Experts.biases``)."""
    h, x = arch.hidden, arch.experts
    assert x is not None
    weights = h * x.routed + h * x.shared_gate
    scores = x.routed * (e + FP32_BYTES)
    return Part(flops=(2 * weights,) * 3, saved=e * h + FP32_BYTES * (x.routed + x.top_k), for_w=e * (h + x.routed),
                split=0, whole=weights + x.routed * x.biases, collectives=(0, 0, 0),
                matmuls=(Matmul(h, x.routed + x.shared_gate, "whole", fp8=False),), elementwise=(scores, scores, 0),
                launches=(2, 2, 0))


def routed(arch: Architecture, e: int, sort: bool = False, combined: int = 1) -> Part:
    """``top_k`` routed SwiGLU experts of inner size f_e a token, shared out over the expert-parallel group, each
    token dispatched and combined by all-to-all. Kept: the k dispatched copies of the token (k·h), each expert's
    gate and up outputs and down input (3·f_e), ``combined`` copies of the experts' outputs the combine weighs
    (k·h each; ``COMBINE_KEPT_COPIES`` by runtime: Megatron weighs inside the activation function); W needs each
    expert's inputs and output gradients (k·(2h + 3·f_e)); selective recomputation runs their activation functions
    again.
    Kernels: grouped gate/up and down products over the device's experts; their activation functions; the
    permutation that copies each token k times before the dispatch and the weighted sum after the combine (read
    h and write k·h, read k·h and write h, in F and in B), and with ``sort`` (``sorts``) the received copies'
    sort by local expert and its reverse (each reads and writes k·h, in F and in B); a kernel each, in F and B.
    gpt-oss's expert biases (``Experts.biases``) are parameters; adding them is left to the products' epilogues."""
    h, x = arch.hidden, arch.experts
    assert x is not None
    k, fe = x.top_k, x.ffn
    permute = 2 * (k + 1) * h * e + sort * 4 * k * h * e
    launches = 3 + 2 * sort
    act = activation(k * fe, e, True)
    saved = e * ((1 + combined) * k * h + 3 * k * fe)
    return Part(flops=(2 * 3 * h * k * fe,) * 3, saved=saved, for_w=e * k * (2 * h + 3 * fe),
                split=0, whole=0, collectives=(0, 0, 0), recomputed=(e * 3 * k * fe, e * k * fe),
                experts=(3 * h * fe + (2 * fe + h) * x.biases) * x.routed, all_to_all=2,
                matmuls=(Matmul(h, 2 * fe, "expert", copies=k), Matmul(fe, h, "expert", copies=k)),
                elementwise=(act[0] + permute, act[1] + permute, 0), launches=(launches, launches, 0))


def shared(arch: Architecture, e: int) -> Part:
    """The shared experts on every token (a SwiGLU of inner size f_s, split over tp as a dense MLP; none where f_s
    is 0). Kept: their 3·f_s (and, gated, their output h and the gate); W needs their inputs and output gradient
    (3·f_s + h) and the gate's output gradient; selective recomputation runs their activation function again.
    Kernels: gate/up (whose input the router keeps too) and down, the activation function."""
    h, x = arch.hidden, arch.experts
    assert x is not None
    fs = x.shared_ffn
    return Part(flops=(2 * 3 * h * fs,) * 3, saved=e * (3 * fs + (h + 1) * x.shared_gate),
                for_w=e * ((3 * fs + h) * (fs > 0) + x.shared_gate), split=3 * h * fs, whole=0,
                collectives=(2, 2, 1) if fs else (0, 0, 0), recomputed=(e * 3 * fs, e * fs),
                matmuls=(Matmul(h, 2 * fs, shared_input=True), Matmul(fs, h, "row")) if fs else (),
                elementwise=activation(fs, e, True), launches=(1, 1, 0) if fs else (0, 0, 0))


def projection(arch: Architecture, e: int) -> Part:
    """A multi-token prediction layer's entry (DeepSeek-V3, Megatron-LM's ``eh_proj``): the hidden state and the
    next token's embedding, each normed, concatenated and projected from 2h to h (split over tp). Kept: the two
    norms' inputs and the projection's 2h-wide input; W needs that input and the h-wide output gradient. Under
    tensor parallelism an all-gather of the 2h-wide input and one of the output in F, their transposes in B, the
    input gathered again in W: 3, 3 and 2 h-wide collectives. Kernels: the projection, the two norms and the
    concatenation."""
    h = arch.hidden
    return Part(flops=(4 * h * h,) * 3, saved=e * 4 * h, for_w=e * 3 * h, split=2 * h * h, whole=2 * arch.norm_params,
                collectives=(3, 3, 2), matmuls=(Matmul(2 * h, h),), elementwise=(4 * h * e, 6 * h * e, 0),
                launches=(3, 3, 0))


def active(part: Part, arch: Architecture) -> int:
    """The parameters of ``part`` a token uses: all but the routed experts it is not sent to."""
    x = arch.experts
    return part.params - (part.experts - part.experts // x.routed * x.top_k if x else 0)


def all_to_all_bytes(tokens: int, arch: Architecture, e: int, ep: int, per_node: int,
                     dispatcher: str = "alltoall") -> tuple[float, float]:
    """(NVLink bytes, network bytes) a device sends in one dispatch or combine of its ``tokens`` under balanced
    routing, the ``ep`` devices consecutive on nodes of ``per_node`` GPUs (Megatron's expert rank order with
    expert tensor parallelism 1): n = min(ep, per_node) of them share a node, so of a token's top_k copies 1/ep
    stays, (n - 1)/ep goes over NVLink and (ep - n)/ep over the network ("alltoall"). "flex" sends a token over
    the network once per other node among the ``reached`` nodes its experts are on, and forwards each copy over
    NVLink unless it lands on the receiving GPU ((n - 1)/n of them)."""
    assert arch.experts is not None
    k, width = arch.experts.top_k, tokens * arch.hidden * e
    n = min(ep, per_node)
    if dispatcher == "alltoall":
        return width * k * (n - 1) / ep, width * k * (ep - n) / ep
    return width * k * (n - 1) / n, width * reached(arch, ep / n) * (ep - n) / ep


def reached(arch: Architecture, nodes: float) -> float:
    """Nodes at most a token's experts are on, of the expert-parallel group's ``nodes``: top_k, the nodes, and under
    node-limited routing the ``group_limit`` groups it may choose, each of consecutive experts spanning nodes /
    groups nodes where groups are larger than a node's experts (DeepSeek-V3, section 2.1.2: at most M = 4 nodes)."""
    x = arch.experts
    assert x is not None
    return min(x.top_k, nodes, x.group_limit * max(1.0, nodes / x.groups))
