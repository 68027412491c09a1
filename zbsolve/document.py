"""The schedule document: a versioned JSON file that carries everything needed to re-check a
schedule without zbsolve. Format: docs/schedule-format.md."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt, ValidationError

from zbsolve.errors import InputError
from zbsolve.placement import Placement
from zbsolve.profile import Profile, pydantic_message
from zbsolve.schedule import Op, Pair, Pass, Schedule
from zbsolve.simulator import Timeline

FORMAT, VERSION = "zbsolve-schedule", 1


class _Ref(BaseModel):
    model_config = ConfigDict(extra="ignore")
    mb: NonNegativeInt
    stage: NonNegativeInt


class _BackRef(_Ref):
    kind: Literal["B", "BW"]


class _PassDoc(_Ref):
    model_config = ConfigDict(extra="allow")
    kind: Literal["F", "B", "W", "BW"]
    start: Optional[float] = None
    end: Optional[float] = None


class _PairDoc(BaseModel):
    model_config = ConfigDict(extra="allow")
    kind: Literal["F&B"]
    f: _Ref
    b: _BackRef
    start: Optional[float] = None
    end: Optional[float] = None


_OpDoc = Annotated[Union[_PassDoc, _PairDoc], Field(discriminator="kind")]


class _Document(BaseModel):
    model_config = ConfigDict(extra="allow")
    format: Literal["zbsolve-schedule"]
    version: Literal[1]
    name: str = "schedule"
    num_devices: PositiveInt
    num_microbatches: PositiveInt
    routes: list[list[NonNegativeInt]] = Field(min_length=1)
    microbatch_route: Optional[list[NonNegativeInt]] = None
    profile: Profile
    mem_limit: Union[float, list[float], None] = None
    devices: list[list[_OpDoc]]


def _op_dict(op: Op, start: float, end: float) -> dict:
    if isinstance(op, Pair):
        return {"kind": "F&B", "f": {"mb": op.f.mb, "stage": op.f.stage},
                "b": {"kind": op.b.kind, "mb": op.b.mb, "stage": op.b.stage}, "start": start, "end": end}
    return {"kind": op.kind, "mb": op.mb, "stage": op.stage, "start": start, "end": end}


def to_document(timeline: Timeline, **extra: object) -> dict:
    """The schedule document of a simulated schedule (times are the simulated ones)."""
    s = timeline.schedule
    limit = list(s.mem_limit) if isinstance(s.mem_limit, tuple) else s.mem_limit
    doc = {"format": FORMAT, "version": VERSION, "name": s.name,
           "num_devices": s.num_devices, "num_microbatches": s.num_microbatches,
           "routes": [list(r) for r in s.placement.routes], "microbatch_route": list(s.microbatch_route),
           "profile": s.profile.model_dump(), "mem_limit": limit,
           "devices": [[_op_dict(op, a, b) for op, a, b in zip(ops, starts, ends)]
                       for ops, starts, ends in zip(s.devices, timeline.start, timeline.end)],
           "figures": timeline.figures()}
    doc.update(extra)
    return doc


def write_document(timeline: Timeline, path: str | Path, **extra: object) -> None:
    """Write ``timeline``'s schedule document as JSON to ``path``."""
    Path(path).write_text(json.dumps(to_document(timeline, **extra), indent=1) + "\n")


def from_document(data: dict) -> tuple[Schedule, list[list[tuple[float | None, float | None]]]]:
    """Parse a document into a Schedule and its planned (start, end) per op; clear errors on bad input."""
    if isinstance(data, dict) and data.get("format") != FORMAT:
        raise InputError(f"format = {data.get('format')!r}: not a schedule document (expected {FORMAT!r})")
    if isinstance(data, dict) and data.get("version") != VERSION:
        raise InputError(f"version = {data.get('version')!r} is not supported (expected {VERSION})")
    try:
        doc = _Document.model_validate(data)
    except ValidationError as exc:
        raise InputError(pydantic_message("schedule", exc)) from None
    p, S = doc.num_devices, len(doc.routes[0])
    for r, route in enumerate(doc.routes):
        if len(route) != S:
            raise InputError(f"routes[{r}] has {len(route)} stages, routes[0] has {S}")
        for s, d in enumerate(route):
            if d >= p:
                raise InputError(f"routes[{r}][{s}] = {d} is not a device (num_devices = {p})")
    ops = [[Pair(Pass("F", o.f.mb, o.f.stage), Pass(o.b.kind, o.b.mb, o.b.stage)) if isinstance(o, _PairDoc)
            else Pass(o.kind, o.mb, o.stage) for o in dev] for dev in doc.devices]
    limit = tuple(doc.mem_limit) if isinstance(doc.mem_limit, list) else doc.mem_limit
    schedule = Schedule(doc.name, Placement(p, tuple(map(tuple, doc.routes))), doc.num_microbatches,
                        doc.profile, tuple(map(tuple, ops)), limit, tuple(doc.microbatch_route or ()))
    return schedule, [[(o.start, o.end) for o in dev] for dev in doc.devices]


def read_document(path: str | Path) -> tuple[Schedule, list[list[tuple[float | None, float | None]]]]:
    """Read a schedule document from a JSON file."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{path} is not valid JSON: {exc}") from None
    return from_document(data)


DRIFT_SHARE = 1e-6
"""Planned times that differ from the simulated ones by less than this share of the makespan agree."""


def drift_matters(drift: float, timeline: Timeline) -> bool:
    """Whether planned times ``drift`` far enough from the simulated ones to mention."""
    return drift > DRIFT_SHARE * max(1.0, timeline.makespan)


def planned_drift(timeline: Timeline, planned: list[list[tuple[float | None, float | None]]]) -> float:
    """Largest difference between the document's planned times and the simulated ones (0 if none given)."""
    drift = 0.0
    for d, ops in enumerate(planned):
        for i, (start, end) in enumerate(ops):
            if start is not None:
                drift = max(drift, abs(start - timeline.start[d][i]))
            if end is not None:
                drift = max(drift, abs(end - timeline.end[d][i]))
    return drift
