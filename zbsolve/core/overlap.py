"""The overlap rule, stated once: how long an overlapped F&B pair (DualPipe's, or one a search chose) runs.

A pass's time holds its computation and, for an expert layer, its all-to-all communication (``Profile.comm_f``,
``comm_b``: dispatch and combine); run alone, a pass pays both one after the other. In a pair, the forward's and the
backward's chunks are cut at their all-to-alls and interleaved, so each one's communication runs beside the
other's computation. The rule's assumptions:

- the two computations share the SMs and run one after the other: together ``C`` = their computations, shortened
  by ``overlap_saving`` (kernels of two chunks filling the device better);
- the two communications share the links and run one after the other: together ``A``;
- communication never waits for computation or the reverse (the chunks are cut finely enough to keep both busy);
- while communication runs it holds a share of the SMs, so computation beside it slows: each second of
  communication costs ``overlap_slowdown`` seconds of computation (DeepSeek-V3 gives 20 of an H800's 132 SMs to
  communication: about 0.15).

A pair lasts ``max(A, C + overlap_slowdown * A)``: the computation with its slowdown, or the communication where that
is longer. Without communication it is ``C``, the pair of the unit profile.
"""

from __future__ import annotations

OVERLAP_SAVING = 0.0
"""Default share of a pair's computation saved by running its two chunks together."""
OVERLAP_SLOWDOWN = 0.15
"""Default computation time lost per second of communication beside it."""


def pair_time(compute: float, comm: float, saving: float, slowdown: float) -> float:
    """Duration of an overlapped pair whose two passes compute ``compute`` and communicate ``comm`` seconds in all,
    with ``saving`` and ``slowdown`` as the rule above states."""
    return max(comm, (1.0 - saving) * compute + slowdown * comm)


def most_saved(compute: float, comm: float, saving: float, slowdown: float) -> float:
    """The most seconds a pair whose passes compute ``compute`` and communicate ``comm`` seconds can save over the
    two run alone: ``saving * compute + (1 - slowdown) * comm`` (a pair lasts at least
    ``(1 - saving) * C + slowdown * A``)."""
    return saving * compute + (1.0 - slowdown) * comm
