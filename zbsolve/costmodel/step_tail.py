"""What a device's step runs after its last pass (its tail, ``core.objective``): the gradients' data-parallel
synchronisation left exposed and the optimizer step, from the parameters the device holds and ``Model.step``.

Collectives are NCCL's ring algorithms over the data-parallel group's link (``Link.collective``), one a bucket
(``bucketed``), each with its latency. The optimizer is
Adam, memory-bound: a parameter of the device's shard reads and writes its fp32 states and reads its gradient and
writes its weight (``OPTIMIZER_STEP_BYTES``), at the step's HBM bandwidth. What each runtime overlaps:

- zero 0 (DDP) all-reduces the gradients, zero 1 (Megatron's distributed optimizer, ZeRO-1) reduce-scatters
  them, updates its 1/dp shard and all-gathers the parameters, zero 3 (FSDP) reduce-scatters them and gathers
  the parameters before each layer's passes (the estimate times those inside the passes, each overlapped with the
  layer before it; the tail keeps what follows the last pass and the first gather, which nothing precedes);
- with ``overlap_grad_reduce`` each bucket is reduced once its gradients are ready, during the backward of the
  step's last microbatch (the runtimes synchronise on it alone): the reduction hides behind the backward still to
  run, the device's one-microbatch backward (``Window``), and what of it outlasts that work shows after the last
  pass, at least the last bucket's (``bucket_params`` parameters, or the device's own where fewer): ``exposed``;
  while they overlap, the reduction runs slower and the backward loses time (``StepEnd.interference``), which the
  tail counts apart (``Tail.slowed``);
- with ``overlap_param_gather`` the all-gather runs during the next step's forward, each bucket before its first
  use: it hides behind the device's one-microbatch forward, what outlasts it shown, at least the first bucket's;
- under FSDP the passes themselves hide each layer's transfers (``costmodel.time``): the tail keeps the last
  bucket's reduction and the first gather;
- the optimizer step runs after the reduction and overlaps nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from zbsolve.core.placement import Placement
from zbsolve.costmodel.constants import GRAD_BYTES, OPTIMIZER_STEP_BYTES, WEIGHT_BYTES
from zbsolve.costmodel.model import NO_INTERFERENCE, Interference, Layer, Link, Model, StepEnd


class Window(NamedTuple):
    """Seconds of work a device runs beside its overlapped data-parallel transfers: one microbatch's passes over
    the layers it holds."""

    forward: float
    """The forward (F) the parameter all-gather hides behind."""
    backward: float
    """The backward (B and W) the gradient reduction hides behind."""


NO_WINDOW = Window(0.0, 0.0)
"""No work beside the transfers: all of each shows."""


@dataclass(frozen=True)
class Tail:
    """Seconds a device's step runs after its last pass, by what runs then."""

    sync: float
    """Data-parallel synchronisation left exposed: gradient reduction and parameter all-gather."""
    optimizer: float
    """The optimizer step over the device's shard of its parameters."""
    slowed: float = 0.0
    """What the passes beside the overlapped synchronisation lose to it (``Interference.compute``)."""

    @property
    def seconds(self) -> float:
        """The whole tail."""
        return self.sync + self.slowed + self.optimizer

    @property
    def unslowed(self) -> float:
        """The tail less what the passes lose (``slowed``): over devices, at least that of one holding them all."""
        return self.sync + self.optimizer


def exposed(total: float, last: float, window: float) -> float:
    """Seconds an overlapped transfer of ``total`` seconds, sent bucket by bucket as the work beside it makes them
    ready, shows past ``window`` seconds of that work: what the whole outlasts the work, and at least the bucket
    ready when it ends (``last`` seconds)."""
    return max(last, total - window)


def beside(total: float, last: float, window: float, interference: Interference) -> tuple[float, float]:
    """(shown, slowed): what an overlapped transfer of ``total`` seconds alone shows past ``window`` seconds of
    work (``exposed``), slowed as a collective beside computation, and what the work loses while they overlap."""
    slow = total * (1 + interference.collective)
    return exposed(slow, last, window), interference.compute * min(window, slow)


