"""The one request: what every entry point (the CLI, the grid, ``solve``, ``plan``, ``frontier``) builds once from
what a user gives, and hands down whole. Each field is checked here, once; ``resolve`` turns a request and a
profile or model into the core's ``Spec``, the memory resolved once into per-device budgets."""

from __future__ import annotations

from typing import Any, Literal, Optional, Union, get_args

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from zbsolve.base.checks import check_count, check_limit, check_positive
from zbsolve.base.errors import InputError
from zbsolve.base.units import gib, parse_bytes
from zbsolve.core.objective import check_objective
from zbsolve.core.placement import CHUNKS, SUPPORTED_PLACEMENTS, check_placement, make_placement
from zbsolve.core.profile import Profile
from zbsolve.core.spec import Spec, make_spec
from zbsolve.costmodel.model import Model
from zbsolve.problem.costs import DEFAULT_RESERVE, Costs, default_device_memory, model_costs, profile_costs
from zbsolve.problem.memory_factor import factor_limit
from zbsolve.problem.recompute import parse_recompute

SolverName = Literal["cpsat", "cbc", "heuristic"]
"""A backend by name, or "heuristic" for the warm start alone."""
SOLVERS: tuple[str, ...] = get_args(SolverName)
TIME_LIMIT = 60.0
"""Seconds a solve may take unless told."""
PLAN_TIME_LIMIT = 120.0
"""Seconds a whole plan may take unless told."""
FRONTIER_TIME_LIMIT = 30.0
"""Seconds each solve of a frontier may take unless told."""
DEFAULT_PLACEMENTS = ("sequential", "vshape")
"""Placements a frontier solves when none are given."""


class Request(BaseModel):
    """One request for a schedule, a plan or a frontier; a bad field is an ``InputError`` naming it and its value."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    num_microbatches: int
    """Microbatches m."""
    num_devices: Optional[int] = None
    """Devices p (None: one per stage of the profile)."""
    placement: str = "sequential"
    """sequential, interleaved or vshape; a plan also takes auto."""
    chunks: int = CHUNKS
    """Stages per device of the interleaved and V-shape placements."""
    mem_limit: Union[float, tuple[float, ...], None] = None
    """Activation memory limit in the profile's unit: one number, one per device, or None for none."""
    mem_factor: Optional[float] = None
    """The limit as a multiple of 1F1B's peak activation memory."""
    device_memory: Optional[int] = None
    """Bytes of memory per device: a device's activation budget is this less its static bytes and the reserve."""
    reserve: int = DEFAULT_RESERVE
    """Bytes of each device kept free of stages and activations."""
    partition: Union[str, tuple[int, ...]] = "uniform"
    """How a model is cut into stages: "uniform", "balanced" or layer counts per stage."""
    recompute: str = "none"
    """Which of a model's blocks recompute in their B, whole or selectively: ``problem.recompute.RECOMPUTE_FORMS``."""
    pairs: bool = True
    """Whether F and B may run as overlapped pairs where passes communicate (False for a runtime that does not
    overlap a pair's passes, its ``Target.pairs``)."""
    periodic: bool = True
    """Whether the warm start searches the periodic pattern (False for the planner's candidates, which the search
    times by the heuristic alone, many of them: its finalists' solves search it)."""
    objective: str = "makespan"
    """makespan (the step time with an optimizer barrier) or span (the longest per-device span)."""
    solver: str = "cpsat"
    """cpsat, cbc, or heuristic for the warm start alone."""
    time_limit: float = TIME_LIMIT
    """Seconds the whole solve (or plan) may take."""
    workers: Optional[int] = None
    """Solver threads (None: every core)."""
    seed: int = 0
    """Solver seed."""

    def __init__(self, /, **given: Any) -> None:
        try:
            super().__init__(**given)
        except ValidationError as exc:
            cause = exc.errors()[0].get("ctx", {}).get("error")
            raise (cause if isinstance(cause, InputError) else InputError(str(exc).splitlines()[0])) from None

    @model_validator(mode="before")
    @classmethod
    def _checked(cls, given: dict[str, Any]) -> dict[str, Any]:
        """Each field's one rule, in the order a user reads them."""
        out = dict(given)
        out["num_microbatches"] = check_count("num_microbatches", given.get("num_microbatches"))
        if given.get("num_devices") is not None:
            out["num_devices"] = check_count("num_devices", given["num_devices"])
        if "chunks" in given:
            out["chunks"] = check_count("chunks", given["chunks"])
        out["mem_limit"] = check_limit(given.get("mem_limit"))
        factor = given.get("mem_factor")
        if factor is not None:
            if out["mem_limit"] is not None:
                raise InputError("give mem_limit or mem_factor, not both")
            check_positive("mem_factor", factor, "> 0")
        out.update(_memory(given))
        if out["device_memory"] is not None and (out["mem_limit"] is not None or factor is not None):
            raise InputError(f"give {'mem_limit' if factor is None else 'mem_factor'} or device_memory, not both")
        if isinstance(given.get("partition"), list):
            out["partition"] = tuple(given["partition"])
        if "recompute" in given:
            out["recompute"] = str(parse_recompute(given["recompute"]))
        _check_search(given)
        return out


