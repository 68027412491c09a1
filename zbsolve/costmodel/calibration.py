"""Where a calibration scales the cost model: named multipliers on named terms, each 1 unless told.

A ``Calibration`` holds a value per term of ``TERMS``, each within its own plausible range; each term is read in
the one place the cost model computes it (``Term.what``). ``zbsolve calibrate`` (``zbsolve.configure.calibrate``)
fits them to measured runs and writes them to a file that ``load_calibration`` reads; zbsolve ships one such file per
GPU preset and runtime (``FITTED``), which ``predict`` and ``configure`` apply by default (``AUTO``).
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
from zbsolve.costmodel.constants import ALLOCATOR_FRAGMENTATION


@dataclass(frozen=True)
class Term:
    """One term a calibration scales: what it is, its value where no calibration is given, and the range a fit may
    move it in, with where that range comes from."""

    what: str
    """What the value multiplies or states, and where the cost model computes it."""
    low: float
    """The least plausible value."""
    high: float
    """The most plausible value."""
    source: str
    """Why the range is plausible."""
    neutral: float = 1.0
    """The value without a calibration: the cost model as stated."""
    unit: str = "multiplier"
    """"multiplier" (of the stated term) or "share" (a value in place of a stated zero)."""


TERMS = {
    "gemm": Term("seconds of the tensor-core kernels, the matrix products and flash attention's core "
                 "(``Kernels.gemm``, ``Kernels.attention``)", 0.9, 1.3,
                 "the kernel table is a short microbenchmark at boost clock; a training step runs for minutes at the "
                 "clock its power and thermal limits hold (an H100 SXM's 1,980 MHz boost against some 1,600 MHz "
                 "sustained under 700 W: about 1.25x), and no runtime's products beat the table's by more than 10%"),
    "grouped": Term("seconds of the routed experts' grouped products beyond a lone product of each expert's shape "
                    "(``Kernels.matmul``'s expert branch, on top of ``gemm``)", 1.0, 2.0,
                    "1: each expert's product as fast as one alone (the model as stated; its split-K already fills "
                    "the SMs a small product leaves idle); 2: Transformer Engine's ``GroupedLinear`` made a step "
                    "1.87-2.11x as long as a loop of one product per expert, all of it in the grouped products' "
                    "kernels (github.com/NVIDIA/TransformerEngine/issues/2939: split-K reductions, zero fills, some "
                    "6x the product launches); the Megatron-Core MoE report (arXiv 2603.07685) names these small "
                    "per-expert products its \"compute wall\""),
    "memory_bound": Term("seconds of the memory-bound kernels (``Kernels.memory``)", 0.8, 2.0,
                         "the rate is the measured fused streaming kernel's; a runtime's unfused eager kernels "
                         "(norms, casts, permutations as PyTorch runs them) stream at about half of it, a better "
                         "fused one some 20% above"),
    "launch": Term("seconds each kernel costs beyond its work: ``KERNEL_LAUNCH`` and ``KERNEL_GAP`` "
                   "(``Timing.seconds``), which bind on the dropless MoE path's per-expert products, "
                   "permutations and router", 0.5, 3.0,
                   "``KERNEL_LAUNCH``'s sources span 4-6 microseconds a launch from C++; an eager runtime's Python "
                   "dispatch adds some 5-10 microseconds an operator (PyTorch's per-operator overhead), up to 3x, "
                   "and CUDA Graphs or fused dispatchers halve it"),
    "interference": Term("``COMPUTE_INTERFERENCE`` and ``COLLECTIVE_INTERFERENCE``, the slowdowns of computation "
                         "and a collective overlapping each other (``Setup.device``)", 0.0, 2.1,
                         "0: overlap free, as the runtimes' designs intend; 2.1: the most arXiv 2507.03114 "
                         "measured (40%) over the average the preset states (18.9%)"),
    "fragmentation": Term("share of the allocated bytes torch's caching allocator reserves beyond them, in place "
                          "of ``ALLOCATOR_FRAGMENTATION`` (``memory_parts``)", 0.0, 0.15,
                          "0 with expandable segments, as torchtitan sets them; the caching allocator's block "
                          "rounding and split blocks without them, reserved over allocated as torch's memory "
                          "statistics report it, some 5-15%", neutral=ALLOCATOR_FRAGMENTATION, unit="share"),
}
"""The terms a calibration scales, by name: at most six, each a multiplier on a stated term (or a share in place
of a stated zero) with its own plausible range."""


def bounds(term: str) -> tuple[float, float]:
    """The least and the most value of ``term`` (``TERMS``)."""
    return TERMS[term].low, TERMS[term].high


@dataclass(frozen=True)
class Calibration:
    """Values of named terms of the cost model; a term not named keeps its neutral value (the model as stated)."""

    multipliers: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    """The value of each term it scales (``TERMS``), within the term's range."""

    def __post_init__(self) -> None:
        if not isinstance(self.multipliers, Mapping):
            raise InputError(f"calibration = {self.multipliers!r}: should be a mapping of term to multiplier")
        for term, value in self.multipliers.items():
            if term not in TERMS:
                raise InputError(f"calibration.{term} = {value!r}: {term!r} should be one of {', '.join(TERMS)}")
            low, high = bounds(term)
            if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
                    or not low <= value <= high):
                raise InputError(f"calibration.{term} = {value!r}: should be a number in [{low:g}, {high:g}]")
        object.__setattr__(self, "multipliers", MappingProxyType(dict(self.multipliers)))

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.multipliers.items())))

    def __reduce__(self) -> tuple[type[Calibration], tuple[dict[str, float]]]:
        return Calibration, (dict(self.multipliers),)

    def scale(self, term: str) -> float:
        """The value of ``term`` (its neutral value where not named)."""
        if term not in TERMS:
            raise InputError(f"term = {term!r}: should be one of {', '.join(TERMS)}")
        return float(self.multipliers.get(term, TERMS[term].neutral))

    @property
    def at_bound(self) -> tuple[str, ...]:
        """The terms whose value sits at (within 1% of the range of) an end of its range other than its neutral
        value: where a fit pushes a term to the end of what is plausible, the runs want a term the model lacks."""
        near = [(t, v, 0.01 * (TERMS[t].high - TERMS[t].low)) for t, v in self.multipliers.items()]
        return tuple(t for t, v, tol in near if abs(v - TERMS[t].neutral) > tol
                     and min(v - TERMS[t].low, TERMS[t].high - v) <= tol)


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
                     f"({', '.join(shipped()) or 'none shipped'}), {AUTO} (the shipped default) or {STATED}")


