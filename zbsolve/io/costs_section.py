"""The costs a schedule document records, read and written: the "partition" section (the model's layers, the stage
ranges, the recomputed and the selective blocks, Megatron's recomputed modules, the training setting the costs are
for), "device_memory" and
"reserve" (docs/schedule-format.md)."""

from __future__ import annotations

from zbsolve.base.checks import slack
from zbsolve.base.errors import InputError
from zbsolve.core.profile import Profile
from zbsolve.core.schedule import Schedule
from zbsolve.costmodel.model import OP_POLICY, Layer, Model
from zbsolve.problem.costs import Costs, device_static_bytes
from zbsolve.problem.partition import check_ranges
from zbsolve.problem.recompute import parse_recompute
from zbsolve.problem.recompute_costs import COSTS, HELD, stage_costs

LAYER_KEYS = ("name", "t_f", "t_b", "t_w", "mem_f", "mem_b", "mem_w", "static_bytes", "out_bytes", "block")
"""The keys of a layer in a schedule document's "partition" section ("block": one of the repeated blocks)."""
OPTIONAL_KEYS = ("t_sel", "mem_sel", "recompute_modules", "comm_f", "comm_b", "held_b")
"""The keys a layer's record has too where it has them: selective recomputation figures (zbsolve's and Megatron's
modules'), communication parts, what its B holds while it runs."""


def costs_section(costs: Costs) -> dict[str, object]:
    """The schedule document's keys for ``costs``: "partition" (for a model), "device_memory" and
    "reserve" (when given)."""
    doc: dict[str, object] = {}
    if costs.model is not None:
        doc["partition"] = {"model": costs.model.name,
                            "layers": [layer_record(layer) for layer in costs.model.layers],
                            "stages": [list(r) for r in costs.ranges],
                            **({"recompute": list(costs.recomputed)} if costs.recomputed else {}),
                            **({"selective": list(costs.selective)} if costs.selective else {}),
                            **({"modules": list(costs.modules)} if costs.modules else {}),
                            **({"setting": costs.model.setting.model_dump(exclude_none=True)}
                               if costs.model.setting is not None else {})}
    if costs.device_memory is not None:
        doc["device_memory"] = costs.device_memory
        doc["reserve"] = costs.reserve
    return doc


def layer_record(layer: Layer) -> dict[str, object]:
    """A layer as the schedule document records it."""
    record = layer.model_dump(include=set(LAYER_KEYS + OPTIONAL_KEYS), exclude_none=True)
    return {key: record[key] for key in LAYER_KEYS + OPTIONAL_KEYS if key in record}


def check_partition(section: object, profile: Profile, num_stages: int, where: str
                    ) -> tuple[Model, list[tuple[int, int]], frozenset[int], frozenset[int], tuple[str, ...]]:
    """The model (its layers and, where the section has one, its setting), stage ranges, recomputed and selective
    layers and Megatron's recomputed modules of a schedule document's "partition" section, checked (a block in both
    recomputed and selective, or modules with either, is an ``InputError``, a bad setting one naming its key): every
    stage's profile figures are the sums over its layers (``recompute_costs.stage_costs``). An ``InputError`` naming
    the stage and figure otherwise."""
    if not isinstance(section, dict) or not isinstance(section.get("layers"), list):
        raise InputError(f"{where}: partition must be a mapping with a list of layers and a list of stages")
    model = Model.parse({"name": str(section.get("model", "model")), "layers": section["layers"],
                         **({"setting": section["setting"]} if "setting" in section else {})}, f"{where}: partition")
    stages = section.get("stages")
    if not isinstance(stages, list):
        raise InputError(f"{where}: partition.stages = {stages!r} must be a list of [first, end) layer ranges")
    try:
        ranges = check_ranges(model, stages)
    except InputError as exc:
        raise InputError(f"{where}: partition.{exc}") from None
    if len(ranges) != num_stages:
        raise InputError(f"{where}: partition.stages has {len(ranges)} stages, the schedule {num_stages}")
    recomputed = check_recomputed(model, section.get("recompute", []), where)
    selective = check_recomputed(model, section.get("selective", []), where, "selective")
    if recomputed & selective:
        raise InputError(f"{where}: partition.selective names layer {min(recomputed & selective)}, which "
                         "partition.recompute recomputes whole")
    modules = check_modules(model, section.get("modules", []), where)
    if modules and (recomputed or selective):
        raise InputError(f"{where}: partition.modules = {list(modules)} with partition."
                         f"{'recompute' if recomputed else 'selective'}: Megatron recomputes modules or whole blocks, "
                         "not both")
    for s, (a, b) in enumerate(ranges):
        stage = stage_costs(model, a, b, recomputed, selective, modules)
        for name in COSTS:
            if getattr(profile, name) is None:  # a fused backward's peak, where the profile leaves it to held_in
                continue
            total, value = stage[name], profile.stage_value(name, s)
            if abs(total - value) > slack(total, value, floor=0.0):
                raise InputError(f"{where}: profile.{name}[{s}] = {value:g}, but its layers [{a}, {b}) "
                                 f"{'hold' if name in HELD else 'sum to'} {total:g}")
    return model, ranges, recomputed, selective, modules


