"""The problem specification, normalised once at the boundary.

Whatever asks for a schedule (the Python API, the CLI, grid, frontier) turns its arguments into a
``Spec`` with ``make_spec``: the profile expanded to one value per stage of the placement, a
``Placement`` object, the microbatch count, and the memory limit per device as numbers. Each field
has one validation rule, here, and every entry point that takes the field uses it.
"""

from __future__ import annotations

from dataclasses import dataclass

from zbsolve.base.checks import Limit, check_count, check_limit, check_size, device_limits
from zbsolve.base.errors import InputError
from zbsolve.core.placement import (
    CHUNKS,
    SUPPORTED_PLACEMENTS,
    Placement,
    check_chunks,
    check_placement,
    make_placement,
)
from zbsolve.core.profile import Profile


@dataclass(frozen=True)
class Spec:
    """One scheduling problem, normalised: what every generator and the optimizer take."""

    profile: Profile
    """Costs, one value per stage of the placement."""
    placement: Placement
    """Which device runs each stage."""
    placement_name: str
    """"sequential", "interleaved" or "vshape"."""
    chunks: int
    """Stages per device (1 for sequential)."""
    num_microbatches: int
    """Number of microbatches m."""
    mem_limit: Limit
    """Activation memory limit as given: one number, one per device, or None."""
    limits: tuple[float, ...]
    """Per device, its memory limit (infinity for none)."""

    @property
    def num_devices(self) -> int:
        """Number of devices p."""
        return self.placement.num_devices


def make_spec(profile: Profile, mem_limit: object, *, num_microbatches: object, num_devices: object = None,
              placement: str = "sequential", chunks: object = CHUNKS) -> Spec:
    """Validate a problem once and normalise it: ``placement`` "interleaved" and "vshape" run ``chunks`` stages
    per device; a one-stage-per-device (or scalar) profile is split into chunks, a profile of
    ``chunks * num_devices`` stages is taken as the chunks'. ``num_devices`` defaults to the profile's stages."""
    if not isinstance(profile, Profile):
        raise InputError(f"profile = {profile!r} must be a Profile")
    check_placement(placement, SUPPORTED_PLACEMENTS)
    chunks = check_chunks(placement, chunks)
    m = check_count("num_microbatches", num_microbatches)
    if num_devices is None:
        if profile.num_stages is None:
            raise InputError("num_devices = None: give num_devices when every profile field is a scalar")
        num_devices = profile.num_stages
    p = check_count("num_devices", num_devices)
    check_size((1 if placement == "sequential" else chunks) * p, m)
    limit = check_limit(mem_limit, p)
    if placement == "sequential":
        _check_stages(profile, p)
        return Spec(profile.expand(p), make_placement("sequential", p), placement, 1, m, limit, device_limits(limit, p))
    if profile.num_stages not in (None, p, chunks * p):
        raise InputError(f"num_devices = {p}, but the profile has {profile.num_stages} stages "
                         f"(give {p} or {chunks * p})")
    layout = make_placement(placement, p, chunks)
    return Spec(profile.per_chunk(p, chunks, f"placement {placement!r}"), layout, placement, chunks, m, limit,
                device_limits(limit, p))


def _check_stages(profile: Profile, p: int) -> None:
    """A sequential profile has one stage per device (or scalars); a multiple of p hints at chunks."""
    n = profile.num_stages
    if n in (None, p):
        return
    hint = (f"; a {n}-stage profile over {p} devices is one of {n // p} chunks: placement='vshape' or "
            f"'interleaved' with chunks={n // p}" if n % p == 0 and n > p else "")
    raise InputError(f"num_devices = {p}, but the profile has {n} stages{hint}")
