"""Problem: a profile with its pipeline size, microbatch count, placement and memory budget,
as stored in the YAML files under problems/."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Optional, Union

from pydantic import ConfigDict, Field, FiniteFloat, PositiveInt, model_validator

from zbsolve.base.checks import Positive
from zbsolve.base.errors import InputError
from zbsolve.problem.model import Model
from zbsolve.base.inputs import InputModel, load_mapping
from zbsolve.core.profile import Profile



class Problem(InputModel):
    """One scheduling problem."""

    model_config = ConfigDict(extra="forbid")
    what: ClassVar[str] = "problem"

    name: str = "problem"
    """Short name, e.g. "1.5b-p8-m24"."""
    num_devices: PositiveInt
    """Number of devices (pipeline ranks) p."""
    num_microbatches: PositiveInt
    """Number of microbatches m."""
    profile: Profile = Field(default_factory=Profile)
    """Per-stage costs (one stage per device unless the placement holds more)."""
    placement: str = "sequential"
    """sequential, interleaved, vshape or bidirectional."""
    mem_limit: Union[Positive, list[Positive], None] = None
    """Activation memory limit in the profile's unit: one number or one per device."""
    mem_factor: Optional[Positive] = None
    """Memory limit as a multiple of 1F1B's peak activation memory (exclusive with mem_limit)."""
    description: str = ""
    """Where the problem comes from."""
    published: dict[str, FiniteFloat] = Field(default_factory=dict)
    """Published bubble rates (paper definition) by schedule name, for comparison."""

    @model_validator(mode="after")
    def _one_limit(self) -> "Problem":
        if self.mem_limit is not None and self.mem_factor is not None:
            raise ValueError("give mem_limit or mem_factor, not both")
        return self


def load_input(path: str | Path) -> Problem | Model | Profile:
    """What a file given to ``zbsolve solve`` holds, told by its keys: a model (``layers``), a problem
    (``num_devices``/``num_microbatches``), or else a bare per-stage profile (as ``zbsolve profile`` writes it)."""
    data = load_mapping(path)
    if "layers" in data:
        return Model.load(path)
    if "num_devices" in data or "num_microbatches" in data:
        return Problem.load(path)
    return Profile.load(path)


def load_costs(path: str | Path) -> Model | Profile:
    """The model or the bare per-stage profile in the file at ``path``, for ``solve`` and ``plan`` from Python; a
    problem file is refused with what to do instead."""
    given = load_input(path)
    if isinstance(given, Problem):
        raise InputError(f"{path}: a problem file (num_devices, num_microbatches and a limit): pass "
                         "Problem.load(path).profile with them, or run zbsolve solve on it")
    return given
