"""A configuration's memory per device as ``zbsolve predict`` prints it: its static bytes by part (weights,
gradients, optimizer states, ``problem.partition.held_static_parts``), its peak activations split into the
recomputation's transient and the loss's logits (each at its largest on the device, the activations the rest of
the simulated peak), the pipeline runtime's buffers, and the reserve (``--reserve`` where given, else the CUDA
context, NCCL's buffers and the allocator's fragmentation: ``costmodel.runtime_memory``). The parts sum to the
memory the device needs."""

from __future__ import annotations

from dataclasses import astuple, dataclass, fields
from typing import Sequence

from zbsolve.base.units import gib
from zbsolve.core.simulator import Timeline
from zbsolve.costmodel.constants import DTYPE_BYTES, FP32_BYTES, LOSS_GRAD_COPIES
from zbsolve.costmodel.model import Layer
from zbsolve.costmodel.runtime_memory import fragmentation, outside_allocator, pipeline_buffers
from zbsolve.costmodel.setup import Setup
from zbsolve.problem.costs import Costs
from zbsolve.problem.partition import held_static_parts


@dataclass(frozen=True)
class DeviceMemory:
    """One device's bytes by part; they sum to ``total``."""

    weights: int
    """Weights held: the shards, their FP8 copies, and under FSDP the gathered weights."""
    gradients: int
    """Gradients held: the shards, and under FSDP the gathered (unsharded) gradients."""
    optimizer: int
    """Optimizer states (fp32 master weights, momentum and variance)."""
    activations: float
    """The peak activations less the recomputation's and the logits' parts."""
    recompute: float
    """The largest block recomputed inside its B: its activations, re-materialised one block at a time."""
    logits: float
    """The loss: fp32 log-probabilities and the gradients its B holds (on the device holding the head)."""
    buffers: int
    """The pipeline runtime's receive buffers and output chunks (``runtime_memory.pipeline_buffers``)."""
    reserve: int
    """``--reserve`` where given, else the CUDA context, NCCL's buffers and the allocator's fragmentation."""
    outside: int
    """The part of ``reserve`` outside torch's caching allocator (the CUDA context and NCCL's; all of an explicit
    reserve)."""

    @property
    def total(self) -> float:
        """Bytes the device needs: every part."""
        return sum(astuple(self)[:-1])

    @property
    def allocator(self) -> float:
        """Bytes torch's caching allocator reserves at the peak: every part but ``outside``."""
        return self.total - self.outside

    def gib(self) -> dict[str, float]:
        """The parts in GiB by name (``outside`` apart)."""
        return {f.name: gib(getattr(self, f.name)) for f in fields(self) if f.name != "outside"}


PARTS = tuple(f.name for f in fields(DeviceMemory) if f.name != "outside")
"""The parts of a device's memory, in the order ``predict`` prints them."""


def device_memory(c: Setup, costs: Costs, timeline: Timeline, microbatches: int, dp: int) -> tuple[DeviceMemory, ...]:
    """Per pipeline device, its memory by part under configuration ``c`` with ``dp`` replicas and ``microbatches``
    microbatches, from the simulated ``timeline`` on ``costs``."""
    assert costs.model is not None
    layers = costs.model.layers
    held = [sorted({i for a, b in ranges for i in range(a, b)}) for ranges in costs.device_layers()]
    pipelined = len(held) > 1
    outside = c.reserve if c.reserve is not None else outside_allocator((c.tp, c.cp, dp, c.pp, c.ep))
    found = []
    for d, indices in enumerate(held):
        static = held_static_parts([layers[i] for i in indices], pipelined)
        peak = timeline.peak_memory[d]
        logits = min(peak, _loss_bytes(layers[-1])) if len(layers) - 1 in indices else 0.0
        recomputed = [layers[i].mem_f for i in costs.recomputed if i in indices]
        recompute = min(peak - logits, max(recomputed, default=0))
        buffers = sum(_stage_buffers(c, layers, a, b, microbatches)
                      for (a, b), device in zip(costs.ranges, costs.devices) if device == d and len(costs.ranges) > 1)
        allocated = sum(static.values()) + peak + buffers
        kept = outside + (fragmentation(allocated, c.calibrated.scale("fragmentation")) if c.reserve is None else 0)
        found.append(DeviceMemory(static["weights"], static["gradients"], static["optimizer"],
                                  peak - logits - recompute, recompute, logits, buffers, kept, outside))
    return tuple(found)


def shortfalls(memory: Sequence[DeviceMemory], device_memory_bytes: int) -> tuple[float, ...]:
    """Per device, the GiB by which it needs more than ``device_memory_bytes`` (0 where it fits)."""
    return tuple(max(0.0, gib(m.total - device_memory_bytes)) for m in memory)


def _loss_bytes(head: Layer) -> float:
    """The head's loss: what its F keeps (fp32 log-probabilities and its input) and what its B holds beside."""
    return head.mem_f + (head.held_b or 0)


def _stage_buffers(c: Setup, layers: Sequence[Layer], a: int, b: int, microbatches: int) -> int:
    """The pipeline buffers of the stage of layers [a, b): what it receives, the gradient of what it sends, and on
    the last stage each microbatch's 16-bit logits (the loss's held fp32 gradients' elements)."""
    last = b == len(layers)
    copies = LOSS_GRAD_COPIES[c.runtime]
    logits = (layers[-1].held_b or 0) // (copies * FP32_BYTES) * DTYPE_BYTES[c.dtype] if copies else 0
    return pipeline_buffers(c.runtime, microbatches, layers[a - 1].out_bytes if a else 0,
                            0 if last else layers[b - 1].out_bytes, last, logits)
