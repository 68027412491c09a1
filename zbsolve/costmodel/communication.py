"""A layer's communication under one setup: its tensor-parallel collectives (each hidden behind the product beside
it under overlap, ``LayerCosts.hiding``), the context-parallel ring's key/value exchange, the expert all-to-all over
NVLink and the network (``moe.all_to_all_bytes``), and the links of the stages and of the data-parallel group."""

from __future__ import annotations

from zbsolve.costmodel import context, moe
from zbsolve.costmodel.constants import P2P_LATENCY
from zbsolve.costmodel.gpus import Gpu
from zbsolve.costmodel.hf_config import Architecture
from zbsolve.costmodel.layer_costs import LayerCosts
from zbsolve.costmodel.model import NO_INTERFERENCE, Interference, Link


def tp_collective(device: Gpu, arch: Architecture, tokens: int, e: int, tp: int) -> float:
    """Seconds of one tensor-parallel all-gather or reduce-scatter of ``tokens`` hidden states over NVLink; 0
    without tensor parallelism."""
    return (tp - 1) / tp * tokens * arch.hidden * e / device.nvlink_bytes_per_s + P2P_LATENCY if tp > 1 else 0.0


def ring_step(device: Gpu, arch: Architecture, tokens: int, e: int, tp: int, cp: int) -> float:
    """Seconds of one step of the context-parallel ring: a device's keys and values of ``tokens`` (1/tp of them)
    over the link of the tp x cp group; 0 without context parallelism."""
    if cp == 1:
        return 0.0
    return tokens * context.kv_bytes(arch, e) // tp / device.link(device.group_link(tp * cp)) + P2P_LATENCY


def expert_exchange(device: Gpu, arch: Architecture, tokens: int, e: int, ep: int, a2a_link: str | None,
                    dispatcher: str) -> float:
    """Seconds of one dispatch or combine of a device's ``tokens``: its NVLink and network bytes
    (``moe.all_to_all_bytes``) sent at once, the slower link's time, or all of them over ``a2a_link``; 0 without
    expert parallelism."""
    if ep == 1:
        return 0.0
    nvlink, network = moe.all_to_all_bytes(tokens, arch, e, ep, device.gpus_per_node, dispatcher)
    if a2a_link is not None:
        return (nvlink + network) / device.link(a2a_link) + P2P_LATENCY
    return max(nvlink / device.nvlink_bytes_per_s, network / device.network_bytes_per_s) + P2P_LATENCY


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


def link_of(device: Gpu, name: str) -> Link:
    """The link ``name`` ("nvlink" or "network") of ``device``, with the point-to-point latency."""
    return Link(name=name, bytes_per_s=device.link(name), latency_s=P2P_LATENCY)


def group_link(device: Gpu, devices: int) -> Link:
    """The link a group of ``devices`` adjacent ranks communicates over (``Gpu.group_link``)."""
    return link_of(device, device.group_link(devices))
