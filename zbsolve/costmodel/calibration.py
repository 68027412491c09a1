"""Where a calibration scales the cost model: named multipliers on named terms, each 1 unless told.

A ``Calibration`` holds a multiplier per term of ``TERMS`` within ``BOUNDS``; the kernel model
(``zbsolve.costmodel.kernels.Kernels``) reads its kernel terms. ``zbsolve calibrate`` (``zbsolve.configure.calibrate``)
fits them to measured runs and writes them to a file that ``load_calibration`` reads; zbsolve ships one such file per
GPU preset and runtime (``FITTED``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

import yaml

from zbsolve.base.errors import InputError

TERMS = {"gemm": "seconds of matrix products", "attention": "seconds of the attention core",
         "memory_bound": "seconds of memory-bound kernels"}
"""The terms a calibration scales, by name, with what each multiplies."""
BOUNDS = (0.25, 4.0)
"""The least and the most multiplier: a calibration outside them says more about the model than the device."""


@dataclass(frozen=True)
class Calibration:
    """Multipliers on named terms of the cost model; a term not named keeps 1."""

    multipliers: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    """The multiplier of each term it scales (``TERMS``), within ``BOUNDS``."""

    def __post_init__(self) -> None:
        if not isinstance(self.multipliers, Mapping):
            raise InputError(f"calibration = {self.multipliers!r}: should be a mapping of term to multiplier")
        for term, value in self.multipliers.items():
            if term not in TERMS:
                raise InputError(f"calibration.{term} = {value!r}: {term!r} should be one of {', '.join(TERMS)}")
            if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
                    or not BOUNDS[0] <= value <= BOUNDS[1]):
                raise InputError(f"calibration.{term} = {value!r}: should be a number in "
                                 f"[{BOUNDS[0]:g}, {BOUNDS[1]:g}]")
        object.__setattr__(self, "multipliers", MappingProxyType(dict(self.multipliers)))

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.multipliers.items())))

    def scale(self, term: str) -> float:
        """The multiplier of ``term`` (1.0 where not named)."""
        if term not in TERMS:
            raise InputError(f"term = {term!r}: should be one of {', '.join(TERMS)}")
        return float(self.multipliers.get(term, 1.0))


FITTED = Path(__file__).resolve().parents[2] / "problems" / "calibration" / "fitted"
"""The calibrations zbsolve ships, one file per GPU preset and runtime (``h100-megatron.yaml``), each fitted by
``zbsolve calibrate`` on the published runs of ``problems/calibration/`` (docs/cost-model.md, "Calibration")."""


def shipped() -> tuple[str, ...]:
    """The names of the shipped calibrations (``FITTED``), sorted."""
    return tuple(sorted(path.stem for path in FITTED.glob("*.yaml")))


def calibration_path(value: str | Path, name: str = "calibration") -> Path:
    """The file of a calibration given as a path or as a shipped one's name; an ``InputError`` naming ``name``
    where it is neither."""
    path = Path(value)
    if path.is_file():
        return path
    if isinstance(value, str) and (FITTED / f"{value}.yaml").is_file():
        return FITTED / f"{value}.yaml"
    raise InputError(f"{name} = {str(value)!r}: no such file, nor a shipped calibration "
                     f"({', '.join(shipped()) or 'none shipped'})")


def load_calibration(value: str | Path | Calibration | None, name: str = "calibration") -> Calibration:
    """The calibration ``value`` names: itself, the multipliers of a file ``zbsolve calibrate`` wrote (or a shipped
    one's, by name), or none (every multiplier 1); a bad file is one ``InputError`` line naming ``name``."""
    if value is None or isinstance(value, Calibration):
        return value or Calibration()
    path = calibration_path(value, name)
    return _read(path.resolve(), path.stat().st_mtime_ns, name)


@functools.lru_cache(maxsize=32)
def _read(path: Path, mtime: int, name: str) -> Calibration:
    """The multipliers of the calibration file at ``path`` (as of ``mtime``: a rewritten file is read again)."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise InputError(f"{name} = {str(path)!r}: not a readable YAML file ({type(error).__name__})") from None
    if not isinstance(data, dict) or not isinstance(data.get("multipliers"), dict):
        raise InputError(f"{name} = {str(path)!r}: should be a mapping with 'multipliers' (zbsolve calibrate's file)")
    try:
        return Calibration(data["multipliers"])
    except InputError as error:
        raise InputError(f"{name} = {str(path)!r}: {error}") from None


def described(value: str | Path | Calibration | None) -> str:
    """A calibration as a line of ``predict``'s output: where it comes from and its multipliers off 1."""
    if value is None:
        names = ", ".join(shipped())
        return ("calibration: none (the cost model as stated"
                + (f"; shipped: {names}, given with --calibration NAME)" if names else ")"))
    multipliers = load_calibration(value).multipliers
    where = "given" if isinstance(value, Calibration) else str(value)
    terms = ", ".join(f"{term} x{factor:.3g}" for term, factor in multipliers.items() if factor != 1) or "every term x1"
    return f"calibration: {where} ({terms})"
