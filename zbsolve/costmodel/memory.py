"""A layer's bytes under one setup: its activations (the paper's M_B and M_W, and what recomputation drops), its
static bytes of mixed-precision Adam after the ZeRO paper (sharded over the replicas by ZeRO 1 and 3, the experts'
over the replicas an expert-parallel group leaves) with FP8 weight copies, and what FSDP gathers."""

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

    def static(self, params: int, shards: int) -> int:
        """Static bytes of ``params`` parameters, sharded over ``shards`` ranks as the ZeRO stage shards them."""
        if self.zero == 3:
            return math.ceil(params * (self.weight + self.grad + self.optimizer) / shards)
        return params * (self.weight + self.grad) + math.ceil(params * self.optimizer / shards)

    def static_bytes(self, c: LayerCosts) -> int:
        """A layer's static bytes: its own parameters, its FP8 copies and its experts'."""
        sharded = self.zero > 0
        return (self.static(c.params, self.replicas if sharded else 1)
                + math.ceil(self.fp8_weight * c.fp8_params / (self.replicas if self.zero == 3 else 1))
                + (self.static(c.expert_params, self.expert_shards if sharded else 1) if c.expert_params else 0))

    def gathered_bytes(self, c: LayerCosts) -> int | None:
        """Under FSDP the bytes a layer's passes hold unsharded (``Layer.gathered_bytes``), else None."""
        return (c.params + c.expert_params) * (self.weight + self.grad) if self.zero == 3 else None

    @staticmethod
    def activations(c: LayerCosts) -> tuple[int, int, int]:
        """A layer's activation deltas (``mem_f``, ``mem_b``, ``mem_w``) from its M_B and M_W."""
        return paper_deltas(max(c.m_b, c.m_w), c.m_w)

    @staticmethod
    def dropped(c: LayerCosts, saved: int) -> int:
        """Bytes F keeps no more when it drops ``saved`` of them, at most what it keeps."""
        return min(saved, max(c.m_b, c.m_w))
