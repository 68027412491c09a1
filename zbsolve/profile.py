"""Profile: what a schedule's cost depends on, per model stage."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from zbsolve.errors import InputError

PerStage = Union[float, list[float]]

TIME_FIELDS = ("t_f", "t_b", "t_w")
MEM_FIELDS = ("mem_f", "mem_b", "mem_w")
STAGE_FIELDS = TIME_FIELDS + MEM_FIELDS


class Profile(BaseModel):
    """Per-stage pass durations and memory deltas; a scalar broadcasts to every stage.

    Memory deltas follow the paper: F allocates ``mem_f`` (M_B), B changes memory by
    ``mem_b`` (M_W - M_B) and W by ``mem_w`` (-M_W), so each stage's three deltas sum to 0.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    t_f: PerStage = 1.0
    """Duration of a forward pass F."""
    t_b: PerStage = 1.0
    """Duration of a backward pass B (input gradient only)."""
    t_w: PerStage = 1.0
    """Duration of a weight-gradient pass W."""
    t_comm: float = Field(0.0, ge=0.0)
    """Latency added to every dependency that crosses devices."""
    mem_f: PerStage = 1.0
    """Memory allocated by F (the paper's M_B)."""
    mem_b: PerStage = -0.5
    """Memory change of B (M_W - M_B)."""
    mem_w: PerStage = -0.5
    """Memory change of W (-M_W)."""
    overlap_saving: float = Field(0.0, ge=0.0, lt=1.0)
    """DualPipe's F&B overlap: a pair lasts (1 - overlap_saving) * (F + backward)."""

    @field_validator(*STAGE_FIELDS, mode="before")
    @classmethod
    def _not_empty(cls, value: object) -> object:
        if isinstance(value, (list, tuple)) and len(value) == 0:
            raise ValueError("must not be an empty list")
        return value

    @model_validator(mode="after")
    def _check(self) -> "Profile":
        lengths = {name: len(v) for name in STAGE_FIELDS if isinstance(v := getattr(self, name), list)}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"per-stage lists disagree in length: {lengths}")
        for name in TIME_FIELDS:
            for s in range(self.num_stages or 1):
                t = self.stage_value(name, s)
                if not (t > 0 and math.isfinite(t)):
                    raise ValueError(f"{name}[{s}] = {t} must be a positive finite duration")
        n = self.num_stages or 1
        for s in range(n):
            f, b, w = (self.stage_value(name, s) for name in MEM_FIELDS)
            if not all(math.isfinite(x) for x in (f, b, w)):
                raise ValueError(f"memory deltas of stage {s} must be finite: {f}, {b}, {w}")
            if abs(f + b + w) > 1e-9 * max(1.0, abs(f), abs(b), abs(w)):
                raise ValueError(f"mem_f + mem_b + mem_w of stage {s} = {f} + {b} + {w} = {f + b + w}, must be 0")
        return self

    # -- construction -------------------------------------------------------------
    @classmethod
    def from_paper(cls, T_F: PerStage, T_B: PerStage, T_W: PerStage, T_comm: float = 0.0,
                   M_B: PerStage = 1.0, M_W: PerStage = 0.5, overlap_saving: float = 0.0) -> "Profile":
        """The paper's form: times T_F, T_B, T_W, T_comm; F holds M_B, after B M_W remains."""
        if isinstance(M_B, list) or isinstance(M_W, list):
            n = len(M_B) if isinstance(M_B, list) else len(M_W)  # type: ignore[arg-type]
            mb = M_B if isinstance(M_B, list) else [M_B] * n
            mw = M_W if isinstance(M_W, list) else [M_W] * n
            if len(mb) != len(mw):
                raise InputError(f"M_B and M_W lengths disagree: {len(mb)} != {len(mw)}")
            mem_f: PerStage = list(mb)
            mem_b: PerStage = [w - b for b, w in zip(mb, mw)]
            mem_w: PerStage = [-w for w in mw]
        else:
            mem_f, mem_b, mem_w = M_B, M_W - M_B, -M_W
        return make_profile(t_f=T_F, t_b=T_B, t_w=T_W, t_comm=T_comm, mem_f=mem_f, mem_b=mem_b, mem_w=mem_w,
                            overlap_saving=overlap_saving)

    @classmethod
    def from_layers(cls, layers: int, stages: int, *, t_f: float, t_b: float, t_w: float, t_comm: float = 0.0,
                    m_b: float = 1.0, m_w: float = 0.5) -> "Profile":
        """A model of ``layers`` identical layers split as evenly as possible over ``stages``;
        per-layer times and memory are scaled by each stage's layer count."""
        if stages < 1 or layers < stages:
            raise InputError(f"layers = {layers} must be >= stages = {stages} >= 1")
        counts = [layers // stages + (1 if s < layers % stages else 0) for s in range(stages)]
        return cls.from_paper([c * t_f for c in counts], [c * t_b for c in counts], [c * t_w for c in counts],
                              t_comm, [c * m_b for c in counts], [c * m_w for c in counts])

    @classmethod
    def load(cls, path: str | Path) -> "Profile":
        """Load a profile from a YAML or JSON file (a top-level ``profile:`` key is accepted)."""
        data = load_mapping(path)
        if isinstance(data.get("profile"), dict):
            data = data["profile"]
        return make_profile(**data)

    def save(self, path: str | Path) -> None:
        """Write the profile as YAML (``.yaml``/``.yml``) or JSON (anything else)."""
        path = Path(path)
        data = self.model_dump()
        text = yaml.safe_dump(data, sort_keys=False) if path.suffix in (".yaml", ".yml") else json.dumps(data, indent=2)
        path.write_text(text)

    # -- access -------------------------------------------------------------------
    @property
    def num_stages(self) -> int | None:
        """Number of stages fixed by per-stage lists, or None when every field is a scalar."""
        for name in STAGE_FIELDS:
            if isinstance(v := getattr(self, name), list):
                return len(v)
        return None

    def stage_value(self, name: str, stage: int) -> float:
        """Value of per-stage field ``name`` at ``stage`` (scalars broadcast)."""
        v = getattr(self, name)
        return float(v[stage]) if isinstance(v, list) else float(v)

    def expand(self, num_stages: int) -> "Profile":
        """This profile with every per-stage field a list of ``num_stages`` values."""
        if self.num_stages not in (None, num_stages):
            raise InputError(f"profile has {self.num_stages} stages, but the placement needs {num_stages}")
        data = self.model_dump()
        for name in STAGE_FIELDS:
            data[name] = [self.stage_value(name, s) for s in range(num_stages)]
        return Profile(**data)

    def split_chunks(self, chunks: int) -> "Profile":
        """Each stage cut into ``chunks`` equal consecutive stages (times and memory divided)."""
        n = self.num_stages or 1
        data = self.model_dump()
        for name in STAGE_FIELDS:
            data[name] = [self.stage_value(name, s) / chunks for s in range(n) for _ in range(chunks)]
        return Profile(**data)

    def merge_chunks(self, num_devices: int, chunks: int) -> "Profile":
        """One stage per device: a ``chunks * num_devices``-stage profile with each run of ``chunks`` consecutive
        stages merged (times and memory summed); any other profile as given. The inverse of ``per_chunk``."""
        if self.num_stages != chunks * num_devices or chunks == 1:
            return self
        data = self.model_dump()
        for name in STAGE_FIELDS:
            data[name] = [sum(self.stage_value(name, s * chunks + c) for c in range(chunks)) for s in range(num_devices)]
        return Profile(**data)

    def per_chunk(self, num_devices: int, chunks: int, who: str = "this placement") -> "Profile":
        """Stages for ``chunks`` stages per device: a p-stage (or scalar) profile split, a ``chunks * p``-stage
        profile kept as is."""
        p, n = num_devices, self.num_stages
        if n == chunks * p:
            return self
        if n in (None, p):
            return self.expand(p).split_chunks(chunks)
        raise InputError(f"profile has {n} stages; {who} on {p} devices needs {p} (split in {chunks}) "
                         f"or {chunks * p}")

    def time(self, kind: str, stage: int) -> float:
        """Duration of a pass of ``kind`` (F, B, W, or BW = B + W) on ``stage``."""
        if kind == "BW":
            return self.time("B", stage) + self.time("W", stage)
        return self.stage_value(f"t_{kind.lower()}", stage)

    def delta(self, kind: str, stage: int) -> float:
        """Memory change of a pass of ``kind`` (F allocates, B and W free; BW = B + W) on ``stage``."""
        if kind == "BW":
            return self.delta("B", stage) + self.delta("W", stage)
        return self.stage_value(f"mem_{kind.lower()}", stage)

    def durations(self, stage: int) -> tuple[float, float, float]:
        """(t_f, t_b, t_w) of ``stage``."""
        return tuple(self.stage_value(n, stage) for n in TIME_FIELDS)  # type: ignore[return-value]

    def memories(self, stage: int) -> tuple[float, float, float]:
        """(mem_f, mem_b, mem_w) of ``stage``."""
        return tuple(self.stage_value(n, stage) for n in MEM_FIELDS)  # type: ignore[return-value]


def make_profile(**fields: object) -> Profile:
    """Build a Profile, turning pydantic's errors into one ``InputError`` line per field."""
    try:
        return Profile(**fields)
    except ValidationError as exc:
        raise InputError(pydantic_message("profile", exc)) from None


def pydantic_message(what: str, exc: ValidationError) -> str:
    """One line per pydantic error: ``what.field: message (got value)``."""
    lines = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        got = f" (got {err['input']!r})" if err["type"] != "value_error" and "input" in err else ""
        lines.append(f"{what}{'.' + loc if loc else ''}: {msg}{got}")
    return "; ".join(lines)


def load_mapping(path: str | Path) -> dict:
    """Read a YAML or JSON file that must hold a mapping; clear errors otherwise."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise InputError(f"{path} is not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {exc}") from None
    if not isinstance(data, dict):
        raise InputError(f"{path} must hold a mapping at the top level, got {type(data).__name__}")
    return data


UNIT = Profile()
"""Uniform unit profile: T_F = T_B = T_W = 1, no communication, M_B = 1, M_W = 0.5."""
