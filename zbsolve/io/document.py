"""The schedule document: a versioned JSON file that carries everything needed to re-check a
schedule without zbsolve. Format: docs/schedule-format.md."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, ClassVar, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt, model_validator

from zbsolve.base.errors import InputError, ScheduleError
from zbsolve.base.files import write_atomic
from zbsolve.base.inputs import InputModel, load_mapping, read_text
from zbsolve.base.kinds import DOCUMENT, check_kind
from zbsolve.core.placement import Placement
from zbsolve.core.profile import Profile
from zbsolve.core.schedule import F, Kind, Op, Pair, Pass, Schedule
from zbsolve.core.simulator import Timeline
from zbsolve.io.costs_section import document_costs
from zbsolve.problem.costs import Costs

FORMAT, VERSION = "zbsolve-schedule", 1

NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False)]
"""A finite number >= 0: a planned time or a memory limit."""
Planned = list[list[tuple[float | None, float | None]]]
"""Per device, per op, the planned (start, end), each None when not given."""


class _Ref(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    mb: NonNegativeInt
    stage: NonNegativeInt


class _BackRef(_Ref):
    kind: Literal["B", "BW"]


class _Timed(BaseModel):
    """An op's planned times: optional, and the start not after the end."""

    model_config = ConfigDict(extra="allow", strict=True)
    start: Optional[NonNegative] = None
    end: Optional[NonNegative] = None

    @model_validator(mode="after")
    def _ordered(self) -> "_Timed":
        if self.start is not None and self.end is not None and self.start > self.end:
            raise ValueError(f"start = {self.start} is after end = {self.end}")
        return self


class _PassDoc(_Timed):
    kind: Literal["F", "B", "W", "BW"]
    mb: NonNegativeInt
    stage: NonNegativeInt


class _PairDoc(_Timed):
    kind: Literal["F&B"]
    f: _Ref
    b: _BackRef


_OpDoc = Annotated[Union[_PassDoc, _PairDoc], Field(discriminator="kind")]


class _Document(InputModel):
    model_config = ConfigDict(extra="allow")
    what: ClassVar[str] = "schedule document"
    format: Literal["zbsolve-schedule"]
    version: Literal[1]
    name: str = "schedule"
    num_devices: PositiveInt
    num_microbatches: PositiveInt
    routes: list[list[NonNegativeInt]] = Field(min_length=1)
    microbatch_route: Optional[list[NonNegativeInt]] = None
    profile: Profile
    mem_limit: Union[NonNegative, list[NonNegative], None] = None
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


def write_document(timeline: Timeline, path: str | Path, **extra: object) -> dict:
    """Write ``timeline``'s schedule document as JSON to ``path``, whole or not at all; the document."""
    doc = to_document(timeline, **extra)
    write_atomic(path, document_text(doc))
    return doc


def document_text(doc: dict) -> str:
    """The JSON text of the schedule document ``doc``: indented, each device's ops on one line (json's fast encoder
    writes those, several times faster than an indented list of every op)."""
    devices = ",\n  ".join(json.dumps(ops) for ops in doc["devices"])
    return json.dumps({**doc, "devices": []}, indent=1).replace('\n "devices": []', f'\n "devices": [\n  {devices}\n ]',
                                                              1) + "\n"


