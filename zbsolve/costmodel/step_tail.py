"""What a device's step runs after its last pass (its tail, ``core.objective``): the gradients' data-parallel
synchronisation left exposed and the optimizer step, from the parameters the device holds and ``Model.step``.

Collectives are NCCL's ring algorithms over the data-parallel group's link (``Link.collective``). The optimizer is
Adam, memory-bound: a parameter of the device's shard reads and writes its fp32 states and reads its gradient and
writes its weight (``OPTIMIZER_STEP_BYTES``), at the step's HBM bandwidth. What each runtime overlaps:

- zero 0 (DDP) all-reduces the gradients, zero 1 (Megatron's distributed optimizer, ZeRO-1) reduce-scatters
  them, updates its 1/dp shard and all-gathers the parameters, zero 3 (FSDP) reduce-scatters them and gathers
  the parameters before each layer's passes (the estimate times those inside the passes, each overlapped with the
  layer before it; the tail keeps what follows the last pass and the first gather, which nothing precedes);
- with ``overlap_grad_reduce`` (and always under FSDP) each bucket is reduced once its gradients are ready, during
  the backward: only the last bucket's reduction follows the last pass (``bucket_params`` parameters, or the
  device's own where fewer);
- with ``overlap_param_gather`` (and always under FSDP) the all-gather runs during the next step's forward, each
  bucket before its first use: only the first bucket's is exposed;
- the optimizer step runs after the reduction and overlaps nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from zbsolve.core.placement import Placement
from zbsolve.costmodel.constants import GRAD_BYTES, OPTIMIZER_STEP_BYTES, WEIGHT_BYTES
from zbsolve.costmodel.model import Model, StepEnd


@dataclass(frozen=True)
class Tail:
    """Seconds a device's step runs after its last pass, by what runs then."""

    sync: float
    """Data-parallel synchronisation left exposed: gradient reduction and parameter all-gather."""
    optimizer: float
    """The optimizer step over the device's shard of its parameters."""

    @property
    def seconds(self) -> float:
        """The whole tail."""
        return self.sync + self.optimizer


def device_tail(params: int, step: StepEnd) -> Tail:
    """The tail of a device holding ``params`` parameters (``Layer.params``) under ``step``."""
    dp, fsdp = step.dp, step.zero == 3
    bucket = min(params, step.bucket_params)
    reduced = bucket if step.overlap_grad_reduce or fsdp else params
    sync = step.link.collective(reduced * GRAD_BYTES, dp, 1 if step.zero else 2)
    if step.zero:
        gathered = bucket if step.overlap_param_gather or fsdp else params
        sync += step.link.collective(gathered * WEIGHT_BYTES, dp)
    shard = params / dp if step.zero else params
    return Tail(sync, shard * OPTIMIZER_STEP_BYTES / step.hbm_bytes_per_s)


def device_params(model: Model, ranges: Sequence[Sequence[int]], placement: Placement) -> tuple[int, ...]:
    """Per device, the parameters of the layers of every stage it holds on any route (``Layer.params``, 0 where
    unknown), a layer held twice or a weight shared by two layers it holds counted once."""
    held: list[set[int]] = [set() for _ in range(placement.num_devices)]
    for route in placement.routes:
        for s, d in enumerate(route):
            held[d].update(range(*ranges[s]))
    out = []
    for indices in held:
        layers = [model.layers[i] for i in sorted(indices)]
        names = {layer.name for layer in layers}
        out.append(sum(layer.params or 0 for layer in layers if layer.shares not in names))
    return tuple(out)


def stage_tails(model: Model, ranges: Sequence[Sequence[int]], placement: Placement) -> list[float] | None:
    """Per stage, its share of its devices' tails (``Profile.t_tail``), in proportion to its layers' parameters,
    so that a device's stages, each once over every route, sum to its tail (a stage two devices hold, as under
    DualPipe, carries the mean of its shares of their tails, exact where the two hold equal tails); None where the
    model has no ``step``."""
    if model.step is None:
        return None
    held: list[set[int]] = [set() for _ in range(placement.num_devices)]
    for route in placement.routes:
        for s, d in enumerate(route):
            held[d].add(s)
    params = device_params(model, ranges, placement)
    own = [sum(layer.params or 0 for layer in model.layers[a:b]) for a, b in ranges]
    devices = [sum(own[s] for s in stages) for stages in held]
    tails = [device_tail(n, model.step).seconds for n in params]
    holders = [[d for d in range(placement.num_devices) if s in held[d]] for s in range(len(ranges))]
    return [sum(tails[d] * own[s] / devices[d] for d in ds if devices[d]) / len(ds) if ds else 0.0
            for s, ds in enumerate(holders)]
