"""The busiest device of an expert-parallel group (``docs/cost-model.md``, "Mixture of experts"): the all-to-all
waits for it, so the routed experts' products are timed on its load, not the mean.

Routing balanced in expectation is still a draw: each of the group's token copies lands on one of its ``ep``
devices with probability 1/ep (megatron-core's ``moe_router_force_load_balancing`` draws random router logits for
exactly this), so a device receives a binomial count of mean c (its own copies, ``tokens·top_k``) and variance
c·(1 - 1/ep). The busiest of the ``ep`` devices is taken at the expected maximum of ``ep`` Gaussian draws by Blom's
formula (1958), μ + σ·Φ⁻¹((ep - 0.375) / (ep + 0.25)). A learned router's imbalance beyond that draw is not stated
here: this is the least a step waits.
"""

from __future__ import annotations

import math
from statistics import NormalDist

from zbsolve.costmodel.constants import ROUTING_DRAW


def busiest(copies: int, ep: int) -> int:
    """Token copies the busiest of ``ep`` devices receives where each receives ``copies`` in expectation."""
    if ep <= 1 or copies <= 0:
        return copies
    sigma = math.sqrt(ROUTING_DRAW * copies * (1 - 1 / ep))
    return math.ceil(copies + sigma * NormalDist().inv_cdf((ep - 0.375) / (ep + 0.25)))
