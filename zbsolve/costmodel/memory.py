"""A layer's bytes under one setup: its activations (the paper's M_B and M_W, and what recomputation drops), its
static bytes of mixed-precision Adam after the ZeRO paper (sharded over the replicas by ZeRO 1 and 3, the experts'
over the replicas an expert-parallel group leaves) with FP8 weight copies, and what FSDP gathers as the runtime
gathers it (torchtitan: FP8 weights all-gathered in FP8, gradients held in FP32)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from zbsolve.core.profile import paper_deltas
from zbsolve.costmodel.layer_costs import LayerCosts


@dataclass(frozen=True)
class Memory:
    """What turns a layer's costs into bytes under one setup."""

    weight: int
    """Bytes of a parameter's 16-bit weight."""
    grad: int
    """Bytes of its gradient."""
    optimizer: int
    """Bytes of its optimizer states (fp32 master weight, momentum and variance)."""
    fp8_weight: int
    """Bytes an FP8 product's parameter adds (its FP8 copies; 0 without FP8)."""
    zero: int
    """ZeRO stage: 0, 1 or 3."""
    replicas: int
    """dp x cp: the ranks ZeRO shards over."""
    expert_shards: int
    """Ranks an expert's states are sharded over under ZeRO: tp x replicas / ep."""
    gathered_fp8: int = 2
    """Bytes a gathered parameter of an FP8 product holds under FSDP (``FP8_GATHER_BYTES`` under torchtitan's FP8
    all-gather, else the 16-bit weight's)."""
    gathered_grad: int = 2
    """Bytes of a gathered layer's gradient under FSDP (``FSDP_REDUCE_BYTES`` of the runtime)."""

    def static(self, params: int, shards: int) -> tuple[int, int, int]:
        """Static bytes of ``params`` parameters, sharded over ``shards`` ranks as the ZeRO stage shards them: their
        weights, gradients and optimizer states."""
        whole = shards if self.zero == 3 else 1
        return (math.ceil(params * self.weight / whole), math.ceil(params * self.grad / whole),
                math.ceil(params * self.optimizer / shards))

    def static_parts(self, c: LayerCosts) -> tuple[int, int, int]:
        """A layer's static bytes (its own parameters, its FP8 copies and its experts'): weights, gradients and
        optimizer states."""
        sharded = self.zero > 0
        own = self.static(c.params, self.replicas if sharded else 1)
        experts = self.static(c.expert_params, self.expert_shards if sharded else 1) if c.expert_params else (0, 0, 0)
        fp8 = math.ceil(self.fp8_weight * c.fp8_params / (self.replicas if self.zero == 3 else 1))
        return own[0] + experts[0] + fp8, own[1] + experts[1], own[2] + experts[2]

    def static_bytes(self, c: LayerCosts) -> int:
        """A layer's static bytes: the sum of its ``static_parts``."""
        return sum(self.static_parts(c))

    def gathered_bytes(self, c: LayerCosts) -> int | None:
        """Under FSDP the bytes a layer's passes hold unsharded (``Layer.gathered_bytes``): its weights (those of
        FP8 products at ``gathered_fp8`` bytes) and its gradient; else None."""
        if self.zero != 3:
            return None
        params = c.params + c.expert_params
        return params * (self.weight + self.gathered_grad) - c.fp8_params * (self.weight - self.gathered_fp8)

    def gathered_grad_bytes(self, c: LayerCosts) -> int | None:
        """Under FSDP the gradient's part of ``gathered_bytes`` (``Layer.gathered_grad_bytes``), else None."""
        return (c.params + c.expert_params) * self.gathered_grad if self.zero == 3 else None

    @staticmethod
    def activations(c: LayerCosts) -> tuple[int, int, int]:
        """A layer's activation deltas (``mem_f``, ``mem_b``, ``mem_w``) from its M_B and M_W."""
        return paper_deltas(max(c.m_b, c.m_w), c.m_w)

    @staticmethod
    def dropped(c: LayerCosts, saved: int) -> int:
        """Bytes F keeps no more when it drops ``saved`` of them, at most what it keeps."""
        return min(saved, max(c.m_b, c.m_w))
