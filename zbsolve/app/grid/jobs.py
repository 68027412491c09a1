"""The grid file: problems (solve jobs) or models (plan jobs) and the axes to sweep, expanded into fully resolved
jobs, every one checked before any runs."""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, PrivateAttr, ValidationError, model_validator

from zbsolve.base.checks import Positive
from zbsolve.base.errors import InputError
from zbsolve.base.inputs import load_mapping, pydantic_message, show
from zbsolve.base.kinds import GRID, check_kind
from zbsolve.base.units import parse_bytes
from zbsolve.core.objective import Objective
from zbsolve.core.placement import PlacementName, PlanPlacement
from zbsolve.core.profile import Profile
from zbsolve.core.spec import make_spec
from zbsolve.costmodel.model import Model
from zbsolve.planning.placement_choices import search_placements
from zbsolve.problem.problem_file import Problem
from zbsolve.problem.request import Request, SolverName


class Axes(BaseModel):
    """The swept values; a job is one value from each axis. Unset axes take the problem's value."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    stages: Optional[list[PositiveInt]] = Field(None, min_length=1)
    """Numbers of devices p (required for plan jobs)."""
    microbatches: Optional[list[PositiveInt]] = Field(None, min_length=1)
    """Numbers of microbatches m (required for plan jobs)."""
    device_memory: Optional[list[Union[str, PositiveInt]]] = Field(None, min_length=1)
    """Memory per device of plan jobs, e.g. "80GiB" (default: each model's GPU's)."""
    mem_factor: Optional[list[Positive]] = Field(None, min_length=1)
    """Memory limits as multiples of 1F1B's peak."""
    mem_limit: Optional[list[Positive]] = Field(None, min_length=1)
    """Memory limits in the profile's unit."""
    placement: Optional[list[PlanPlacement]] = Field(None, min_length=1)
    """Placements: sequential, interleaved, vshape (default: sequential), and for plan jobs auto (the default)."""
    solver: list[SolverName] = Field(["cpsat"], min_length=1)
    """Solvers: cpsat, cbc, heuristic."""
    objective: list[Objective] = Field(["makespan"], min_length=1)
    """Objectives: makespan (the step time with an optimizer barrier) or span (the paper's)."""
    time_limit: list[Positive] = Field([60.0], min_length=1)
    """Solver time limits in seconds."""
    seed: list[int] = Field([0], min_length=1)
    """Solver seeds."""

    @model_validator(mode="after")
    def _one_limit_axis(self) -> "Axes":
        if self.mem_factor is not None and self.mem_limit is not None:
            raise ValueError("sweep mem_factor or mem_limit, not both")
        return self


class Grid(BaseModel):
    """A grid file: problems (files or one inline profile) and the axes to sweep."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    name: str = "grid"
    """Name of the sweep."""
    problems: list[str] = []
    """Problem YAML files, relative to the grid file."""
    models: list[str] = []
    """Model descriptions (plan jobs), relative to the grid file."""
    profile: Optional[Profile] = None
    """An inline profile, used when no problem files are named."""
    axes: Axes = Field(default_factory=Axes)
    """What to sweep."""
    _source: Optional[str] = PrivateAttr(None)

    @property
    def source(self) -> str:
        """Where the grid comes from, for messages: its file, or its name when built in Python."""
        return self._source or f"grid {self.name!r}"

    @model_validator(mode="after")
    def _has_problem(self) -> "Grid":
        if not self.problems and self.profile is None and not self.models:
            raise ValueError("name at least one problem or model file, or give an inline profile")
        if self.models and (self.problems or self.profile is not None):
            raise ValueError("a grid plans models or solves problems, not both: give models or problems")
        return self

    @classmethod
    def load(cls, path: str | Path, taker: str = "Grid.load") -> "Grid":
        """Read a grid file; problem paths become relative to it. A file of another kind is an ``InputError`` saying
        what ``taker`` (a command) takes."""
        path = Path(path)
        data = load_mapping(path)
        check_kind(data, str(path), [GRID], taker)
        try:
            grid = cls.model_validate(data)
        except ValidationError as exc:
            raise InputError(pydantic_message(str(path), exc)) from None
        grid.problems = [str((path.parent / p) if not Path(p).is_absolute() else p) for p in grid.problems]
        grid.models = [str((path.parent / p) if not Path(p).is_absolute() else p) for p in grid.models]
        grid._source = str(path)
        return grid


class _Keyed(BaseModel):
    """A job with a content hash: equal for equal jobs, whatever the grid they come from."""

    @property
    def key(self) -> str:
        """The job's content hash."""
        text = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


class Job(_Keyed):
    """One solve, fully resolved: everything its result depends on."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    problem: str
    """Problem name."""
    profile: Profile
    """Costs."""
    num_devices: PositiveInt
    """Devices p."""
    num_microbatches: PositiveInt
    """Microbatches m."""
    placement: PlacementName
    """Placement name."""
    mem_limit: Optional[Positive] = None
    """Memory limit in profile units (None: see mem_factor, or unlimited)."""
    mem_factor: Optional[Positive] = None
    """Memory limit as a multiple of 1F1B's peak."""
    solver: SolverName
    """Solver name."""
    objective: Objective = "makespan"
    """What the solve minimises."""
    time_limit: Positive
    """Time limit in seconds."""
    seed: int
    """Solver seed."""

    def request(self) -> Request:
        """The job as the one request ``solve_request`` takes, with one solver thread."""
        return Request(num_microbatches=self.num_microbatches, num_devices=self.num_devices, placement=self.placement,
                       mem_limit=self.mem_limit, mem_factor=self.mem_factor, solver=self.solver,
                       objective=self.objective, time_limit=self.time_limit, workers=1, seed=self.seed)


