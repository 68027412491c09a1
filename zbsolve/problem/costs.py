"""Where a problem's costs come from: a model cut into stages, and the device memory around the activations.

A model (``zbsolve.costmodel.model``) and a partition give the per-stage profile; each device's activation budget is its
memory minus the static bytes (weights, gradients, optimizer states) of the stages it holds minus a reserve.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from zbsolve.base.checks import exceeds
from zbsolve.base.errors import InfeasibleError, MemoryLimitError
from zbsolve.base.units import gib
from zbsolve.core.placement import Placement
from zbsolve.core.profile import Profile
from zbsolve.core.simulator import Timeline
from zbsolve.costmodel.constants import DEFAULT_RESERVE
from zbsolve.costmodel.gpus import GPUS, device_memory
from zbsolve.costmodel.model import Layer, Model
from zbsolve.costmodel.step_tail import stage_tails
from zbsolve.problem.partition import held_static_bytes, module_names, partition, stage_profile
from zbsolve.problem.recompute import NONE, Recompute


@dataclass(frozen=True)
class Costs:
    """What a problem's profile stands for in real units: the model and its partition, and the device memory."""

    model: Model | None
    """The model the profile sums, or None for a bare profile."""
    ranges: tuple[tuple[int, int], ...]
    """Half-open layer ranges of the model per stage, in stage order (empty for a bare profile)."""
    device_memory: int | None
    """Bytes of memory per device, or None when the memory limit is given in the profile's own unit."""
    reserve: int
    """Bytes of each device that no stage may use."""
    static_bytes: tuple[int, ...]
    """Per device, the bytes its stages hold for the whole step (0 for a bare profile)."""
    devices: tuple[int, ...] = ()
    """The device of each stage in ``ranges``."""
    recomputed: tuple[int, ...] = ()
    """The layers that run their forward again inside their B (``problem.recompute``), in order."""
    selective: tuple[int, ...] = ()
    """The blocks whose norms and MLP activation function run again inside their B, in order."""
    modules: tuple[str, ...] = ()
    """Megatron-LM's modules every other block runs again inside its B (``problem.recompute``)."""

    @property
    def in_bytes(self) -> bool:
        """Whether the profile's memory is in bytes (a model's, or a bare profile given a device memory)."""
        return self.model is not None or self.device_memory is not None

    def limits(self) -> tuple[float, ...]:
        """Per device, its activation budget: device memory - static bytes - reserve; an ``InfeasibleError``
        naming the first device whose static bytes alone do not fit, and the shortfall in GiB."""
        for d, budget in enumerate(self.budgets()):
            if budget <= 0:
                raise InfeasibleError(self.shortfall(d, {"static": self.static_bytes[d]}))
        return tuple(float(budget) for budget in self.budgets())

    def budgets(self) -> list[int]:
        """Per device, the bytes left for activations: device memory - static bytes - reserve (none may be left)."""
        assert self.device_memory is not None
        return [self.device_memory - static - self.reserve for static in self.static_bytes]

    def first_over(self, peaks: Sequence[float]) -> int | None:
        """The first device whose peak activations exceed its activation budget (``limits``) by the memory rule's
        tolerance, or None: the one test of whether a schedule fits the device memory."""
        return next((d for d, (peak, budget) in enumerate(zip(peaks, self.budgets())) if exceeds(peak, budget)), None)

    def over(self, uses: dict[str, float]) -> float:
        """Bytes by which ``uses`` (bytes by name) and the reserve exceed the device memory (at most 0: they fit)."""
        assert self.device_memory is not None
        return sum(uses.values()) + self.reserve - self.device_memory

    def shortfall(self, device: int, uses: dict[str, float]) -> str:
        """The line saying that ``device``'s ``uses`` (bytes by name) and the reserve exceed the device memory."""
        assert self.device_memory is not None
        terms = {**uses, "reserve": self.reserve}
        over = self.over(uses)
        spent = " + ".join(f"{name} {gib(value):.2f} GiB" for name, value in terms.items())
        return (f"device {device} does not fit: {spent} exceed device_memory {gib(self.device_memory):.2f} GiB by "
                f"{gib(over):.2f} GiB")

    def used(self, peaks: Sequence[float]) -> tuple[float, ...]:
        """Per device, the bytes it uses: its static bytes and its peak activations (``peaks``), the reserve apart."""
        return tuple(static + peak for static, peak in zip(self.static_bytes, peaks))

    def needed(self, peaks: Sequence[float]) -> tuple[float, ...]:
        """Per device, the device memory it needs: what it uses (``used``) and the reserve; a schedule fits
        (``first_over``) when none needs more than the device memory."""
        return tuple(used + self.reserve for used in self.used(peaks))

    def device_layers(self) -> list[list[tuple[int, int]]]:
        """Per device, the layer ranges of the stages it holds, in stage order (empty lists for a bare profile)."""
        held: list[list[tuple[int, int]]] = [[] for _ in self.static_bytes]
        for stage_range, d in zip(self.ranges, self.devices):
            held[d].append(stage_range)
        return held

    def stage_names(self) -> list[str]:
        """Per stage, the model's names of its layers (``model.module_names``; empty for a bare profile)."""
        return [] if self.model is None else [module_names(self.model, [stage_range]) for stage_range in self.ranges]

    def device_names(self) -> list[str]:
        """Per device, the model's names of the layers it holds (``model.module_names``), or "-" for a bare
        profile."""
        if self.model is None:
            return ["-"] * len(self.static_bytes)
        return [module_names(self.model, held) for held in self.device_layers()]

