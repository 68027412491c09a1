"""Problem: a profile with its pipeline size, microbatch count, placement and memory budget,
as stored in the YAML files under problems/."""

from __future__ import annotations

import os
from typing import Any, ClassVar, Optional, Union

from pydantic import ConfigDict, Field, FiniteFloat, PositiveInt, model_validator

from zbsolve.base.checks import Positive
from zbsolve.base.errors import InputError
from zbsolve.base.inputs import InputModel, load_mapping
from zbsolve.base.kinds import MODEL, PROBLEM, PROFILE, check_kind, file_kind
from zbsolve.core.profile import Profile
from zbsolve.costmodel.model import Model


class Problem(InputModel):
    """One scheduling problem."""

    model_config = ConfigDict(extra="forbid")
    what: ClassVar[str] = "problem"
    file_kind: ClassVar[str | None] = PROBLEM

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
    """The paper's bubble (``paper_bubble``) of each schedule in the paper's table for this p and m, by name."""
    time_unit: str = ""
    """The unit of the profile's times, as tables and charts name it (e.g. "us"); empty when the file says none."""
    memory_unit: str = ""
    """The unit of the profile's memory figures, likewise (e.g. "Table 1 units")."""

    @model_validator(mode="after")
    def _one_limit(self) -> "Problem":
        if self.mem_limit is not None and self.mem_factor is not None:
            raise ValueError("give mem_limit or mem_factor, not both")
        return self


def completed(problem: Problem, fields: dict[str, Any]) -> dict[str, Any]:
    """A request's ``fields`` (``Request``'s, None where not given) completed by what ``problem`` states: its p and
    m, its memory limit (where neither a limit, a factor nor a device memory is given) and its placement."""
    fields = dict(fields)
    fields["num_devices"] = fields.get("num_devices") or problem.num_devices
    fields["num_microbatches"] = fields.get("num_microbatches") or problem.num_microbatches
    if all(fields.get(name) is None for name in ("mem_limit", "mem_factor", "device_memory")):
        fields.update(mem_limit=problem.mem_limit, mem_factor=problem.mem_factor)
    fields["placement"] = fields.get("placement") or problem.placement or "sequential"
    return fields


def load_input(path: str | os.PathLike[str], taker: str = "load_input") -> Problem | Model | Profile:
    """What a file given to ``zbsolve solve`` holds, told by its keys (``base.kinds.file_kind``): a model, a problem
    (or a file of no kind known: a bare per-stage profile, as ``zbsolve profile`` writes it); a file of another kind
    is an ``InputError`` saying what ``taker`` takes."""
    data = load_mapping(path)
    check_kind(data, str(path), [PROBLEM, MODEL, PROFILE], taker)
    given = file_kind(data)
    if given == MODEL:
        return Model.load(path)
    if given == PROBLEM:
        return Problem.load(path)
    return Profile.load(path)


def load_costs(path: str | os.PathLike[str], taker: str = "load_costs") -> Model | Profile:
    """The model or the bare per-stage profile in the file at ``path``, for ``solve`` and ``plan`` from Python; a
    problem file is refused with what to do instead."""
    given = load_input(path, taker)
    if isinstance(given, Problem):
        raise InputError(f"{path} is a {PROBLEM}; {taker} takes a {MODEL} or a {PROFILE}: pass "
                         "Problem.load(path).profile with its num_devices and num_microbatches, or run zbsolve solve "
                         "on it")
    return given
