"""Which placements and stages per device a plan searches, and why the others are not."""

from __future__ import annotations

from collections.abc import Callable

from zbsolve.base.checks import check_size
from zbsolve.base.errors import InputError
from zbsolve.core.placement import SUPPORTED_PLACEMENTS, check_chunks, check_placement

AUTO_PLACEMENTS = (("sequential", 1), ("interleaved", 2), ("vshape", 2))
"""(placement, stages per device) that "auto" searches."""
MAX_CHUNKS = 8
"""The most stages per device ``chunks="auto"`` searches (public recipes use 4, 5 and 8)."""


NOT_SEARCHED = "not searched"
"""What the log line of a placement dropped from the search says after its name: ``"interleaved x100: not searched:
800 stages over 8 devices, more than the model's 83 layers"``."""


def search_placements(placement: str, chunks: int | str | None, num_devices: int, num_layers: int,
                      num_microbatches: int, note: Callable[[str], None] | None = None) -> list[tuple[str, int]]:
    """(placement, stages per device) a plan searches: those asked for with no more stages than layers; with
    ``chunks`` "auto", every count from 2 to ``MAX_CHUNKS`` (even ones for the V-shape) within the size limit.
    ``note`` hears one line per placement dropped (with "auto": more stages than layers, an odd count for the
    V-shape; with ``chunks`` "auto": a count over the size limit), naming it, its counts and why. None left, a
    placement and count asked for by name that cannot be, or a count asked for that is over the size limit
    (``check_size``), is an ``InputError``."""
    check_placement(placement, ("auto", *SUPPORTED_PLACEMENTS))
    names = [name for name, _ in AUTO_PLACEMENTS] if placement == "auto" else [placement]
    if chunks == "auto":
        asked = [(name, c) for name in names for c in ((1,) if name == "sequential" else range(2, MAX_CHUNKS + 1))
                 if name != "vshape" or c % 2 == 0]
    elif chunks is None or isinstance(chunks, int) and not isinstance(chunks, bool):
        asked = [(name, 1 if name == "sequential" else chunks or dict(AUTO_PLACEMENTS)[name]) for name in names]
    else:
        raise InputError(f"chunks = {chunks!r} must be a whole number >= 1 or 'auto'")
    if placement == "vshape":
        check_chunks(placement, asked[0][1])
    fitting: list[tuple[str, int]] = []
    dropped: dict[tuple[str, str], list[int]] = {}
    for name, c in asked:
        if name == "vshape" and c % 2:
            why = "odd"  # only with "auto", which takes --chunks for the interleaved placement as well
        elif c * num_devices > num_layers:
            why = "layers"
        elif chunks == "auto" and name != "sequential" and not _within_size(c * num_devices, num_microbatches):
            why = "size"
        else:
            fitting.append((name, c))
            continue
        dropped.setdefault((name, why), []).append(c)
    if not fitting:
        name, c = asked[0]
        if isinstance(chunks, int) and name != "sequential" and placement != "auto" and num_devices <= num_layers:
            most = num_layers // num_devices
            raise InputError(f"chunks = {c}: {name} over {num_devices} devices with {c} stages per device is "
                             f"{c * num_devices} stages, and the model has {num_layers} layers (at most {most} "
                             f"stage{'s' if most > 1 else ''} per device)")
        if c * num_devices > num_layers:
            raise InputError(f"num_devices = {num_devices}: {c * num_devices} stages need at least as many "
                             f"layers, and the model has {num_layers}")
        check_size(c * num_devices, num_microbatches)  # every count over the size limit: the least one's refusal
    for _, c in fitting:
        check_size(c * num_devices, num_microbatches)
    for (name, why), counts in dropped.items():
        if note is not None:
            note(f"{name} {', '.join(f'x{c}' for c in counts)}: {NOT_SEARCHED}: "
                 f"{_why_dropped(why, min(counts), len(counts) > 1, num_devices, num_layers, num_microbatches)}")
    return fitting


def _why_dropped(why: str, chunks: int, more: bool, num_devices: int, num_layers: int, num_microbatches: int) -> str:
    """Why a placement with ``chunks`` stages per device (the least of several when ``more``) is not searched."""
    if why == "odd":
        return "the V-shape needs an even number of stages per device"
    stages = f"{chunks * num_devices}{' or more' if more else ''} stages over {num_devices} devices"
    if why == "layers":
        return f"{stages}, more than the model's {num_layers} layers"
    try:
        check_size(chunks * num_devices, num_microbatches)
    except InputError as exc:
        return f"{stages} are over the size limit ({exc})"
    return stages


def _within_size(num_stages: int, num_microbatches: int) -> bool:
    """Whether ``check_size`` allows this many stages and microbatches."""
    try:
        check_size(num_stages, num_microbatches)
    except InputError:
        return False
    return True
