"""Activation recomputation as zbsolve's cost model has it (docs/cost-model.md, "Recomputation").

``checkpoint(fn, x)`` runs ``fn`` so that its forward keeps only ``x``. The first backward that reads what ``fn``
saved (torch's B, or W on a first stage, whose B computes nothing) runs ``fn`` once more and keeps what it saves
until autograd frees the graph: the later backward calls (W, one per parameter group) read those tensors and
recompute nothing, unlike ``torch.utils.checkpoint``, which frees them after each use and recomputes per backward
call. The input and the recomputed tensors are held as saved tensors of their own, packed by the saved-tensor
hooks in force when they are kept (those around F, those around the recomputing backward), so a counter there such
as ``zbsolve.execute.memory.SavedBytes`` sees them. ``fn`` must draw no random numbers (the GPT's blocks have no
dropout): the RNG state is not replayed.

``recompute_output(fn, x, consumer)`` is the selective kind: ``consumer(fn(x))`` where what ``consumer`` saves of
``fn(x)`` (a norm's output, read by the next Linear) is not kept: the first backward that reads it runs ``fn`` once
more on the kept ``x`` and keeps the output, packed by the hooks in force then, until the graph is freed. What ``fn``
and ``consumer`` save otherwise is saved as usual, under the hooks in force at F.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch

Out = TypeVar("Out")

_Layout = tuple[torch.Size, tuple[int, ...], int | torch.SymInt]
"""A view's shape, strides and storage offset (``torch.Tensor.as_strided``'s arguments)."""


class _Keep(torch.autograd.Function):
    """A node that holds tensors as its saved tensors and never runs (nothing reads its output, so it needs no
    backward): the saved-tensor hooks in force when it is applied pack them, and they live as long as the node."""

    @staticmethod
    def forward(ctx: Any, anchor: torch.Tensor, *tensors: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(*tensors)
        return anchor.new_empty(0)


def _kept(tensors: list[torch.Tensor]) -> Any:
    """The ``_Keep`` node holding ``tensors`` (detached); its ``saved_tensors`` gives them back."""
    with torch.enable_grad():
        return _Keep.apply(torch.empty(0, requires_grad=True), *(t.detach() for t in tensors)).grad_fn


class _Frame:
    """One checkpointed call of ``fn`` on ``x``: F saves an index per tensor; the first unpack recomputes them all.

    The graph's saved tensors hold the frame (through its unpack hook), so it lives until autograd frees them.
    """

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> None:
        self.fn = fn
        self.input = _kept([x])
        self.requires_grad = x.requires_grad
        self.packed = 0
        self.recomputed: Any = None
        """The ``_Keep`` node of the recomputed saved tensors, once recomputed."""
        self.tensors: tuple[torch.Tensor, ...] = ()
        """The recomputed saved tensors, in the order F saved them."""

    def pack(self, _: torch.Tensor) -> int:
        """What F keeps of a tensor ``fn`` saves: its index, not the tensor."""
        self.packed += 1
        return self.packed - 1

    def unpack(self, index: int) -> torch.Tensor:
        """The recomputed tensor of ``index``; the first call recomputes them all."""
        if self.recomputed is None:
            self._recompute()
        return self.tensors[index]

    def _recompute(self) -> None:
        """Run ``fn`` again with grad on the kept input, and keep what it saves under the hooks in force now."""
        (x,) = self.input.saved_tensors
        saved: list[torch.Tensor] = []

        def collect(tensor: torch.Tensor) -> torch.Tensor:
            saved.append(tensor.detach())
            return saved[-1]

        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(collect, lambda tensor: tensor):
            self.fn(x.detach().requires_grad_(self.requires_grad))
        if len(saved) != self.packed:
            raise RuntimeError(f"checkpoint: the recomputed forward saved {len(saved)} tensors, the forward "
                               f"{self.packed}; the function must run the same operations again")
        self.recomputed = _kept(saved)
        self.tensors = self.recomputed.saved_tensors


def checkpoint(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """``fn(x)``, keeping only ``x`` for backward; its first backward recomputes ``fn`` once and keeps what that
    saves until the graph is freed."""
    frame = _Frame(fn, x)
    with torch.autograd.graph.saved_tensors_hooks(frame.pack, frame.unpack):
        return fn(x)


class _Output:
    """One ``recompute_output`` call: ``consumer`` saves ``y = fn(x)`` (or a view of it) as a layout to rebuild
    from ``fn`` run again, its other saved tensors as indices into the ``_Keep`` node that holds ``x`` first and
    then them; both are packed by the hooks in force at F. The graph's saved tensors hold the call (through their
    unpack hook), so it lives until autograd frees them."""

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor], y: torch.Tensor) -> None:
        self.fn = fn
        self.storage = y.untyped_storage()._cdata
        self.layout: _Layout = (y.shape, y.stride(), y.storage_offset())
        self.others: list[torch.Tensor] = []
        """The consumer's saved tensors not on ``y``'s storage, until ``keep``."""
        self.kept: Any = None
        """The ``_Keep`` node of ``x`` and the consumer's other saved tensors, once ``keep`` ran."""
        self.recomputed: Any = None
        """The ``_Keep`` node of ``fn(x)`` recomputed, once recomputed."""

    def pack(self, tensor: torch.Tensor) -> int | _Layout:
        """What F keeps of a tensor ``consumer`` saves: the layout of a view of ``y``, else an index."""
        if tensor.untyped_storage()._cdata == self.storage:
            return tensor.shape, tensor.stride(), tensor.storage_offset()
        self.others.append(tensor)
        return len(self.others)

    def keep(self, x: torch.Tensor) -> None:
        """Keep ``x`` and the consumer's other saved tensors, under the hooks in force now (outside ``pack``'s)."""
        self.kept = _kept([x, *self.others])
        self.others = []

    def unpack(self, packed: int | _Layout) -> torch.Tensor:
        """The saved tensor ``packed`` stands for; the first view of ``y`` unpacked recomputes ``y``."""
        if isinstance(packed, int):
            return self.kept.saved_tensors[packed]
        if self.recomputed is None:
            self._recompute()
        return self.recomputed.saved_tensors[0].as_strided(*packed)

    def _recompute(self) -> None:
        """Run ``fn`` again on the kept input, and keep its output under the hooks in force now."""
        with torch.no_grad():
            y = self.fn(self.kept.saved_tensors[0])
        if (y.shape, y.stride(), y.storage_offset()) != self.layout:
            raise RuntimeError(f"recompute_output: the recomputed output has layout {y.shape}, {y.stride()}, "
                               f"{y.storage_offset()}, the forward's {self.layout}; fn must compute it the same way")
        self.recomputed = _kept([y])


def recompute_output(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
                     consumer: Callable[[torch.Tensor], Out]) -> Out:
    """``consumer(fn(x))``, keeping ``x`` instead of what ``consumer`` saves of ``fn(x)``: its first backward that
    reads it recomputes ``fn(x)`` once and keeps it until the graph is freed. ``fn``'s own saved tensors and the rest
    of ``consumer``'s are saved as usual (``fn(x)`` is freed only if ``fn`` does not save it itself)."""
    y = fn(x)
    output = _Output(fn, y)
    with torch.autograd.graph.saved_tensors_hooks(output.pack, output.unpack):
        z = consumer(y)
    output.keep(x)
    return z