def bucketed(link: Link, params: int, bucket: int, element: int, dp: int, factor: int = 1) -> float:
    """Seconds of a collective over ``dp`` ranks of ``params`` parameters of ``element`` bytes, sent bucket by bucket
    (``bucket`` parameters each, the last what is left), each bucket its own collective with its own latency
    (``Link.collective``)."""
    full, rest = divmod(params, bucket) if bucket else (0, params)
    return full * link.collective(bucket * element, dp, factor) + link.collective(rest * element, dp, factor)


def device_tail(params: int, step: StepEnd, window: Window = NO_WINDOW) -> Tail:
    """The tail of a device holding ``params`` parameters (``Layer.params``) under ``step``, its overlapped
    transfers hidden by the work of ``window`` (``exposed``; FSDP's by its passes)."""
    dp, fsdp, link = step.dp, step.zero == 3, step.link
    interference = step.interference or NO_INTERFERENCE
    bucket = min(params, step.bucket_params)
    factor = 1 if step.zero else 2
    parts = [(bucketed(link, params, bucket, GRAD_BYTES, dp, factor),
              link.collective(bucket * GRAD_BYTES, dp, factor), step.overlap_grad_reduce, window.backward)]
    if step.zero:
        parts.append((bucketed(link, params, bucket, WEIGHT_BYTES, dp), link.collective(bucket * WEIGHT_BYTES, dp),
                      step.overlap_param_gather, window.forward))
    sync = slowed = 0.0
    for whole, one, overlap, work in parts:
        shown, lost = (one, 0.0) if fsdp else beside(whole, one, work, interference) if overlap else (whole, 0.0)
        sync, slowed = sync + shown, slowed + lost
    shard = params / dp if step.zero else params
    return Tail(sync, shard * OPTIMIZER_STEP_BYTES / step.hbm_bytes_per_s, slowed)


def window(layers: Sequence[Layer]) -> Window:
    """The work of one microbatch over ``layers``."""
    return Window(sum(layer.t_f for layer in layers), sum(layer.t_b + layer.t_w for layer in layers))


def held_layers(model: Model, ranges: Sequence[Sequence[int]], placement: Placement) -> list[list[Layer]]:
    """Per device, the layers of every stage it holds on any route, each once, in order."""
    held: list[set[int]] = [set() for _ in range(placement.num_devices)]
    for route in placement.routes:
        for s, d in enumerate(route):
            held[d].update(range(*ranges[s]))
    return [[model.layers[i] for i in sorted(indices)] for indices in held]


def device_tails(model: Model, ranges: Sequence[Sequence[int]], placement: Placement) -> tuple[Tail, ...]:
    """Per device, its tail: its parameters (``device_params``) under ``model.step``, its transfers hidden by one
    microbatch's work over the layers it holds; an empty tail each where the model has no ``step``."""
    if model.step is None:
        return tuple(Tail(0.0, 0.0) for _ in range(placement.num_devices))
    params = device_params(model, ranges, placement)
    return tuple(device_tail(n, model.step, window(layers))
                 for n, layers in zip(params, held_layers(model, ranges, placement)))


def device_params(model: Model, ranges: Sequence[Sequence[int]], placement: Placement) -> tuple[int, ...]:
    """Per device, the parameters of the layers of every stage it holds on any route (``Layer.params``, 0 where
    unknown), a layer held twice or a weight shared by two layers it holds counted once."""
    out = []
    for layers in held_layers(model, ranges, placement):
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
    own = [sum(layer.params or 0 for layer in model.layers[a:b]) for a, b in ranges]
    devices = [sum(own[s] for s in stages) for stages in held]
    tails = [tail.seconds for tail in device_tails(model, ranges, placement)]
    holders = [[d for d in range(placement.num_devices) if s in held[d]] for s in range(len(ranges))]
    return [sum(tails[d] * own[s] / devices[d] for d in ds if devices[d]) / len(ds) if ds else 0.0
            for s, ds in enumerate(holders)]
