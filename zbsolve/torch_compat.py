"""Everything zbsolve uses of torch.distributed.pipelining, private names included; checked against torch 2.13.0.

torch's CSV loader (``_PipelineScheduleRuntime._load_csv``), its runtime, its stages' per-pass methods and its
split backward (``_backward.stage_backward_input``/``stage_backward_weight``) are not public API and may change
between torch versions: this is the one module of zbsolve that touches them, so a new torch means checking this
file alone. torch is imported only when a function here is called; zbsolve works without it.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from zbsolve.errors import InputError
from zbsolve.schedule import BW, B, F, W

TORCH_VERSION = "2.13.0"
"""The torch release this module was checked against."""

_REJECTIONS = (AssertionError, RuntimeError, ValueError, KeyError)
"""What torch's loader raises for a schedule it refuses."""

_PASS_METHODS: tuple[tuple[str, Callable[[dict], str]], ...] = (
    ("forward_one_chunk", lambda kwargs: F),
    ("backward_one_chunk", lambda kwargs: BW if kwargs.get("full_backward", True) else B),
    ("backward_weight_one_chunk", lambda kwargs: W),
)
"""A pipeline stage's method for each pass, and the zbsolve pass kind of a call (given its keyword arguments)."""


def has_pipelining() -> bool:
    """Whether torch.distributed.pipelining can be imported."""
    try:
        import torch.distributed.pipelining  # noqa: F401
    except ImportError:
        return False
    return True


def _load_csv_text(runtime: Any, csv_text: str) -> None:
    """Load compute-only CSV text into ``runtime`` with torch's file loader; ``InputError`` if torch refuses it."""
    with tempfile.TemporaryDirectory(prefix="zbsolve-torch-") as tmp:
        path = Path(tmp) / "schedule.csv"
        path.write_text(csv_text)
        try:
            runtime._load_csv(str(path), format="compute_only")
        except _REJECTIONS as exc:
            raise InputError(f"torch rejects the exported schedule: {str(exc).splitlines()[0]}") from None


def lower_csv(csv_text: str, *, num_stages: int, num_microbatches: int, num_devices: int) -> list[list[str]]:
    """Load compute-only CSV text with torch's own loader, without a process group, as each rank would: torch
    parses it, validates it and lowers it to communication. Returns, per rank, torch's actions (compute and
    send/recv) as its action strings; raises ``InputError`` if torch rejects the schedule."""
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

    runtime = _PipelineScheduleRuntime.__new__(_PipelineScheduleRuntime)
    runtime._n_microbatches = num_microbatches
    runtime._num_stages = num_stages
    runtime.pp_group_size = num_devices
    runtime._stages = []
    runtime._defer_pp_recv = False
    runtime.pipeline_order = {}
    _load_csv_text(runtime, csv_text)
    lowered = runtime.pipeline_order_with_comms
    return [[str(action) for action in lowered[rank]] for rank in sorted(lowered)]


def pipeline_stage(module: Any, stage_index: int, num_stages: int, device: Any) -> Any:
    """torch's ``PipelineStage`` running ``module`` as stage ``stage_index`` of ``num_stages`` on ``device``."""
    from torch.distributed.pipelining import PipelineStage

    return PipelineStage(module, stage_index, num_stages, device)


def pipeline_runtime(stages: list, num_microbatches: int, loss_fn: Callable, csv_text: str) -> Any:
    """torch's runtime for this rank's ``stages`` (ascending stage order) running the compute-only CSV text;
    ``step(*inputs, target=..., losses=..., return_outputs=False)`` runs one training step. ``InputError`` if
    torch rejects the schedule. ``defer_pp_recv`` stays off: it gave wrong gradients with a V-shape."""
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

    runtime = _PipelineScheduleRuntime(stages, n_microbatches=num_microbatches, loss_fn=loss_fn)
    _load_csv_text(runtime, csv_text)
    return runtime


def intercept_passes(stage: Any, around: Callable[[str, Callable[[], Any]], Any]) -> None:
    """Route every F, B (torch's I), W and BW that torch's runtime runs on pipeline ``stage`` through
    ``around(kind, run)``, which must call ``run()`` once and return its result."""
    for name, kind_of in _PASS_METHODS:
        _intercept(stage, name, kind_of, around)


def _intercept(stage: Any, name: str, kind_of: Callable[[dict], str],
               around: Callable[[str, Callable[[], Any]], Any]) -> None:
    inner = getattr(stage, name)

    def call(*args: Any, **kwargs: Any) -> Any:
        return around(kind_of(kwargs), lambda: inner(*args, **kwargs))

    setattr(stage, name, call)


def backward_input(outputs: list, output_grads: list | None, inputs: list,
                   params: Iterable) -> list[dict[str, Any]]:
    """torch's B: the gradient of ``inputs`` from ``outputs`` (or the loss, with ``output_grads`` None), the graph
    kept for ``backward_weight``; returns the parameter groups that call needs."""
    from torch.distributed.pipelining._backward import stage_backward_input

    _, groups = stage_backward_input(outputs, output_grads, inputs, iter(params))
    return groups


def backward_weight(params: Iterable, groups: list[dict[str, Any]]) -> None:
    """torch's W: the gradients of ``params`` from the graph ``backward_input`` kept."""
    from torch.distributed.pipelining._backward import stage_backward_weight

    stage_backward_weight(iter(params), groups)