def document_costs(data: dict, schedule: Schedule, where: str) -> Costs | None:
    """The costs a schedule document records ("partition", "device_memory", "reserve"), checked against its
    schedule (each stage's profile figures are the sums over its layers); None when it records none."""
    section, device_memory = data.get("partition"), data.get("device_memory")
    if section is None and device_memory is None:
        return None
    model, static = None, (0,) * schedule.num_devices
    ranges: tuple[tuple[int, int], ...] = ()
    recomputed: frozenset[int] = frozenset()
    selective: frozenset[int] = frozenset()
    modules: tuple[str, ...] = ()
    if section is not None:
        model, stage_ranges, recomputed, selective, modules = check_partition(section, schedule.profile,
                                                                              schedule.num_stages, where)
        ranges = tuple(stage_ranges)
        static = device_static_bytes(model.layers, stage_ranges, schedule.placement)
    memory = None
    if device_memory is not None:
        if isinstance(device_memory, bool) or not isinstance(device_memory, int) or device_memory <= 0:
            raise InputError(f"{where}: device_memory = {device_memory!r} must be a positive whole number of bytes")
        memory = device_memory
    reserve = data.get("reserve", 0)
    if isinstance(reserve, bool) or not isinstance(reserve, int) or reserve < 0:
        raise InputError(f"{where}: reserve = {reserve!r} must be a whole number of bytes >= 0")
    return Costs(model, ranges, memory, reserve, static, schedule.placement.routes[0] if model is not None else (),
                 tuple(sorted(recomputed)), tuple(sorted(selective)), modules)


def check_recomputed(model: Model, indices: object, where: str, key: str = "recompute") -> frozenset[int]:
    """A document's list of recomputed layers (``partition.recompute``, or ``partition.selective``: blocks with
    selective figures), checked: distinct indices of blocks of ``model``."""
    if not isinstance(indices, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in indices):
        raise InputError(f"{where}: partition.{key} = {indices!r} must be a list of layer indices")
    for i in indices:
        if not 0 <= i < len(model.layers) or not model.layers[i].block:
            raise InputError(f"{where}: partition.{key} names layer {i}, which is not a block of the model")
        if key == "selective" and model.layers[i].mem_sel is None:
            raise InputError(f"{where}: partition.selective names layer {i}, which has no t_sel and mem_sel")
    return frozenset(indices)


def check_modules(model: Model, names: object, where: str) -> tuple[str, ...]:
    """A document's list of Megatron's recomputed modules (``partition.modules``), checked as ``--recompute
    modules:...`` is (``problem.recompute``)."""
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise InputError(f"{where}: partition.modules = {names!r} must be a list of module names")
    if not names:
        return ()
    try:
        return parse_recompute(OP_POLICY if names == [OP_POLICY] else "modules:" + ",".join(names)).module_names(model)
    except InputError as exc:
        raise InputError(f"{where}: partition.modules: {exc}") from None