def from_document(data: object, where: str = "schedule document",
                  taker: str = "from_document") -> tuple[Schedule, Planned]:
    """Parse a document into a Schedule and its planned (start, end) per op. Bad input is an ``InputError`` line
    that starts with ``where`` (e.g. the file) and names the field and the value, or for a file of another kind
    what ``taker`` takes; fewer passes than microbatches is a ``ScheduleError`` (before a list as long as the
    microbatches is built)."""
    check_kind(data, where, [DOCUMENT], taker)
    if not isinstance(data, dict):
        raise InputError(f"{where}: the top level is a {type(data).__name__}, not a schedule document (a JSON "
                         "object)")
    if data.get("format") != FORMAT:
        raise InputError(f"{where}: format = {data.get('format')!r}: not a schedule document (expected {FORMAT!r})")
    if data.get("version") != VERSION:
        raise InputError(f"{where}: version = {data.get('version')!r} is not supported (expected {VERSION})")
    doc = _Document.parse(data, where)
    p, m, S = doc.num_devices, doc.num_microbatches, len(doc.routes[0])
    for r, route in enumerate(doc.routes):
        if len(route) != S:
            raise InputError(f"{where}: routes.{r} has {len(route)} stages, routes.0 has {S}")
        for s, d in enumerate(route):
            if d >= p:
                raise InputError(f"{where}: routes.{r}.{s} = {d} is not a device (num_devices = {p})")
    passes = sum(2 if isinstance(o, _PairDoc) else 1 for dev in doc.devices for o in dev)
    if m > passes:
        raise ScheduleError(f"{where}: num_microbatches = {m}, but the devices list only {passes} passes (each "
                            f"microbatch needs {2 * S} or more)")
    ops = [[Pair(Pass(F, o.f.mb, o.f.stage), Pass(Kind(o.b.kind), o.b.mb, o.b.stage)) if isinstance(o, _PairDoc)
            else Pass(Kind(o.kind), o.mb, o.stage) for o in dev] for dev in doc.devices]
    limit = tuple(doc.mem_limit) if isinstance(doc.mem_limit, list) else doc.mem_limit
    try:
        schedule = Schedule(doc.name, Placement(p, tuple(map(tuple, doc.routes))), m, doc.profile,
                            tuple(map(tuple, ops)), limit, tuple(doc.microbatch_route or ()))
    except InputError as exc:
        raise InputError(f"{where}: {exc}") from None
    return schedule, [[(o.start, o.end) for o in dev] for dev in doc.devices]


def read_json(path: str | Path, taker: str | None = None) -> object:
    """The JSON value in the file at ``path``; an ``InputError`` line naming the file otherwise. With ``taker``, a
    file that is no JSON but a YAML file of another kind than a schedule document (``base.kinds``) is an
    ``InputError`` saying what ``taker`` takes."""
    try:
        return json.loads(read_text(path))
    except (ValueError, RecursionError) as exc:
        error = InputError(f"{path} is not valid JSON: {exc}")
    if taker is not None and Path(path).suffix != ".json":
        try:
            data = load_mapping(path)
        except InputError:
            data = None
        check_kind(data, str(path), [DOCUMENT], taker)
    raise error from None


def read_document(path: str | Path, taker: str = "read_document") -> tuple[Schedule, Planned]:
    """Read a schedule document from a JSON file; errors name the file, the field and the value, or for a file of
    another kind what ``taker`` takes."""
    return from_document(read_json(path, taker), str(path), taker)


@dataclass(frozen=True)
class Loaded:
    """A schedule document read from a file and checked, its costs with it."""

    schedule: Schedule
    """The schedule."""
    planned: Planned
    """The document's planned (start, end) per op."""
    costs: Costs | None
    """Its "partition", "device_memory" and "reserve" sections, checked against the schedule (None without)."""
    data: dict
    """The document as read."""
    where: str = "schedule document"
    """Where it was read from, as its errors start: the file."""


def load_document(path: str | Path, taker: str = "load_document") -> Loaded:
    """The schedule document at ``path`` with its costs; errors name the file, the field and the value, or for a
    file of another kind what ``taker`` (a command) takes."""
    return document_of(read_json(path, taker), str(path), taker)


def document_of(data: object, where: str = "schedule document", taker: str = "document_of") -> Loaded:
    """The schedule document ``data`` (as read from JSON) with its costs; errors start with ``where``."""
    schedule, planned = from_document(data, where, taker)
    assert isinstance(data, dict)  # from_document refuses anything else
    return Loaded(schedule, planned, document_costs(data, schedule, where), data, where)


DRIFT_SHARE = 1e-6
"""Planned times that differ from the simulated ones by less than this share of the makespan agree."""


def drift_matters(drift: float, timeline: Timeline) -> bool:
    """Whether planned times ``drift`` far enough from the simulated ones to mention."""
    return drift > DRIFT_SHARE * max(1.0, timeline.makespan)


def planned_drift(timeline: Timeline, planned: Planned) -> float:
    """Largest difference between the document's planned times and the simulated ones (0 if none given)."""
    drift = 0.0
    for d, ops in enumerate(planned):
        for i, (start, end) in enumerate(ops):
            if start is not None:
                drift = max(drift, abs(start - timeline.start[d][i]))
            if end is not None:
                drift = max(drift, abs(end - timeline.end[d][i]))
    return drift
