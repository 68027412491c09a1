"""GPU presets for estimated costs: published peak figures, each with the datasheet it comes from.

Throughputs are dense (no 2:4 sparsity): NVIDIA's datasheets print the sparse figure with an asterisk, and the
dense one is half of it. Memory is the datasheet's decimal GB. Link bandwidths are per direction: a datasheet's
NVLink figure is the sum of both directions, a network figure is one NIC per GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from zbsolve.base.errors import InputError

P2P_LATENCY = 10e-6
"""Seconds added to every point-to-point transfer and collective: an assumption (NCCL's latency for a message
between two GPUs is a few to tens of microseconds), not a datasheet figure."""


@dataclass(frozen=True)
class Gpu:
    """One accelerator's published peak figures."""

    name: str
    """Product name."""
    flops: float
    """Peak dense bf16/fp16 tensor-core throughput, FLOP/s."""
    memory_bytes: int
    """HBM capacity in bytes (the datasheet's decimal GB)."""
    hbm_bytes_per_s: float
    """HBM bandwidth, bytes/s."""
    nvlink_bytes_per_s: float
    """NVLink bandwidth per direction, bytes/s (half the datasheet's bidirectional figure)."""
    network_bytes_per_s: float
    """Inter-node bandwidth per GPU and direction, bytes/s (one NIC per GPU, as in NVIDIA's DGX systems)."""
    source: str
    """Where the figures come from."""
    gpus_per_node: int = 8
    """GPUs an NVLink domain joins (a DGX/HGX node's 8)."""

    def link(self, kind: str) -> float:
        """Bandwidth per direction of ``kind`` ("nvlink" or "network"), bytes/s."""
        if kind not in LINKS:
            raise InputError(f"link = {kind!r}: should be one of {', '.join(LINKS)}")
        return self.nvlink_bytes_per_s if kind == "nvlink" else self.network_bytes_per_s

    def expert_link(self, ep: int) -> str:
        """The link an all-to-all over ``ep`` devices takes: NVLink while they fit one node, else the network."""
        return "nvlink" if ep <= self.gpus_per_node else "network"


LINKS = ("nvlink", "network")
"""Links between pipeline stages: NVLink within a node, the network (one NIC per GPU) across nodes."""

GPUS: dict[str, Gpu] = {
    "h100": Gpu("NVIDIA H100 SXM5 80GB", flops=1979e12 / 2, memory_bytes=80 * 10**9, hbm_bytes_per_s=3.35e12,
                nvlink_bytes_per_s=900e9 / 2, network_bytes_per_s=400e9 / 8,
                source="NVIDIA H100 Tensor Core GPU datasheet (SXM): BF16 1,979 TFLOPS with sparsity, 80 GB HBM3 "
                       "at 3.35 TB/s, NVLink 900 GB/s; DGX H100 datasheet: ConnectX-7 400 Gb/s per GPU"),
    "h200": Gpu("NVIDIA H200 SXM 141GB", flops=1979e12 / 2, memory_bytes=141 * 10**9, hbm_bytes_per_s=4.8e12,
                nvlink_bytes_per_s=900e9 / 2, network_bytes_per_s=400e9 / 8,
                source="NVIDIA H200 Tensor Core GPU datasheet (SXM): BF16 1,979 TFLOPS with sparsity, 141 GB "
                       "HBM3e at 4.8 TB/s, NVLink 900 GB/s; DGX H200: ConnectX-7 400 Gb/s per GPU"),
    "a100": Gpu("NVIDIA A100 SXM4 80GB", flops=624e12 / 2, memory_bytes=80 * 10**9, hbm_bytes_per_s=2.039e12,
                nvlink_bytes_per_s=600e9 / 2, network_bytes_per_s=200e9 / 8,
                source="NVIDIA A100 Tensor Core GPU datasheet (80GB SXM): BF16 312 TFLOPS (624 with sparsity), "
                       "80 GB HBM2e at 2,039 GB/s, NVLink 600 GB/s; DGX A100: ConnectX-6 200 Gb/s per GPU"),
    "b200": Gpu("NVIDIA B200 (HGX) 180GB", flops=4500e12 / 2, memory_bytes=180 * 10**9, hbm_bytes_per_s=8e12,
                nvlink_bytes_per_s=1800e9 / 2, network_bytes_per_s=400e9 / 8,
                source="NVIDIA HGX B200 specifications: BF16 4.5 PFLOPS with sparsity, 180 GB HBM3e, NVLink "
                       "1.8 TB/s; DGX B200 datasheet: 64 TB/s HBM for 8 GPUs, ConnectX-7 400 Gb/s per GPU"),
}
"""The presets by the name ``--gpu`` takes."""


def get_gpu(name: str) -> Gpu:
    """The preset called ``name`` (case-insensitive); an ``InputError`` naming the presets otherwise."""
    gpu = GPUS.get(name.lower()) if isinstance(name, str) else None
    if gpu is None:
        raise InputError(f"gpu = {name!r}: should be one of {', '.join(GPUS)}")
    return gpu
