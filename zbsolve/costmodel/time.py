"""A layer's seconds under one setup: each pass's kernels under the kernel model (or, with an explicit efficiency,
FLOPs and memory traffic at that share of the peaks), its tensor-parallel collectives and expert all-to-alls
(``costmodel.communication``), the ring's exposed exchange, and under FSDP what of the parameters' all-gather or
the gradients' reduce-scatter outlasts the pass."""

from __future__ import annotations

from dataclasses import dataclass

from zbsolve.costmodel.communication import collectives
from zbsolve.costmodel.constants import KERNEL_GAP, KERNEL_LAUNCH
from zbsolve.costmodel.gpus import Gpu
from zbsolve.costmodel.layer_costs import LayerCosts
from zbsolve.costmodel.model import Link


@dataclass(frozen=True)
class Timing:
    """What turns a layer's costs into seconds under one setup."""

    device: Gpu
    """The GPU's figures."""
    efficiency: float | None
    """Share of the peaks FLOPs and traffic run at (None: the kernel model)."""
    collective: float
    """Seconds of one tensor-parallel collective (``communication.tp_collective``)."""
    exchange: float
    """Seconds of one expert dispatch or combine (``communication.expert_exchange``)."""
    tp_comm_overlap: bool
    """Whether the tensor-parallel collectives hide behind the products beside them."""
    fsdp: Link | None
    """Under FSDP (ZeRO 3) the data-parallel group's link, else None."""
    replicas: int
    """Ranks the FSDP transfers span."""
    moved: tuple[int, int]
    """Bytes a parameter's FSDP all-gather (F, B) and reduce-scatter (W) move."""
    launch: float = 1.0
    """The calibration's multiplier of each kernel's launch and gap (``calibration.TERMS["launch"]``)."""

    @property
    def memory_rate(self) -> float:
        """Bytes/s a memory-bound kernel streams."""
        device = self.device
        return device.hbm_bytes_per_s * (device.memory_fraction if self.efficiency is None else self.efficiency)

    def seconds(self, c: LayerCosts, p: int) -> float:
        """Seconds of pass ``p``'s kernels, collectives and all-to-alls. Under the kernel model the kernels take a
        gap after each (``KERNEL_GAP``) and no less than the host takes to launch them (``KERNEL_LAUNCH``), both times
        ``launch``."""
        launched = c.launches[p] * self.launch
        compute = (max(c.kernel[p] + launched * KERNEL_GAP, launched * KERNEL_LAUNCH) if self.efficiency is None else
                   c.flops[p] / (self.device.flops * self.efficiency) + c.traffic[p] / self.memory_rate)
        return compute + collectives(c, p, self.collective, self.tp_comm_overlap, self.device.interference) + (
            c.all_to_all[p] * self.exchange if c.all_to_all else 0.0)

    def pass_time(self, c: LayerCosts, p: int) -> float:
        """Seconds of pass ``p``: its kernels and collectives, the ring's exposed exchange, and under FSDP the pass
        beside its parameters' all-gather (F, B) or its gradients' reduce-scatter (W), the two slowing each other
        (``Interference.overlapped``)."""
        t = self.seconds(c, p) + (c.ring[p] if p < 2 else 0.0)
        if self.fsdp is None:
            return t
        moved = (c.params + c.expert_params) * self.moved[p == 2]
        return self.device.interference.overlapped(t, self.fsdp.collective(moved, self.replicas))

    def comm(self, c: LayerCosts) -> tuple[float, float] | tuple[None, None]:
        """The seconds of F and B that are expert all-to-all (``Layer.comm_f``, ``comm_b``), where it has any."""
        if c.all_to_all is None:
            return None, None
        return c.all_to_all[0] * self.exchange, c.all_to_all[1] * self.exchange
