"""Profile: what a schedule's cost depends on, per model stage."""

from __future__ import annotations

import json
import math
import numbers
import os
from pathlib import Path
from typing import Annotated, ClassVar, Optional, TypeGuard, TypeVar, Union

import yaml
from pydantic import (
    BeforeValidator,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

from zbsolve.base.checks import is_positive, slack
from zbsolve.base.errors import InputError
from zbsolve.base.files import write_atomic
from zbsolve.base.inputs import InputModel, load_mapping, show
from zbsolve.base.kinds import PROFILE, check_kind
from zbsolve.core.overlap import OVERLAP_SAVING, OVERLAP_SLOWDOWN, pair_time
from zbsolve.core.placement import Placement

TIME_FIELDS = ("t_f", "t_b", "t_w")
MEM_FIELDS = ("mem_f", "mem_b", "mem_w")
STAGE_FIELDS = TIME_FIELDS + MEM_FIELDS
"""The figures a profiler measures per stage."""
COMM_FIELDS = ("comm_f", "comm_b")
"""The communication parts of F's and B's times (all-to-all), which an overlapped pair hides."""
PER_STAGE = STAGE_FIELDS + ("mem_r", "mem_rw") + COMM_FIELDS + ("t_tail",)
"""Every field with one value per stage (``mem_r`` only where some stage's B holds memory while it runs,
``mem_rw`` only where given, the communication parts only where a stage communicates, ``t_tail`` only where some
stage has a tail)."""
def _per_stage(value: object) -> float | list[float]:
    """A number, or a non-empty list of numbers, as floats; anything else (a bool, a string) is an error."""
    try:
        if _is_number(value):
            return float(value)
        if isinstance(value, (list, tuple)) and value and all(_is_number(x) for x in value):
            return [float(x) for x in value]
    except OverflowError:
        raise ValueError("too large for a float") from None
    raise ValueError("should be a number or a non-empty list of numbers")


def _is_number(value: object) -> TypeGuard[numbers.Real]:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


PerStage = Annotated[Union[float, list[float]], BeforeValidator(_per_stage)]
"""One value for every stage, or one per stage."""


Amount = TypeVar("Amount", int, float)
"""Bytes, whole or not: the deltas are of the type M_B and M_W are."""


def paper_deltas(m_b: Amount, m_w: Amount) -> tuple[Amount, Amount, Amount]:
    """The memory deltas of F, B and W from the paper's M_B (what F holds) and M_W (what remains after B):
    M_B, M_W - M_B and -M_W, which sum to 0."""
    return m_b, m_w - m_b, -m_w


class Profile(InputModel):
    """Per-stage pass durations and memory deltas; a scalar broadcasts to every stage.

    Memory deltas follow the paper: F allocates ``mem_f`` (M_B), B changes memory by
    ``mem_b`` (M_W - M_B) and W by ``mem_w`` (-M_W), so each stage's three deltas sum to 0.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    what: ClassVar[str] = "profile"

    t_f: PerStage = 1.0
    """Duration of a forward pass F."""
    t_b: PerStage = 1.0
    """Duration of a backward pass B (input gradient only)."""
    t_w: PerStage = 1.0
    """Duration of a weight-gradient pass W."""
    t_comm: float = Field(0.0, ge=0.0, allow_inf_nan=False)
    """Latency added to every dependency that crosses devices."""
    mem_f: PerStage = 1.0
    """Memory allocated by F (the paper's M_B)."""
    mem_b: PerStage = -0.5
    """Memory change of B (M_W - M_B)."""
    mem_w: PerStage = -0.5
    """Memory change of W (-M_W)."""
    mem_r: PerStage = 0.0
    """Memory a B holds while it runs, on top of the running level: the activations a recomputing stage's forward
    makes again before its backward (0 where nothing recomputes, or where all of them stay until W: ``mem_b``)."""
    mem_rw: Optional[PerStage] = None
    """Memory a BW (B and W fused) holds while it runs, on top of the running level, where it is known layer by
    layer: a runtime's full backward runs each layer's B and W together, so a recomputing block holds its own
    forward only while its backward runs and frees it (``problem.recompute_costs.stage_costs``). None: as B then W
    would (``held_in``)."""
    comm_f: PerStage = 0.0
    """Seconds of ``t_f`` that are communication (expert all-to-all): paid by F alone, hidden in an overlapped pair."""
    comm_b: PerStage = 0.0
    """Seconds of ``t_b`` that are communication, likewise (W communicates nothing)."""
    t_tail: PerStage = 0.0
    """Seconds the stage adds to its device's step after the device's last pass (its gradients' data-parallel
    synchronisation left exposed and its share of the optimizer step, ``costmodel.step_tail``): a device's tail is
    the sum of its stages' (``device_tails``), which ``core.objective`` adds to its share of the step."""
    overlap_saving: float = Field(OVERLAP_SAVING, ge=0.0, lt=1.0, allow_inf_nan=False)
    """Share of an overlapped pair's computation saved by running its two chunks together (``core.overlap``)."""
    overlap_slowdown: float = Field(OVERLAP_SLOWDOWN, ge=0.0, le=1.0, allow_inf_nan=False)
    """Computation time an overlapped pair loses per second of communication beside it (``core.overlap``)."""

    @model_validator(mode="after")
    def _check(self) -> "Profile":
        lengths = {name: len(v) for name in PER_STAGE if isinstance(v := getattr(self, name), list)}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"per-stage lists disagree in length: {lengths}")
        n = self.num_stages or 1
        for name in PER_STAGE:
            for s in range(n if getattr(self, name) is not None else 0):
                x = self.stage_value(name, s)
                at = f"{name}[{s}]" if isinstance(getattr(self, name), list) else name
                if name in TIME_FIELDS and not is_positive(x):
                    raise ValueError(f"{at} = {x} must be a positive finite duration")
                if not math.isfinite(x):
                    raise ValueError(f"{at} = {x} must be finite")
                if name in ("mem_r", "mem_rw", "t_tail") + COMM_FIELDS and x < 0:
                    raise ValueError(f"{at} = {x} must be >= 0")
                if name in COMM_FIELDS and x > (t := self.stage_value(f"t_{name[-1]}", s)):
                    raise ValueError(f"{at} = {x} must be at most t_{name[-1]} = {t}: it is a part of that time")
        for s in range(n):
            f, b, w = self.memories(s)
            if abs(f + b + w) > slack(f, b, w):
                raise ValueError(f"mem_f + mem_b + mem_w of stage {s} = {f} + {b} + {w} = {f + b + w}, must be 0")
        return self

    # -- construction -------------------------------------------------------------
    @classmethod
    def from_paper(cls, T_F: PerStage, T_B: PerStage, T_W: PerStage, T_comm: float = 0.0,
                   M_B: PerStage = 1.0, M_W: PerStage = 0.5, overlap_saving: float = 0.0) -> "Profile":
        """The paper's form: times T_F, T_B, T_W, T_comm; F holds M_B, after B M_W remains."""
        mb, mw = _argument("M_B", M_B), _argument("M_W", M_W)
        mem_f: float | list[float]
        mem_b: float | list[float]
        mem_w: float | list[float]
        if isinstance(mb, list) or isinstance(mw, list):
            n = next(len(v) for v in (mb, mw) if isinstance(v, list))
            mb = mb if isinstance(mb, list) else [mb] * n
            mw = mw if isinstance(mw, list) else [mw] * n
            if len(mb) != len(mw):
                raise InputError(f"profile: M_B and M_W lengths disagree: {len(mb)} != {len(mw)}")
            deltas = [paper_deltas(b, w) for b, w in zip(mb, mw)]
            mem_f, mem_b, mem_w = ([d[i] for d in deltas] for i in range(3))
        else:
            mem_f, mem_b, mem_w = paper_deltas(mb, mw)
        return cls(t_f=T_F, t_b=T_B, t_w=T_W, t_comm=T_comm, mem_f=mem_f, mem_b=mem_b, mem_w=mem_w,
                   overlap_saving=overlap_saving)

    @classmethod
    def load(cls, path: str | os.PathLike[str], taker: str | None = None) -> "Profile":
        """Load a profile from a YAML or JSON file (a top-level ``profile:`` key is accepted: a problem file's); a
        file of another kind is an ``InputError`` saying what ``taker`` (a command, an option) takes."""
        data = load_mapping(path)
        if isinstance(data.get("profile"), dict):
            data = data["profile"]
        else:
            check_kind(data, str(path), [PROFILE], taker or "Profile.load")
        return cls.parse(data, str(path))

    def save(self, path: str | Path) -> None:
        """Write the profile as YAML (``.yaml``/``.yml``) or JSON (anything else), whole or not at all."""
        path = Path(path)
        data = self.model_dump()
        text = yaml.safe_dump(data, sort_keys=False) if path.suffix in (".yaml", ".yml") else json.dumps(data, indent=2)
        write_atomic(path, text)

    # -- access -------------------------------------------------------------------
    @property
    def num_stages(self) -> int | None:
        """Number of stages fixed by per-stage lists, or None when every field is a scalar."""
        for name in PER_STAGE:
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
        for name in self._stage_fields():
            data[name] = [self.stage_value(name, s) for s in range(num_stages)]
        return Profile(**data)

    def split_chunks(self, chunks: int) -> "Profile":
        """Each stage cut into ``chunks`` equal consecutive stages (times and memory divided)."""
        n = self.num_stages or 1
        data = self.model_dump()
        for name in self._stage_fields():
            data[name] = [self.stage_value(name, s) / chunks for s in range(n) for _ in range(chunks)]
        return Profile(**data)

    def merge_chunks(self, num_devices: int, chunks: int) -> "Profile":
        """One stage per device: a ``chunks * num_devices``-stage profile with each run of ``chunks`` consecutive
        stages merged (times and memory summed); any other profile as given. The inverse of ``per_chunk``."""
        if self.num_stages != chunks * num_devices or chunks == 1:
            return self
        data = self.model_dump()
        for name in self._stage_fields():
            data[name] = [sum(self.stage_value(name, s * chunks + c) for c in range(chunks))
                          for s in range(num_devices)]
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
        f, b, w = TIME_FIELDS
        return self.stage_value(f, stage), self.stage_value(b, stage), self.stage_value(w, stage)

    def memories(self, stage: int) -> tuple[float, float, float]:
        """(mem_f, mem_b, mem_w) of ``stage``."""
        f, b, w = MEM_FIELDS
        return self.stage_value(f, stage), self.stage_value(b, stage), self.stage_value(w, stage)

    def comm(self, kind: str, stage: int) -> float:
        """Seconds of a pass of ``kind``'s time on ``stage`` that are communication (``comm_b`` for BW; W none)."""
        return self.stage_value(f"comm_{kind[0].lower()}", stage) if kind[0] in "FB" else 0.0

    def device_tails(self, placement: Placement) -> tuple[float, ...]:
        """Per device of ``placement``, its tail: the ``t_tail`` of every stage it holds on any route, each once."""
        held: list[set[int]] = [set() for _ in range(placement.num_devices)]
        for route in placement.routes:
            for s, d in enumerate(route):
                held[d].add(s)
        return tuple(sum(self.stage_value("t_tail", s) for s in stages) for stages in held)

    def pair_time(self, f_stage: int, back_kind: str, b_stage: int) -> float:
        """Duration of an overlapped pair: F of ``f_stage`` beside a ``back_kind`` (B or BW) of ``b_stage``, by the
        overlap rule (``core.overlap``)."""
        comm = self.comm("F", f_stage) + self.comm(back_kind, b_stage)
        compute = self.time("F", f_stage) + self.time(back_kind, b_stage) - comm
        return pair_time(compute, comm, self.overlap_saving, self.overlap_slowdown)

    def held_in(self, kind: str, stage: int) -> float:
        """Memory a pass of ``kind`` holds while it runs, above the level before it: ``mem_r`` for a B (a
        recomputed forward's activations); for a BW, B and W fused, ``mem_rw`` where given, else what B holds and
        what it leaves for its W (``mem_b`` where positive), as B then W would; else 0."""
        if kind == "BW":
            if self.mem_rw is not None:
                return self.stage_value("mem_rw", stage)
            return max(self.stage_value("mem_r", stage), self.stage_value("mem_b", stage))
        return self.stage_value("mem_r", stage) if kind == "B" else 0.0

    def raises_in_b(self, stage: int) -> bool:
        """Whether ``stage``'s B raises the memory: a recomputing stage's B holds its forward while it runs and
        keeps what W reads."""
        return self.stage_value("mem_b", stage) > 0 or self.held_in("B", stage) > 0

    def backward_allocates(self) -> bool:
        """Whether some stage's B raises the memory (``raises_in_b``)."""
        return any(self.raises_in_b(s) for s in range(self.num_stages or 1))

    def _stage_fields(self) -> tuple[str, ...]:
        """The per-stage fields a change of stages rewrites (``mem_r`` only where some stage's B holds memory while it
        runs, the communication parts only where some stage communicates, ``t_tail`` only where some stage has one)."""
        return (STAGE_FIELDS + (("mem_r",) if self.holds_in_b() else ())
                + (("mem_rw",) if self.mem_rw is not None else ())
                + (COMM_FIELDS if self.communicates() else ()) + (("t_tail",) if self.has_tail() else ()))

    def communicates(self) -> bool:
        """Whether any stage's F or B has a communication part."""
        return any(self.stage_value(name, s) for name in COMM_FIELDS for s in range(self.num_stages or 1))

    def has_tail(self) -> bool:
        """Whether any stage adds a tail to its device's step (``t_tail``)."""
        return any(self.stage_value("t_tail", s) for s in range(self.num_stages or 1))

    def holds_in_b(self) -> bool:
        """Whether any stage's B holds memory while it runs (``mem_r``): a recomputing stage's may not, where all its B
        makes again stays until W (``mem_b`` counts it then), so this does not say whether a stage recomputes."""
        return any(self.stage_value("mem_r", s) for s in range(self.num_stages or 1))

    @model_serializer(mode="wrap")
    def _dumped(self, handler: SerializerFunctionWrapHandler) -> dict:
        """Plain values, ``mem_r`` left out where no B holds memory while it runs and the communication parts (with the
        slowdown, at its default) where nothing communicates: documents, profile files and grid keys stay as they were
        before these existed; likewise ``t_tail`` where no stage has a tail."""
        data = handler(self)
        if not self.has_tail():
            data.pop("t_tail", None)
        if not self.holds_in_b():
            data.pop("mem_r", None)
        if self.mem_rw is None:
            data.pop("mem_rw", None)
        if not self.communicates():
            for name in COMM_FIELDS:
                data.pop(name, None)
            if self.overlap_slowdown == OVERLAP_SLOWDOWN:
                data.pop("overlap_slowdown", None)
        return data


def _argument(name: str, value: object) -> float | list[float]:
    """``value`` as per-stage floats; anything else is an ``InputError`` naming the argument."""
    try:
        return _per_stage(value)
    except ValueError as exc:
        raise InputError(f"profile: {name} = {show(value)}: {exc}") from None


UNIT = Profile()
"""Uniform unit profile: T_F = T_B = T_W = 1, no communication, M_B = 1, M_W = 0.5."""
