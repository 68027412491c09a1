"""GPU presets for estimated costs: published peak figures, each with the datasheet it comes from.

Throughputs are dense (no 2:4 sparsity): NVIDIA's datasheets print the sparse figure with an asterisk, and the
dense one is half of it. Memory is what the device reports to NVML (``nvidia-smi``'s ``memory.total``), not the
datasheet's decimal GB. Link bandwidths are per direction: a datasheet's NVLink figure is the sum of both
directions, a network figure is one NIC per GPU. The kernel model's shares of the peaks
(``zbsolve.costmodel.kernels``) come from a measured table (``Gpu.measured``, ``zbsolve.costmodel.measured``):
the H100's, taken for the other presets as the same shares of their datasheet peaks. The memory per device
is decided here alone (``device_memory``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import overload

from zbsolve.base.errors import InputError
from zbsolve.base.units import MIB
from zbsolve.costmodel.constants import (
    COLLECTIVE_INTERFERENCE,
    COMPUTE_INTERFERENCE,
    FP8_GEMM_FRACTION,
    GEMM_FRACTION,
    GPUS_PER_NODE,
)
from zbsolve.costmodel.measured import kernel_table
from zbsolve.costmodel.model import Interference


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
    sms: int
    """Streaming multiprocessors: the tiles of one wave of a matrix product."""
    fp8_flops: float | None
    """Peak dense FP8 tensor-core throughput, FLOP/s (None: no FP8 tensor cores)."""
    sources: dict[str, str] = field(compare=False, hash=False)
    """Where each figure (``FIGURES``) comes from, by its field's name."""
    measured: str = "h100"
    """The preset whose measured kernel table (``zbsolve.costmodel.measured``) gives this one's flash-attention
    rates (scaled by the BF16 peaks) and memory-bound share. Every preset takes the H100's: the H200's own table
    (``problems/measured/h200/``) would change the figures of ``problems/models/qwen2-7b.yaml``, an H200 estimate
    (``docs/measurements.md``)."""
    gpus_per_node: int = GPUS_PER_NODE
    """GPUs an NVLink domain joins (a DGX/HGX node's 8)."""
    gemm_fraction: float = GEMM_FRACTION
    """Share of ``flops`` a BF16 matrix product reaches with full waves and a deep inner size (H100 measured)."""
    fp8_gemm_fraction: float = FP8_GEMM_FRACTION
    """Share of ``fp8_flops`` an FP8 matrix product reaches so (H100 measured)."""
    compute_interference: float = COMPUTE_INTERFERENCE
    """Computation lost per second a collective overlaps it (``COMPUTE_INTERFERENCE``)."""
    collective_interference: float = COLLECTIVE_INTERFERENCE
    """Share a collective beside computation takes longer than alone (``COLLECTIVE_INTERFERENCE``)."""

    def __post_init__(self) -> None:
        if set(self.sources) != set(FIGURES):
            raise InputError(f"sources = {sorted(self.sources)}: should name each of {', '.join(FIGURES)}")

    @functools.cached_property
    def memory_fraction(self) -> float:
        """Share of ``hbm_bytes_per_s`` a fused memory-bound kernel streams: the measured ``STREAMING_KERNEL``'s
        rate over the measured preset's datasheet bandwidth, to 2 decimals (H100: 2.69 of 3.35 TB/s, 0.80; the
        H200's table: 3.58 of 4.8, 0.75)."""
        return round(kernel_table(self.measured).streamed_bytes_per_s / GPUS[self.measured].hbm_bytes_per_s, 2)

    @functools.cached_property
    def memory_bytes_per_s(self) -> float:
        """HBM bytes/s of the memory-bound kernels: the one rule the kernel model streams bytes at
        (``hbm_bytes_per_s`` · ``memory_fraction``)."""
        return self.hbm_bytes_per_s * self.memory_fraction

    @property
    def interference(self) -> Interference:
        """How a collective and the computation beside it slow each other on this GPU."""
        return Interference(compute=self.compute_interference, collective=self.collective_interference)

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


FIGURES = ("flops", "fp8_flops", "memory_bytes", "hbm_bytes_per_s", "nvlink_bytes_per_s", "network_bytes_per_s",
           "sms")
"""A preset's figures, each with its source (``Gpu.sources``)."""
LINKS = ("nvlink", "network")
"""Links between pipeline stages: NVLink within a node, the network (one NIC per GPU) across nodes."""