def model_costs(model: Model, placement: Placement, partition_spec: str | Sequence[int] = "uniform",
                device_memory: int | None = None, reserve: int = DEFAULT_RESERVE,
                recompute: Recompute = NONE) -> tuple[Profile, Costs]:
    """The per-stage profile of ``model`` cut into ``placement``'s stages by ``partition_spec`` ("uniform",
    "balanced" or layer counts per stage), its blocks recomputing as ``recompute`` says, and its costs: each device's
    static bytes over the layers of every stage it holds (a weight two of them share counted once); each stage's
    share of its device's tail where the model says how its step ends (``step_tail.stage_tails``); ``device_memory``
    and ``reserve`` in bytes (``Request`` reads them)."""
    ranges = partition(model, placement.num_stages, partition_spec)
    static = device_static_bytes(model.layers, ranges, placement)
    recomputed, selective = recompute.layers(model, ranges), recompute.selected(model, ranges)
    modules = recompute.module_names(model)
    profile = stage_profile(model, ranges, recomputed, selective, modules)
    tails = stage_tails(model, ranges, placement)
    return (profile if tails is None else profile.model_copy(update={"t_tail": tails}),
            Costs(model, tuple(ranges), device_memory, reserve, static, placement.routes[0], tuple(sorted(recomputed)),
                  tuple(sorted(selective)), modules))


def profile_costs(num_devices: int, device_memory: int | None = None, reserve: int = DEFAULT_RESERVE) -> Costs:
    """The costs of a bare profile: no static bytes, and the device memory (when given) in bytes."""
    return Costs(None, (), device_memory, reserve, (0,) * num_devices)


def device_static_bytes(layers: Sequence[Layer], ranges: Sequence[Sequence[int]],
                        placement: Placement) -> tuple[int, ...]:
    """Per device, the static bytes of the layers of every stage it holds on any route, a layer held twice or a
    weight shared by two layers it holds counted once, under FSDP every layer's gathered bytes where the pipeline
    has several devices (``held_static_bytes``)."""
    held: list[set[int]] = [set() for _ in range(placement.num_devices)]
    for route in placement.routes:
        for s, d in enumerate(route):
            held[d].update(range(*ranges[s]))
    pipelined = placement.num_devices > 1
    return tuple(held_static_bytes([layers[i] for i in sorted(indices)], pipelined) for indices in held)


def check_fits(costs: Costs, timeline: Timeline) -> None:
    """A ``MemoryLimitError`` naming the first device whose static bytes, peak activations and reserve exceed the
    device memory, and by how many GiB."""
    if costs.device_memory is None:
        return
    d = costs.first_over(timeline.peak_memory)
    if d is not None:
        raise MemoryLimitError(costs.shortfall(d, {"static": costs.static_bytes[d],
                                                   "peak activations": timeline.peak_memory[d]}))


def memory_figures(costs: Costs, timeline: Timeline) -> dict[str, object]:
    """Memory per device in GiB: static bytes, peak activations, their sum, and the device memory when given; for a
    model, the names of the layers each stage and each device holds first ("stage_layers", "device_layers")."""
    peak = timeline.peak_memory
    figures: dict[str, object] = ({"stage_layers": costs.stage_names(), "device_layers": costs.device_names()}
                                  if costs.model is not None else {})
    figures |= {"static_gib": [gib(b) for b in costs.static_bytes], "activation_gib": [gib(b) for b in peak],
                "memory_gib": [gib(b) for b in costs.used(peak)]}
    if costs.device_memory is not None:
        figures["device_memory_gib"] = gib(costs.device_memory)
    return figures


def default_device_memory(model: Model) -> int | None:
    """The memory of the GPU preset the model's costs are for (``device_memory``), or None when it names none."""
    gpu = model.setting.gpu if model.setting is not None else None
    return device_memory(gpu if gpu in GPUS else None)