def _memory(given: dict[str, Any]) -> dict[str, Any]:
    """The device memory (None when not given) and the reserve (0 allowed) in bytes; a reserve that leaves nothing
    of the device memory is an ``InputError``."""
    device_memory, reserve = given.get("device_memory"), given.get("reserve", DEFAULT_RESERVE)
    memory = None if device_memory is None else parse_bytes(device_memory, "device_memory")
    spare = parse_bytes(reserve, "reserve", zero=True)
    if memory is not None and spare >= memory:
        raise InputError(f"reserve = {reserve!r} ({gib(spare):.2f} GiB) leaves nothing of device_memory = "
                         f"{device_memory!r} ({gib(memory):.2f} GiB): give a reserve below the device memory")
    return {"device_memory": memory, "reserve": spare}


def _check_search(given: dict[str, Any]) -> None:
    """The search's fields: solver, objective, time limit and workers."""
    solver, objective = given.get("solver", "cpsat"), given.get("objective", "makespan")
    if solver not in SOLVERS:
        raise InputError(f"solver = {solver!r} is unknown; choose one of {', '.join(SOLVERS)}")
    check_objective(objective)
    check_positive("time_limit", given.get("time_limit", TIME_LIMIT), "a positive number of seconds")
    if given.get("workers") is not None:
        check_count("workers", given["workers"])


def resolve(profile: Profile | Model, request: Request) -> tuple[Spec, Costs]:
    """The request's problem in the core's terms: the per-stage profile (a model cut into the placement's stages by
    the request's partition, its GPU's memory the device memory unless a limit is given) and its costs, the memory
    resolved once into per-device budgets (device memory less static bytes and reserve, a factor of 1F1B's peak,
    or the limit as given)."""
    r = request
    profile, costs = _costs(profile, r)
    limit = r.mem_limit
    if costs.device_memory is not None:
        limit = costs.limits()
    elif r.mem_factor is not None:
        p = r.num_devices if r.num_devices is not None else profile.num_stages
        limit = factor_limit(profile, check_count("num_devices", p), r.num_microbatches, r.mem_factor, r.chunks)
    spec = make_spec(profile, limit, num_microbatches=r.num_microbatches, num_devices=r.num_devices,
                     placement=r.placement, chunks=r.chunks)
    return spec, costs


def _costs(profile: Profile | Model, r: Request) -> tuple[Profile, Costs]:
    """The per-stage profile and its costs: a model cut into the placement's stages, or a bare profile."""
    if isinstance(profile, Model):
        device_memory = r.device_memory
        if device_memory is None and r.mem_limit is None and r.mem_factor is None:
            device_memory = default_device_memory(profile)
        if r.num_devices is None:
            raise InputError("num_devices = None: give num_devices to cut a model into stages")
        check_placement(r.placement, SUPPORTED_PLACEMENTS)
        layout = make_placement(r.placement, r.num_devices, 1 if r.placement == "sequential" else r.chunks)
        return model_costs(profile, layout, list(r.partition) if isinstance(r.partition, tuple) else r.partition,
                           device_memory, r.reserve, parse_recompute(r.recompute))
    if r.partition != "uniform":
        raise InputError(f"partition = {r.partition!r}: a partition cuts a model; this is a per-stage profile")
    if r.recompute != "none":
        raise InputError(f"recompute = {r.recompute!r}: recomputation chooses a model's blocks; this is a per-stage "
                         "profile")
    if not isinstance(profile, Profile):
        raise InputError(f"profile = {profile!r} must be a Profile or a Model")
    p = r.num_devices if r.num_devices is not None else profile.num_stages
    return profile, profile_costs(p if isinstance(p, int) and p > 0 else 1, r.device_memory, r.reserve)
