"""NCCL's own tuning model of a ring collective (NCCL 2.27.7 src/graph/tuning.cc, ``ncclTopoTuneModel`` and
``ncclTopoGetAlgoTime``): per protocol a base latency, a latency per ring step (NVLink within a node, the network
between nodes), and a share of the bus bandwidth; NCCL runs the protocol of the least time.

A reduce-scatter or all-gather over r ranks takes r - 1 steps, an all-reduce 2 (r - 1), of which the ring crosses
nodes n - 1 and 2 (n - 1) times over n nodes. The bus bandwidth is the link's (``Link.bytes_per_s``); a rank sends
``factor`` · (r - 1)/r of the buffer. Left out: the tree algorithm NCCL may pick for an all-reduce across nodes, NVLS
and CollNet (switch-side reduction), and LL's cap per CPU and node count.
"""

from __future__ import annotations

from zbsolve.costmodel.constants import (
    NCCL_BASE_LATENCY,
    NCCL_LL128_ALONE,
    NCCL_NET_OVERHEAD,
    NCCL_NETWORK_HOP,
    NCCL_NETWORK_HOP_ALONE,
    NCCL_NVLINK_HOP,
    NCCL_PROTOCOL_SHARE,
    NCCL_PROTOCOLS,
    NCCL_RING_PLATEAU,
)


def ring_latency(protocol: str, ranks: int, nodes: int, factor: int = 1, alone: bool = False) -> float:
    """Seconds of latency of a ring collective of ``ranks`` ranks over ``nodes`` nodes under ``protocol``
    (``factor`` 2: an all-reduce; ``alone``: one rank per node)."""
    steps = factor * (ranks - 1)
    crossing = factor * (nodes - 1)
    within = max(NCCL_NVLINK_HOP[protocol], NCCL_NET_OVERHEAD[protocol] if nodes > 1 else 0.0)
    between = (NCCL_NETWORK_HOP_ALONE if alone else NCCL_NETWORK_HOP)[protocol]
    latency = NCCL_BASE_LATENCY[protocol] + (steps - crossing) * within + crossing * between
    return latency * NCCL_RING_PLATEAU if protocol == "Simple" and nodes > 1 and factor == 2 else latency


def ring(num_bytes: float, ranks: int, bus_bytes_per_s: float, ranks_per_node: int | None = None,
         factor: int = 1) -> float:
    """Seconds of a ring collective of a ``num_bytes`` buffer over ``ranks`` ranks at ``bus_bytes_per_s``, of which
    ``ranks_per_node`` share a node (None: all of them), under the protocol NCCL would pick (the least time)."""
    per_node = ranks if ranks_per_node is None else min(ranks_per_node, ranks)
    nodes = -(-ranks // per_node)
    alone = per_node == 1 and nodes > 1
    sent = factor * (ranks - 1) / ranks * num_bytes
    return min(ring_latency(p, ranks, nodes, factor, alone)
               + sent / (bus_bytes_per_s * (NCCL_LL128_ALONE if alone and p == "LL128" else NCCL_PROTOCOL_SHARE[p]))
               for p in NCCL_PROTOCOLS)
