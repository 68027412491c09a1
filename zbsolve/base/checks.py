"""One validation rule per field, and the memory tolerance: the leaf every entry point imports."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Annotated, TypeGuard

from pydantic import Field

from zbsolve.base.errors import InputError

TOLERANCE = 1e-9
"""Relative slack of every comparison of figures (memory with its limit, times, sums) against floating-point
rounding: ``slack``."""

Limit = float | tuple[float, ...] | None
"""A memory limit: one number, one per device, or None for none."""
Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
"""A positive finite number, as a field of a pydantic model (``check_positive`` checks one by hand)."""


def is_number(value: object) -> TypeGuard[float]:
    """Whether ``value`` is a finite number: an int or a float, not a bool, NaN or an infinity."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def is_positive(value: object) -> TypeGuard[float]:
    """Whether ``value`` is a positive finite number (``is_number`` and > 0)."""
    return is_number(value) and value > 0


def check_positive(name: str, value: object, must: str = "a positive number") -> float:
    """``value`` when it is a positive finite number (``is_positive``); anything else is an ``InputError``:
    "``name`` = value must be ``must``"."""
    if not is_positive(value):
        raise InputError(f"{name} = {value!r} must be {must}")
    return value


def check_count(name: str, value: object, minimum: int = 1) -> int:
    """``value`` as an integer >= ``minimum``; a bool, a float or a smaller number is an ``InputError``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InputError(f"{name} = {value!r} must be an integer >= {minimum} (smallest valid: {minimum})")
    return value


def check_limit(mem_limit: object, num_devices: int | None = None) -> Limit:
    """A memory limit as one number, a tuple of one number per device, or None; anything else (a bool,
    NaN, infinity, a list of the wrong length or with a None) is an ``InputError``."""
    if mem_limit is None:
        return None
    bad = InputError(f"mem_limit = {mem_limit!r} must be a number, one number per device, or None")
    if not isinstance(mem_limit, (list, tuple)):
        if not is_number(mem_limit):
            raise bad
        return float(mem_limit)
    if not mem_limit or not all(is_number(x) for x in mem_limit):
        raise bad
    if num_devices is not None and len(mem_limit) != num_devices:
        raise InputError(f"mem_limit has {len(mem_limit)} entries, but num_devices = {num_devices}")
    return tuple(float(x) for x in mem_limit)


def device_limits(mem_limit: Limit | Sequence[float], num_devices: int) -> tuple[float, ...]:
    """Per device, its memory limit (infinity for none)."""
    limit = check_limit(mem_limit, num_devices)
    if limit is None:
        return (math.inf,) * num_devices
    return limit if isinstance(limit, tuple) else (limit,) * num_devices


def slack(figure: float, *others: float, floor: float = 1.0) -> float:
    """How far figures compared with ``figure`` (and ``others``) may differ from them by rounding alone:
    ``TOLERANCE`` of the largest in magnitude, and of ``floor`` where all are smaller (by default 1: figures near 0
    compare to within ``TOLERANCE`` absolutely; 0 compares them purely relatively)."""
    if others:
        return TOLERANCE * max(floor, abs(figure), *map(abs, others))
    return TOLERANCE * max(floor, abs(figure))  # the memory rule's case, on every pass: kept cheap


def exceeds(memory: float, limit: float) -> bool:
    """Whether ``memory`` is over ``limit`` by more than the tolerance."""
    return memory > limit + slack(limit)


def room(limit: float) -> float:
    """The memory a generator may plan up to under ``limit``: within half the tolerance."""
    return limit + 0.5 * slack(limit)


MAX_PASSES = 10_000_000
"""Most passes (3 x stages x microbatches) a problem may have. Measured up to 1.5 million passes, a schedule
and its timeline take about 300 bytes a pass, the heuristic as much, a solve about 1 KiB: at most about
10 GiB here."""
MAX_STAGES = 1024
"""Most stages (devices x stages per device) a problem may have. ZB-H2's and the V-shape families' generators
take time growing with the square of the stages: measured with 8 microbatches on a 2-core machine, ZB-H2 (the
floor of a sequential solve without a memory limit) takes 2.9 s at 1,024 stages and about 10 s at 2,000, ZB-V
2.2 s at 1,024 stages and 9.6 s at 2,000, `zbsolve compare -p 2000 -m 8` 74 s."""


def check_size(num_stages: int, num_microbatches: int) -> int:
    """The passes of ``num_stages`` stages and ``num_microbatches`` microbatches (3 per microbatch and stage);
    more than ``MAX_STAGES`` stages or ``MAX_PASSES`` passes is an ``InputError``, raised before anything is
    built."""
    if num_stages > MAX_STAGES:
        raise InputError(f"{num_stages:,} stages (devices x stages per device) are more than the limit of "
                         f"{MAX_STAGES:,}: give fewer --devices")
    passes = 3 * num_stages * num_microbatches
    if passes > MAX_PASSES:
        raise InputError(f"{num_stages} stages x {num_microbatches} microbatches would be {passes:,} passes; "
                         f"the limit is {MAX_PASSES:,}: give fewer --devices or --microbatches")
    return passes
