"""Post-validated optimizer step: the zero bubble replacement for the optimizer barrier.

Each stage steps as soon as its own gradients are ready, using the global state (any inf/NaN gradient, the
gradient norm for clipping) reduced over itself and the stages before it, as passed along the pipeline. The
fully reduced state follows from the last stage; where it shows the early step was wrong (an inf/NaN somewhere,
or clipping needed), the stage restores its parameters and optimizer state exactly and, unless the step must be
skipped, redoes it with the right clip coefficient. A stage whose partial state already shows the step is wrong
waits for the full state instead of stepping early.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from zbsolve.base.errors import InputError

CLIP_EPS = 1e-6
"""Added to the gradient norm in the clip coefficient, as torch.nn.utils.clip_grad_norm_ does."""


@dataclass(frozen=True)
class GlobalState:
    """What a stage's optimizer step depends on beyond the stage: any inf/NaN gradient, the squared norm."""

    found_inf: bool = False
    """Some gradient holds an inf or NaN: the step must be skipped."""
    sq_norm: float = 0.0
    """Sum of the squared 2-norms of the gradients."""

    def combine(self, other: GlobalState) -> GlobalState:
        """The state reduced over both parts."""
        return GlobalState(self.found_inf or other.found_inf, self.sq_norm + other.sq_norm)

    def to_tensor(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """The state as a float64 tensor [found_inf, sq_norm], for torch.distributed."""
        return torch.tensor([float(self.found_inf), self.sq_norm], dtype=torch.float64, device=device)

    @classmethod
    def from_tensor(cls, t: torch.Tensor) -> GlobalState:
        """Inverse of ``to_tensor``."""
        found_inf, sq_norm = t.tolist()
        return cls(bool(found_inf), sq_norm)


@dataclass(frozen=True)
class StepOutcome:
    """What one post-validated step did on one stage."""

    speculative: bool
    """The stage stepped before the fully reduced state arrived."""
    rolled_back: bool
    """That early step was undone: parameters and optimizer state restored to their pre-step values."""
    stepped: bool
    """The parameters hold an update at the end (False: skipped for an inf/NaN gradient)."""
    clip_coef: float
    """Factor the gradients were scaled by (1.0: no clipping)."""


class PostValidatedOptimizer:
    """One stage's optimizer, stepped on a partial global state and validated against the full one.

    ``max_norm`` clips the gradient norm over all stages (None: no clipping; inf/NaN still skips the step).
    With ``group``, stage i is rank i of that process group and ``step`` does the reduction through
    torch.distributed; without it, ``step_stages`` runs the same protocol over a list of stages in one process.
    The wrapped optimizer must not modify ``.grad`` in place (torch's own optimizers do not).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, max_norm: float | None = None, *,
                 group: dist.ProcessGroup | None = None) -> None:
        if max_norm is not None and not (max_norm > 0 and math.isfinite(max_norm)):
            raise InputError(f"max_norm = {max_norm} must be a positive finite number")
        self.optimizer = optimizer
        self.max_norm = max_norm
        self.group = group
        self._saved: tuple[list[torch.Tensor], dict] | None = None

    @property
    def params(self) -> list[torch.nn.Parameter]:
        """The parameters the optimizer steps, in its group order."""
        return [p for g in self.optimizer.param_groups for p in g["params"]]

    def local_state(self) -> GlobalState:
        """This stage's part of the global state."""
        grads = [p.grad for p in self.params if p.grad is not None]
        if not grads:
            return GlobalState()
        norms = torch.stack([torch.linalg.vector_norm(g, dtype=torch.float64) for g in grads])
        sq_norm = float(norms.square().sum())
        return GlobalState(not math.isfinite(sq_norm), sq_norm)

    def clip_coef(self, state: GlobalState) -> float:
        """The clip coefficient ``state`` calls for, clamped to 1 as clip_grad_norm_ does."""
        if self.max_norm is None:
            return 1.0
        return min(1.0, self.max_norm / (math.sqrt(state.sq_norm) + CLIP_EPS))

    def speculative_step(self, partial: GlobalState) -> None:
        """Step now if ``partial`` (reduced over this stage and those before it) allows an unclipped step,
        keeping what ``validate`` needs to undo it; otherwise wait for ``validate``."""
        if partial.found_inf or self.clip_coef(partial) < 1.0:
            return
        params = self.params
        state = self.optimizer.state
        self._saved = ([p.detach().clone() for p in params],
                       {p: {k: v.clone() if torch.is_tensor(v) else copy.deepcopy(v) for k, v in state[p].items()}
                        for p in params if p in state})
        self.optimizer.step()

    def validate(self, full: GlobalState) -> StepOutcome:
        """Keep, undo or redo the early step according to the fully reduced ``full`` state."""
        coef = 1.0 if full.found_inf else self.clip_coef(full)
        speculative = self._saved is not None
        if self._saved is not None:
            saved, self._saved = self._saved, None
            if not full.found_inf and coef == 1.0:
                return StepOutcome(True, False, True, coef)
            self._restore(*saved)
        if not full.found_inf:
            if coef < 1.0:
                for p in self.params:
                    if p.grad is not None:
                        p.grad.mul_(coef)
            self.optimizer.step()
        return StepOutcome(speculative, speculative, not full.found_inf, coef)

    def step(self) -> StepOutcome:
        """The whole post-validated step on this rank: receive the partial state from the previous rank, add
        this stage's, pass it on, step early, then validate against the full state broadcast by the last rank.
        Without a process group this stage is the whole pipeline."""
        if self.group is None:
            return step_stages([self])[0]
        rank, size = dist.get_rank(self.group), dist.get_world_size(self.group)
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(self.group) == "nccl" \
            else torch.device("cpu")
        partial = GlobalState()
        if rank > 0:
            buf = GlobalState().to_tensor(device)
            dist.recv(buf, group_src=rank - 1, group=self.group)
            partial = GlobalState.from_tensor(buf)
        partial = partial.combine(self.local_state())
        if rank < size - 1:
            dist.send(partial.to_tensor(device), group_dst=rank + 1, group=self.group)
        self.speculative_step(partial)
        full = partial.to_tensor(device)
        dist.broadcast(full, group_src=size - 1, group=self.group)
        return self.validate(GlobalState.from_tensor(full))

    def _restore(self, saved_params: list[torch.Tensor], saved_state: dict) -> None:
        params = self.params
        with torch.no_grad():
            for p, saved in zip(params, saved_params):
                p.copy_(saved)
        for p in params:
            self.optimizer.state.pop(p, None)
        self.optimizer.state.update(saved_state)


def step_stages(stages: Sequence[PostValidatedOptimizer]) -> list[StepOutcome]:
    """The post-validated step over ``stages`` (pipeline order) in one process: the partial state passes from
    stage to stage by plain calls, each steps early on its partial view, then all validate on the full state."""
    partial = GlobalState()
    for stage in stages:
        partial = partial.combine(stage.local_state())
        stage.speculative_step(partial)
    return [stage.validate(partial) for stage in stages]
