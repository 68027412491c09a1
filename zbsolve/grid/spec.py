"""The grid file: problems and the axes to sweep, expanded into fully resolved jobs, every one checked before any
runs."""

from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path
from typing import Annotated, Optional

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, PrivateAttr, ValidationError, model_validator

from zbsolve.errors import InputError
from zbsolve.problem import Problem
from zbsolve.profile import Profile, load_mapping, pydantic_message
from zbsolve.solve import SolverName
from zbsolve.spec import PlacementName, make_spec

Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
"""A finite number > 0."""


class Axes(BaseModel):
    """The swept values; a job is one value from each axis. Unset axes take the problem's value."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    stages: Optional[list[PositiveInt]] = Field(None, min_length=1)
    """Numbers of devices p."""
    microbatches: Optional[list[PositiveInt]] = Field(None, min_length=1)
    """Numbers of microbatches m."""
    mem_factor: Optional[list[Positive]] = Field(None, min_length=1)
    """Memory limits as multiples of 1F1B's peak."""
    mem_limit: Optional[list[Positive]] = Field(None, min_length=1)
    """Memory limits in the profile's unit."""
    placement: list[PlacementName] = Field(["sequential"], min_length=1)
    """Placements: sequential, interleaved, vshape."""
    solver: list[SolverName] = Field(["cpsat"], min_length=1)
    """Solvers: cpsat, cbc, heuristic."""
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
        if not self.problems and self.profile is None:
            raise ValueError("name at least one problem file or give an inline profile")
        return self

    @classmethod
    def load(cls, path: str | Path) -> "Grid":
        """Read a grid file; problem paths become relative to it."""
        path = Path(path)
        data = load_mapping(path)
        try:
            grid = cls.model_validate(data)
        except ValidationError as exc:
            raise InputError(pydantic_message(str(path), exc)) from None
        grid.problems = [str((path.parent / p) if not Path(p).is_absolute() else p) for p in grid.problems]
        grid._source = str(path)
        return grid


class Job(BaseModel):
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
    time_limit: Positive
    """Time limit in seconds."""
    seed: int
    """Solver seed."""

    @property
    def key(self) -> str:
        """Content hash: equal for equal jobs, whatever the grid they come from."""
        text = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def _problems(grid: Grid) -> list[Problem]:
    if grid.problems:
        problems = []
        for i, path in enumerate(grid.problems):
            try:
                problems.append(Problem.load(path))
            except InputError as exc:
                raise InputError(f"{grid.source}: problems.{i}: {exc}") from None
        return problems
    p = grid.profile.num_stages or (grid.axes.stages or [None])[0]
    if p is None:
        raise InputError(f"{grid.source}: axes.stages: required with an inline profile of scalars")
    if not grid.axes.microbatches:
        raise InputError(f"{grid.source}: axes.microbatches: required with an inline profile")
    return [Problem(name=grid.name, num_devices=p, num_microbatches=grid.axes.microbatches[0], profile=grid.profile)]


def expand(grid: Grid) -> list[Job]:
    """The grid's job list: problems x every axis, each checked before any job runs; an ``InputError`` names
    the grid file, the problem and the axis values at fault."""
    problems, a = _problems(grid), grid.axes
    jobs = []
    for prob in problems:
        limits = ([("mem_factor", x) for x in a.mem_factor] if a.mem_factor else
                  [("mem_limit", x) for x in a.mem_limit] if a.mem_limit else
                  [("mem_factor", prob.mem_factor)] if prob.mem_factor else [("mem_limit", prob.mem_limit)])
        for p, m, (kind, limit), placement in itertools.product(
                a.stages or [prob.num_devices], a.microbatches or [prob.num_microbatches], limits, a.placement):
            where = (f"{grid.source}: problem {prob.name} with stages = {p}, microbatches = {m}, "
                     f"placement = {placement}" + ("" if limit is None else f", {kind} = {limit}"))
            try:
                make_spec(prob.profile, limit if kind == "mem_limit" else None, num_microbatches=m, num_devices=p,
                          placement=placement)
                jobs += [Job(problem=prob.name, profile=prob.profile, num_devices=p, num_microbatches=m,
                             placement=placement, solver=solver, time_limit=t, seed=seed, **{kind: limit})
                         for solver, t, seed in itertools.product(a.solver, a.time_limit, a.seed)]
            except InputError as exc:
                raise InputError(f"{where}: {exc}") from None
            except ValidationError as exc:
                raise InputError(pydantic_message(f"{where}: job", exc)) from None
    return jobs
