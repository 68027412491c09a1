"""GPU presets for estimated costs: published peak figures, each with the datasheet it comes from.

Throughputs are dense (no 2:4 sparsity): NVIDIA's datasheets print the sparse figure with an asterisk, and the
dense one is half of it. Memory is what the device reports to NVML (``nvidia-smi``'s ``memory.total``), not the
datasheet's decimal GB. Link bandwidths are per direction: a datasheet's NVLink figure is the sum of both
directions, a network figure is one NIC per GPU. The kernel model's fractions of the peaks
(``zbsolve.costmodel.kernels``) were measured on a lent H100 (``problems/measured/h100/kernels.json``) and
are taken for the other presets as the same fractions of their datasheet peaks.
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
    """HBM capacity in bytes as the device reports it to NVML."""
    hbm_bytes_per_s: float
    """HBM bandwidth, bytes/s."""
    nvlink_bytes_per_s: float
    """NVLink bandwidth per direction, bytes/s (half the datasheet's bidirectional figure)."""
    network_bytes_per_s: float
    """Inter-node bandwidth per GPU and direction, bytes/s (one NIC per GPU, as in NVIDIA's DGX systems)."""
    source: str
    """Where the figures come from."""
    sms: int
    """Streaming multiprocessors: the tiles of one wave of a matrix product."""
    fp8_flops: float | None
    """Peak dense FP8 tensor-core throughput, FLOP/s (None: no FP8 tensor cores)."""
    gpus_per_node: int = 8
    """GPUs an NVLink domain joins (a DGX/HGX node's 8)."""
    gemm_fraction: float = 0.753
    """Share of ``flops`` a BF16 matrix product reaches with full waves and a deep inner size (H100 measured)."""
    fp8_gemm_fraction: float = 0.685
    """Share of ``fp8_flops`` an FP8 matrix product reaches so (H100 measured)."""
    memory_fraction: float = 0.80
    """Share of ``hbm_bytes_per_s`` a fused memory-bound kernel streams (H100 measured: 2.69 of 3.35 TB/s)."""

    def link(self, kind: str) -> float:
        """Bandwidth per direction of ``kind`` ("nvlink" or "network"), bytes/s."""
        if kind not in LINKS:
            raise InputError(f"link = {kind!r}: should be one of {', '.join(LINKS)}")
        return self.nvlink_bytes_per_s if kind == "nvlink" else self.network_bytes_per_s

    def group_link(self, devices: int) -> str:
        """The link a group of ``devices`` adjacent ranks communicates over: NVLink while they fit one node, else
        the network (Megatron's rank order tp-cp-ep-dp-pp puts a tp x cp group, then its dp replicas, side by
        side)."""
        return "nvlink" if devices <= self.gpus_per_node else "network"


MIB = 2**20
"""Bytes of a MiB, the unit NVML reports memory in."""

LINKS = ("nvlink", "network")
"""Links between pipeline stages: NVLink within a node, the network (one NIC per GPU) across nodes."""

GPUS: dict[str, Gpu] = {
    "h100": Gpu("NVIDIA H100 SXM5 80GB", flops=1979e12 / 2, memory_bytes=81559 * MIB, hbm_bytes_per_s=3.35e12,
                nvlink_bytes_per_s=900e9 / 2, network_bytes_per_s=400e9 / 8, sms=132, fp8_flops=3958e12 / 2,
                source="NVIDIA H100 Tensor Core GPU datasheet (SXM): BF16 1,979 and FP8 3,958 TFLOPS with sparsity, "
                       "HBM3 at 3.35 TB/s, NVLink 900 GB/s; DGX H100 datasheet: ConnectX-7 400 Gb/s per GPU; "
                       "81,559 MiB and 132 SMs as reported on a lent H100 (problems/measured/h100/nvidia-smi.csv)"),
    "h200": Gpu("NVIDIA H200 SXM 141GB", flops=1979e12 / 2, memory_bytes=143771 * MIB, hbm_bytes_per_s=4.8e12,
                nvlink_bytes_per_s=900e9 / 2, network_bytes_per_s=400e9 / 8, sms=132, fp8_flops=3958e12 / 2,
                source="NVIDIA H200 Tensor Core GPU datasheet (SXM): BF16 1,979 and FP8 3,958 TFLOPS with sparsity, "
                       "HBM3e at 4.8 TB/s, NVLink 900 GB/s; DGX H200: ConnectX-7 400 Gb/s per GPU; 143,771 MiB and "
                       "132 SMs as nvidia-smi and torch report on a lent H200"),
    "a100": Gpu("NVIDIA A100 SXM4 80GB", flops=624e12 / 2, memory_bytes=81920 * MIB, hbm_bytes_per_s=2.039e12,
                nvlink_bytes_per_s=600e9 / 2, network_bytes_per_s=200e9 / 8, sms=108, fp8_flops=None,
                source="NVIDIA A100 Tensor Core GPU datasheet (80GB SXM): BF16 312 TFLOPS (624 with sparsity), "
                       "HBM2e at 2,039 GB/s, NVLink 600 GB/s, no FP8; DGX A100: ConnectX-6 200 Gb/s per GPU; NVIDIA "
                       "A100 Tensor Core architecture whitepaper: 108 SMs; 81,920 MiB as nvidia-smi reports an "
                       "A100-SXM4-80GB (published logs)"),
    "b200": Gpu("NVIDIA B200 (HGX) 180GB", flops=4500e12 / 2, memory_bytes=183359 * MIB, hbm_bytes_per_s=8e12,
                nvlink_bytes_per_s=1800e9 / 2, network_bytes_per_s=400e9 / 8, sms=148, fp8_flops=9000e12 / 2,
                source="NVIDIA HGX B200 specifications: BF16 4.5 and FP8 9 PFLOPS with sparsity, NVLink 1.8 TB/s; "
                       "DGX B200 datasheet: 64 TB/s HBM for 8 GPUs, ConnectX-7 400 Gb/s per GPU; 148 SMs (NVIDIA "
                       "Blackwell architecture technical brief); 183,359 MiB as nvidia-smi reports a B200 "
                       "(published logs)"),
}
"""The presets by the name ``--gpu`` takes."""


def get_gpu(name: str) -> Gpu:
    """The preset called ``name`` (case-insensitive); an ``InputError`` naming the presets otherwise."""
    gpu = GPUS.get(name.lower()) if isinstance(name, str) else None
    if gpu is None:
        raise InputError(f"gpu = {name!r}: should be one of {', '.join(GPUS)}")
    return gpu
