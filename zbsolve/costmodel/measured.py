"""The kernel tables measured on lent GPUs (``problems/measured/<gpu>/kernels.json``, written by
``benchmarks/gpu/``): flash attention's rates by head size and sequence, the rate of the memory-bound kernel
``STREAMING_KERNEL``, and the memory and SMs the device reported. A preset takes the figures of the table its
``Gpu.measured`` names, attention scaled by the BF16 peaks.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from zbsolve.base.errors import InputError
from zbsolve.base.units import MIB
from zbsolve.costmodel.constants import STREAMING_KERNEL

MEASURED = Path(__file__).resolve().parents[2] / "problems" / "measured"
"""Where the measured tables lie, one folder per GPU preset."""
TABLES = ("h100", "h200")
"""The presets measured."""


@dataclass(frozen=True)
class KernelTable:
    """What the cost model reads of one GPU's measured kernels."""

    attention: dict[int, dict[int, tuple[float, float]]]
    """Causal flash attention's F and B FLOP/s (whole TFLOP/s) by head size and sequence (torch's
    ``scaled_dot_product_attention``, BF16; F counting the causal half of the 2·s²·(d + d_v) products of a head, B
    ``ATTENTION_B_FLOPS`` times that)."""
    streamed_bytes_per_s: float
    """HBM bytes/s of ``STREAMING_KERNEL``."""
    memory_bytes: int
    """Memory as the device reports it to NVML (``nvidia-smi.csv``'s ``memory.total``, MiB)."""
    sms: int
    """Streaming multiprocessors as torch reports them."""


@functools.cache
def kernel_table(gpu: str) -> KernelTable:
    """The measured table of the preset ``gpu`` (one of ``TABLES``)."""
    if gpu not in TABLES:
        raise InputError(f"measured = {gpu!r}: should be one of {', '.join(TABLES)}")
    path = MEASURED / gpu / "kernels.json"
    data = json.loads(path.read_text())
    attention: dict[int, dict[int, tuple[float, float]]] = {}
    for row in data["attention"]:
        attention.setdefault(row["head_dim"], {})[row["seq"]] = (round(row["f_tflops"]) * 1e12,
                                                                 round(row["b_tflops"]) * 1e12)
    smi = dict(zip(*(line.split(", ") for line in (MEASURED / gpu / "nvidia-smi.csv").read_text().splitlines()[:2])))
    return KernelTable(attention, data["memory_bound"][STREAMING_KERNEL]["bytes_per_s"],
                       int(smi["memory.total [MiB]"].removesuffix(" MiB")) * MIB, data["multiprocessors"])