class PlanJob(_Keyed):
    """One plan, fully resolved: everything its result depends on."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    kind: Literal["plan"] = "plan"
    """What the job does."""
    problem: str
    """Model name."""
    model: Model
    """The model's layers and costs."""
    num_devices: PositiveInt
    """Devices p."""
    num_microbatches: PositiveInt
    """Microbatches m."""
    device_memory: Optional[PositiveInt] = None
    """Bytes of memory per device (None: the model's GPU's)."""
    placement: PlanPlacement
    """Placement to plan for, or auto."""
    time_limit: Positive
    """Time limit in seconds."""


def _plans(grid: Grid) -> list[PlanJob]:
    """The plan jobs of a grid of models: models x devices x microbatches x device memory x placement x time, each
    placement's stages checked against the model's layers and the size limit."""
    a = grid.axes
    if not a.stages or not a.microbatches:
        raise InputError(f"{grid.source}: axes.stages and axes.microbatches: required with models")
    jobs = []
    for i, path in enumerate(grid.models):
        try:
            model = Model.load(path, "the grid's models list")
        except InputError as exc:
            raise InputError(f"{grid.source}: models.{i}: {exc}") from None
        memories = [None] if a.device_memory is None else \
            [parse_bytes(x, f"{grid.source}: axes.device_memory") for x in a.device_memory]
        for p, m, memory, placement, t in itertools.product(a.stages, a.microbatches, memories,
                                                            a.placement or ["auto"], a.time_limit):
            try:
                search_placements(placement, None, p, len(model.layers), m)
            except InputError as exc:
                raise InputError(f"{grid.source}: model {model.name} with stages = {p}, microbatches = {m}, "
                                 f"placement = {placement}: {exc}") from None
            jobs.append(PlanJob(problem=model.name, model=model, num_devices=p, num_microbatches=m,
                                device_memory=memory, placement=placement, time_limit=t))
    return jobs


def _problems(grid: Grid) -> list[Problem]:
    if grid.problems:
        problems = []
        for i, path in enumerate(grid.problems):
            try:
                problems.append(Problem.load(path, "the grid's problems list"))
            except InputError as exc:
                raise InputError(f"{grid.source}: problems.{i}: {exc}") from None
        return problems
    profile = grid.profile
    assert profile is not None, "Grid._has_problem: without problem or model files a grid has a profile"
    p = profile.num_stages or (grid.axes.stages[0] if grid.axes.stages else None)
    if p is None:
        raise InputError(f"{grid.source}: axes.stages: required with an inline profile of scalars")
    if not grid.axes.microbatches:
        raise InputError(f"{grid.source}: axes.microbatches: required with an inline profile")
    return [Problem(name=grid.name, num_devices=p, num_microbatches=grid.axes.microbatches[0], profile=profile)]


def _limits(grid: Grid, prob: Problem) -> list[tuple[Literal["mem_factor", "mem_limit"], float | None]]:
    """The memory limits to sweep for ``prob``: the grid's axis, else the problem's limit (one number)."""
    a = grid.axes
    if a.mem_factor:
        return [("mem_factor", x) for x in a.mem_factor]
    if a.mem_limit:
        return [("mem_limit", x) for x in a.mem_limit]
    if prob.mem_factor:
        return [("mem_factor", prob.mem_factor)]
    if isinstance(prob.mem_limit, list):
        raise InputError(f"{grid.source}: problem {prob.name}: mem_limit = {show(prob.mem_limit)}: a grid takes one "
                         "number, or an axis of them")
    return [("mem_limit", prob.mem_limit)]


def expand(grid: Grid) -> Sequence[Job | PlanJob]:
    """The grid's job list: problems x every axis (or models x devices, microbatches, device memory, placement
    and time limit), each checked before any job runs; an ``InputError`` names the grid file, the problem and the
    axis values at fault."""
    if grid.models:
        return _plans(grid)
    problems, a = _problems(grid), grid.axes
    jobs: list[Job] = []
    placements: list[PlanPlacement] = a.placement or ["sequential"]
    for prob in problems:
        for p, m, (kind, limit), placement in itertools.product(
                a.stages or [prob.num_devices], a.microbatches or [prob.num_microbatches], _limits(grid, prob),
                placements):
            where = (f"{grid.source}: problem {prob.name} with stages = {p}, microbatches = {m}, "
                     f"placement = {placement}" + ("" if limit is None else f", {kind} = {limit}"))
            try:
                make_spec(prob.profile, limit if kind == "mem_limit" else None, num_microbatches=m, num_devices=p,
                          placement=placement)
                assert placement != "auto", "make_spec refuses a placement the optimizer does not solve"
                jobs += [Job(problem=prob.name, profile=prob.profile, num_devices=p, num_microbatches=m,
                             placement=placement, solver=solver, objective=objective, time_limit=t, seed=seed,
                             mem_limit=limit if kind == "mem_limit" else None,
                             mem_factor=limit if kind == "mem_factor" else None)
                         for solver, objective, t, seed in itertools.product(a.solver, a.objective, a.time_limit,
                                                                             a.seed)]
            except InputError as exc:
                raise InputError(f"{where}: {exc}") from None
            except ValidationError as exc:
                raise InputError(pydantic_message(f"{where}: job", exc)) from None
    return jobs
