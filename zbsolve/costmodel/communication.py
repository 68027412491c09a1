"""A layer's communication under one setup: its tensor-parallel collectives (each hidden behind the product beside
it under overlap, ``LayerCosts.hiding``), the context-parallel ring's key/value exchange, the expert all-to-all over
NVLink and the network (``moe.all_to_all_bytes``), and the links of the stages and of the data-parallel group."""

from __future__ import annotations

from zbsolve.costmodel import context, moe
from zbsolve.costmodel.constants import NCCL_NVLINK_SHARE, P2P_LATENCY
from zbsolve.costmodel.gpus import Gpu
from zbsolve.costmodel.hf_config import Architecture
from zbsolve.costmodel.layer_costs import LayerCosts
from zbsolve.costmodel.model import NO_INTERFERENCE, Interference, Link


def tp_collective(device: Gpu, arch: Architecture, tokens: int, e: int, tp: int) -> float:
    """Seconds of one tensor-parallel all-gather or reduce-scatter of ``tokens`` hidden states over NVLink
    (``Link.collective``); 0 without tensor parallelism."""
    return link_of(device, "nvlink").collective(tokens * arch.hidden * e, tp)


def ring_step(device: Gpu, arch: Architecture, tokens: int, e: int, tp: int, cp: int) -> float:
    """Seconds of one step of the context-parallel ring: a device's keys and values of ``tokens`` (1/tp of them)
    sent to the next rank over the link of the tp x cp group; 0 without context parallelism."""
    if cp == 1:
        return 0.0
    return link_of(device, device.group_link(tp * cp)).time(tokens * context.kv_bytes(arch, e) // tp)


def expert_exchange(device: Gpu, arch: Architecture, tokens: int, e: int, ep: int, a2a_link: str | None,
                    dispatcher: str) -> float:
    """Seconds of one dispatch or combine of a device's ``tokens``: its NVLink and network bytes
    (``moe.all_to_all_bytes``) sent at once, the slower link's time, or all of them over ``a2a_link``, with the
    point-to-point latency of the link crossed (NCCL's all-to-all is a send and a receive per peer); 0 without
    expert parallelism."""
    if ep == 1:
        return 0.0
    nvlink, network = moe.all_to_all_bytes(tokens, arch, e, ep, device.gpus_per_node, dispatcher)
    if a2a_link is not None:
        return link_of(device, a2a_link).time(nvlink + network)
    crossed = "network" if network else "nvlink"
    return max(nvlink / bandwidth(device, "nvlink"), network / bandwidth(device, "network")) + P2P_LATENCY[crossed]


def collectives(c: LayerCosts, p: int, collective: float, overlap: bool,
                interference: Interference = NO_INTERFERENCE) -> float:
    """Seconds pass ``p`` of ``c`` spends in tensor-parallel collectives of ``collective`` seconds each: all of
    them, or under overlap what each adds to the product it hides behind (``LayerCosts.hiding``): the two slowed
    by ``interference``, the product's own time taken out."""
    if not overlap:
        return c.collectives[p] * collective
    hidden = c.hiding[p]
    return (sum(interference.overlapped(g, collective) - g for g in hidden)
            + (c.collectives[p] - len(hidden)) * collective)


def bandwidth(device: Gpu, name: str) -> float:
    """Bytes/s per direction NCCL drives the link ``name`` of ``device`` at: NVLink at ``NCCL_NVLINK_SHARE`` of
    the datasheet's, the network at the NIC's line rate (as NCCL's topology takes it)."""
    return device.link(name) * (NCCL_NVLINK_SHARE if name == "nvlink" else 1.0)


def link_of(device: Gpu, name: str) -> Link:
    """The link ``name`` ("nvlink" or "network") of ``device`` at NCCL's bandwidth, with the point-to-point
    latency (``P2P_LATENCY``)."""
    return Link(name=name, bytes_per_s=bandwidth(device, name), latency_s=P2P_LATENCY[name])


def group_link(device: Gpu, ranks: int, stride: int = 1) -> Link:
    """The link of a collective's group of ``ranks`` ranks ``stride`` apart (Megatron's rank order tp-cp-ep-dp-pp:
    a data-parallel group's ranks are tp apart): NVLink while the group fits a node, else the network with
    gpus_per_node / stride of its ranks a node (``Link.ranks_per_node``), whose ring crosses each node once a
    channel, its channels spread over those ranks' NICs: their line rates together, at most NVLink's
    (``bandwidth``)."""
    name = device.group_link(ranks * stride)
    if name == "nvlink":
        return link_of(device, name)
    per_node = max(1, min(ranks, device.gpus_per_node // stride))
    bus = min(per_node * bandwidth(device, "network"), bandwidth(device, "nvlink"))
    return Link(name=name, bytes_per_s=bus, latency_s=P2P_LATENCY[name], ranks_per_node=per_node)