AUTO = "auto"
"""The calibration that names the shipped fit of the setup's GPU preset and runtime (``default_fit``), or none
where zbsolve ships none: ``predict``'s and ``configure``'s default."""
STATED = "none"
"""The calibration word for none: the cost model as stated (None in Python)."""


def default_fit(gpu: object, runtime: str) -> str | None:
    """The shipped calibration ``AUTO`` names for GPU ``gpu`` (a preset's name; a ``Gpu`` of one's own has none)
    and ``runtime``: ``{gpu}-{runtime}`` where ``FITTED`` has it, else None."""
    if not isinstance(gpu, str):
        return None
    name = f"{gpu.lower()}-{runtime}"
    return name if (FITTED / f"{name}.yaml").is_file() else None


def resolved(value: str | Path | Calibration | None, gpu: object, runtime: str) -> str | Path | Calibration | None:
    """The calibration ``value`` stands for under GPU ``gpu`` and ``runtime``: ``AUTO`` the shipped default
    (``default_fit``), ``STATED`` none, any other itself."""
    if value == AUTO:
        return default_fit(gpu, runtime)
    return None if value == STATED else value


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


def described(value: str | Path | Calibration | None, gpu: object = None, runtime: str = "megatron") -> str:
    """A calibration as a line of ``predict``'s output: which applies under GPU ``gpu`` and ``runtime`` (``AUTO``
    resolved, ``resolved``), why, and its multipliers off 1."""
    used = resolved(value, gpu, runtime)
    where = f"{gpu} and {runtime}" if isinstance(gpu, str) else f"a GPU of one's own and {runtime}"
    if used is None:
        if value == AUTO:
            return f"calibration: none (no shipped fit for {where}: the cost model as stated)"
        names = ", ".join(shipped())
        return ("calibration: none (the cost model as stated"
                + (f"; shipped: {names}, given with --calibration NAME)" if names else ")"))
    terms = _off_neutral(load_calibration(used))
    if value == AUTO:
        return (f"calibration: {used} (shipped default for {where}: {terms}; --calibration none for the model as "
                "stated)")
    return f"calibration: {'given' if isinstance(used, Calibration) else used} ({terms})"


def _off_neutral(calibration: Calibration) -> str:
    """The values of ``calibration`` off their terms' neutral ones, to three decimals: ``gemm x1.17`` for a
    multiplier, ``fragmentation 0.15`` for a share."""
    values = {term: round(value, 3) for term, value in calibration.multipliers.items()}
    shown = [f"{term} {'x' if TERMS[term].unit == 'multiplier' else ''}{value:.3g}" for term, value in values.items()
             if value != round(TERMS[term].neutral, 3)]
    return ", ".join(shown) or "every term as stated"
