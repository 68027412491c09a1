"""Problem: a profile with its pipeline size, microbatch count, placement and memory budget,
as stored in the YAML files under problems/."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Union

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, ValidationError, model_validator

from zbsolve.errors import InputError
from zbsolve.families import make_schedule
from zbsolve.profile import Profile, load_mapping, pydantic_message
from zbsolve.simulator import simulate


class Problem(BaseModel):
    """One scheduling problem."""

    model_config = ConfigDict(extra="forbid")

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
    mem_limit: Union[PositiveFloat, list[PositiveFloat], None] = None
    """Activation memory limit in the profile's unit: one number or one per device."""
    mem_factor: Optional[PositiveFloat] = None
    """Memory limit as a multiple of 1F1B's peak activation memory (exclusive with mem_limit)."""
    description: str = ""
    """Where the problem comes from."""
    published: dict[str, float] = Field(default_factory=dict)
    """Published bubble rates (paper definition) by schedule name, for comparison."""

    @model_validator(mode="after")
    def _one_limit(self) -> "Problem":
        if self.mem_limit is not None and self.mem_factor is not None:
            raise ValueError("give mem_limit or mem_factor, not both")
        return self

    @classmethod
    def load(cls, path: str | Path) -> "Problem":
        """Read a problem from YAML or JSON; errors name the file and field."""
        data = load_mapping(path)
        data.setdefault("name", Path(path).stem)
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise InputError(pydantic_message(str(path), exc)) from None


def reference_peak(profile: Profile, num_devices: int, num_microbatches: int) -> float:
    """1F1B's peak activation memory for this problem: the unit of a memory factor."""
    return simulate(make_schedule("1f1b", profile, num_devices, num_microbatches)).peak


def resolve_limit(profile: Profile, num_devices: int, num_microbatches: int,
                  mem_limit: float | list[float] | None, mem_factor: float | None) -> float | list[float] | None:
    """The memory limit in profile units: ``mem_limit`` as given, or ``mem_factor`` x 1F1B's peak."""
    if mem_limit is not None and mem_factor is not None:
        raise InputError("give mem_limit or mem_factor, not both")
    if mem_factor is not None:
        if not mem_factor > 0:
            raise InputError(f"mem_factor = {mem_factor} must be > 0")
        return mem_factor * reference_peak(profile, num_devices, num_microbatches)
    return mem_limit