_H100, _H200 = kernel_table("h100"), kernel_table("h200")  # the lent devices' memory and SMs
GPUS: dict[str, Gpu] = {
    "h100": Gpu("NVIDIA H100 SXM5 80GB", flops=1979e12 / 2, memory_bytes=_H100.memory_bytes,
                hbm_bytes_per_s=3.35e12,
                nvlink_bytes_per_s=900e9 / 2, network_bytes_per_s=400e9 / 8, sms=_H100.sms,
                fp8_flops=3958e12 / 2,
                sources={"flops": "NVIDIA H100 Tensor Core GPU datasheet (SXM): BF16 1,979 TFLOPS with sparsity",
                         "fp8_flops": "NVIDIA H100 Tensor Core GPU datasheet (SXM): FP8 3,958 TFLOPS with sparsity",
                         "memory_bytes": "problems/measured/h100/nvidia-smi.csv, memory.total",
                         "hbm_bytes_per_s": "NVIDIA H100 Tensor Core GPU datasheet (SXM): HBM3 at 3.35 TB/s",
                         "nvlink_bytes_per_s": "NVIDIA H100 Tensor Core GPU datasheet (SXM): NVLink 900 GB/s",
                         "network_bytes_per_s": "NVIDIA DGX H100 datasheet: ConnectX-7 400 Gb/s per GPU",
                         "sms": "problems/measured/h100/kernels.json, multiprocessors"}),
    "h200": Gpu("NVIDIA H200 SXM 141GB", flops=1979e12 / 2, memory_bytes=_H200.memory_bytes,
                hbm_bytes_per_s=4.8e12,
                nvlink_bytes_per_s=900e9 / 2, network_bytes_per_s=400e9 / 8, sms=_H200.sms,
                fp8_flops=3958e12 / 2,
                sources={"flops": "NVIDIA H200 Tensor Core GPU datasheet (SXM): BF16 1,979 TFLOPS with sparsity",
                         "fp8_flops": "NVIDIA H200 Tensor Core GPU datasheet (SXM): FP8 3,958 TFLOPS with sparsity",
                         "memory_bytes": "problems/measured/h200/nvidia-smi.csv, memory.total",
                         "hbm_bytes_per_s": "NVIDIA H200 Tensor Core GPU datasheet (SXM): HBM3e at 4.8 TB/s",
                         "nvlink_bytes_per_s": "NVIDIA H200 Tensor Core GPU datasheet (SXM): NVLink 900 GB/s",
                         "network_bytes_per_s": "NVIDIA DGX H200: ConnectX-7 400 Gb/s per GPU",
                         "sms": "problems/measured/h200/kernels.json, multiprocessors"}),
    "a100": Gpu("NVIDIA A100 SXM4 80GB", flops=624e12 / 2, memory_bytes=81920 * MIB, hbm_bytes_per_s=2.039e12,
                nvlink_bytes_per_s=600e9 / 2, network_bytes_per_s=200e9 / 8, sms=108, fp8_flops=None,
                sources={"flops": "NVIDIA A100 Tensor Core GPU datasheet (80GB SXM): BF16 312 TFLOPS (624 with "
                                  "sparsity)",
                         "fp8_flops": "NVIDIA A100 Tensor Core GPU datasheet: no FP8",
                         "memory_bytes": "nvidia-smi of an A100-SXM4-80GB (published logs): 81,920 MiB",
                         "hbm_bytes_per_s": "NVIDIA A100 Tensor Core GPU datasheet (80GB SXM): HBM2e at 2,039 GB/s",
                         "nvlink_bytes_per_s": "NVIDIA A100 Tensor Core GPU datasheet (80GB SXM): NVLink 600 GB/s",
                         "network_bytes_per_s": "NVIDIA DGX A100 datasheet: ConnectX-6 200 Gb/s per GPU",
                         "sms": "NVIDIA A100 Tensor Core GPU architecture whitepaper: 108 SMs"}),
    "b200": Gpu("NVIDIA B200 (HGX) 180GB", flops=4500e12 / 2, memory_bytes=183359 * MIB, hbm_bytes_per_s=8e12,
                nvlink_bytes_per_s=1800e9 / 2, network_bytes_per_s=400e9 / 8, sms=148, fp8_flops=9000e12 / 2,
                sources={"flops": "NVIDIA HGX B200 specifications: BF16 4.5 PFLOPS with sparsity",
                         "fp8_flops": "NVIDIA HGX B200 specifications: FP8 9 PFLOPS with sparsity",
                         "memory_bytes": "nvidia-smi of a B200 (published logs): 183,359 MiB",
                         "hbm_bytes_per_s": "NVIDIA DGX B200 datasheet: 64 TB/s HBM for 8 GPUs",
                         "nvlink_bytes_per_s": "NVIDIA HGX B200 specifications: NVLink 1.8 TB/s",
                         "network_bytes_per_s": "NVIDIA DGX B200 datasheet: ConnectX-7 400 Gb/s per GPU",
                         "sms": "NVIDIA Blackwell architecture technical brief: 148 SMs"}),
}
"""The presets by the name ``--gpu`` takes."""


def get_gpu(name: str) -> Gpu:
    """The preset called ``name`` (case-insensitive); an ``InputError`` naming the presets otherwise."""
    gpu = GPUS.get(name.lower()) if isinstance(name, str) else None
    if gpu is None:
        raise InputError(f"gpu = {name!r}: should be one of {', '.join(GPUS)}")
    return gpu


@overload
def device_memory(gpu: str, given: int | None = None) -> int: ...
@overload
def device_memory(gpu: None, given: int | None = None) -> int | None: ...


def device_memory(gpu: str | None, given: int | None = None) -> int | None:
    """Bytes of memory per device, decided here alone: ``given`` where set, else the memory of the preset ``gpu``
    names (``get_gpu``: an ``InputError`` for another name), else None (no preset named)."""
    if given is not None:
        return given
    return None if gpu is None else get_gpu(gpu).memory_bytes
