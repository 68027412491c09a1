"""Activation memory as the bytes of the tensors autograd saves for backward, counted through saved-tensor hooks.

A block under ``zbsolve.execute.recompute.checkpoint`` keeps its input, and once its first backward recomputes it,
its recomputed saved tensors, as saved tensors of their own packed by the hooks in force then: with these hooks
around every pass (as the executor has them), its input is counted from F and its recomputed activations from the
backward that recomputes them, each until autograd frees the block's graph."""

from __future__ import annotations

from collections.abc import Iterable

import torch


class SavedBytes:
    """Bytes of storage autograd holds for backward, current and peak: a storage counts from the first saved
    tensor on it until autograd drops the last one; the storages of ``exclude`` (parameters, buffers) and empty
    or meta storages never count."""

    def __init__(self, exclude: Iterable[torch.Tensor] = ()) -> None:
        self._exclude = {t.untyped_storage().data_ptr() for t in exclude}
        self._refs: dict[int, list[int]] = {}
        """Per counted storage: [saved tensors on it, its bytes when first saved]."""
        self._current = 0
        self._peak = 0

    @property
    def current(self) -> int:
        """Bytes counted now."""
        return self._current

    @property
    def peak(self) -> int:
        """Most bytes counted at once since the last ``reset_peak``."""
        return self._peak

    def reset_peak(self) -> None:
        """Start a new peak from the current count."""
        self._peak = self._current

    def hooks(self) -> torch.autograd.graph.saved_tensors_hooks:
        """Context in which the tensors autograd saves are counted."""
        return torch.autograd.graph.saved_tensors_hooks(self._pack, Saved.unpack)

    def _pack(self, tensor: torch.Tensor) -> Saved | torch.Tensor:
        storage = tensor.untyped_storage()
        key, size = storage.data_ptr(), storage.nbytes()
        if not size or key in self._exclude or tensor.device.type == "meta":
            return tensor
        entry = self._refs.setdefault(key, [0, size])
        if not entry[0]:
            self._current += size
            self._peak = max(self._peak, self._current)
        entry[0] += 1
        return Saved(self, key, tensor.detach())

    def _release(self, key: int) -> None:
        entry = self._refs[key]
        entry[0] -= 1
        if not entry[0]:
            del self._refs[key]
            self._current -= entry[1]


class Saved:
    """A counted saved tensor, as ``SavedBytes``'s pack hook keeps it; its bytes are released when autograd lets go
    of it."""

    __slots__ = ("account", "key", "tensor")

    def __init__(self, account: SavedBytes, key: int, tensor: torch.Tensor) -> None:
        self.account, self.key, self.tensor = account, key, tensor

    def __del__(self) -> None:
        self.account._release(self.key)

    @staticmethod
    def unpack(saved: Saved | torch.Tensor) -> torch.Tensor:
        return saved.tensor if isinstance(saved, Saved) else saved
