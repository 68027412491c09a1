"""A model as an ordered list of layers with costs in real units (seconds, bytes) and the link between stages.

Stored as YAML under ``problems/models/``; ``zbsolve estimate`` writes one from a Hugging Face config.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, ClassVar, Literal, Optional

import yaml
from pydantic import BeforeValidator, ConfigDict, Field, PositiveInt, model_validator

from zbsolve.base.errors import InputError
from zbsolve.base.files import write_atomic
from zbsolve.base.inputs import InputModel
from zbsolve.base.kinds import MODEL
from zbsolve.costmodel import nccl

Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]
"""A non-negative, finite duration in seconds."""
Flops = Annotated[float, Field(ge=0, allow_inf_nan=False)]
"""A non-negative, finite count of floating-point operations."""


def _whole(value: object) -> object:
    """An integral float (``1e9``) as an int; anything else as given, for the int check to judge."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


Bytes = Annotated[int, BeforeValidator(_whole)]
"""A whole number of bytes."""
Zero = Literal[0, 1, 3]
"""A ZeRO stage: 0 (DDP), 1 (the optimizer sharded) or 3 (FSDP)."""
Dispatcher = Literal["alltoall", "flex"]
"""How the expert all-to-all sends a token (``moe.DISPATCHERS``)."""
BLOCK = re.compile(r"layers\.\d+")
"""Names of the repeated blocks in torchtitan's FQNs (``layers.0``, ``layers.1``, ...), which tables shorten."""
RECOMPUTE_MODULES = ("core_attn", "layernorm", "mla_up_proj", "mlp", "moe", "moe_act", "shared_experts")
"""The modules Megatron-LM recomputes (``--recompute-modules``, megatron-core 0.16.1's
``TransformerConfig.recompute_modules``), in the order zbsolve writes them."""
OP_POLICY = "op"
"""torchtitan's per-op selective activation checkpointing (``SelectiveAC``, ``selective_ac_option = "op"``), whose
costs a block's ``Layer.recompute_modules`` records beside Megatron-LM's modules (``costmodel.recompute_modules.op``;
the choice ``--recompute op``)."""
MTP_PREFIX = "mtp."
"""How the names of multi-token prediction layers begin (``mtp.0``, ``mtp.1``, ...)."""


class _OneLine(dict):
    """A mapping YAML writes on one line (a layer of a model file)."""


class _Dumper(yaml.SafeDumper):
    """YAML's safe dumper, writing ``_OneLine`` mappings in flow style."""


_Dumper.add_representer(_OneLine, lambda dumper, data: dumper.represent_mapping("tag:yaml.org,2002:map",
                                                                               data.items(), flow_style=True))


class ModuleCost(InputModel):
    """What recomputing one of Megatron-LM's modules of a block costs (``Layer.recompute_modules``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    what: ClassVar[str] = "recompute module"

    t: Seconds
    """Seconds its recomputation adds to the block's B."""
    mem: Bytes = Field(ge=0)
    """Activation bytes the block's F keeps no more."""


class Layer(InputModel):
    """One layer: its pass times, the activation memory its passes allocate and free, and what it holds."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    what: ClassVar[str] = "layer"

    name: str = Field(min_length=1)
    """The torch module FQN where known: ``tok_embeddings``, ``layers.0``, ..., ``norm``, ``output``."""
    block: bool = True
    """One of the model's repeated blocks (a uniform partition deals these out); False for the embedding, the
    final norm and the head."""
    t_f: Seconds
    """Forward pass F, seconds."""
    t_b: Seconds
    """Input-gradient pass B, seconds."""
    t_w: Seconds
    """Weight-gradient pass W, seconds."""
    mem_f: Bytes = Field(ge=0)
    """Activation bytes F allocates (the paper's M_B)."""
    mem_b: Bytes
    """Activation bytes B changes (M_W - M_B: what W needs stays)."""
    mem_w: Bytes = Field(le=0)
    """Activation bytes W changes (-M_W); mem_f + mem_b + mem_w = 0."""
    static_bytes: Bytes = Field(ge=0)
    """Bytes held for the whole step: weights, their gradients and optimizer states."""
    grad_bytes: Optional[Bytes] = Field(None, ge=0)
    """The gradients' part of ``static_bytes``, where known (estimates)."""
    optimizer_bytes: Optional[Bytes] = Field(None, ge=0)
    """The optimizer states' part of ``static_bytes``, where known (the weights are the rest)."""
    out_bytes: Bytes = Field(ge=0)
    """Bytes of the output activation, sent to the next stage when a stage boundary follows this layer."""
    flops_f: Optional[Flops] = None
    """FLOPs of F, where known (estimates)."""
    flops_b: Optional[Flops] = None
    """FLOPs of B, where known."""
    flops_w: Optional[Flops] = None
    """FLOPs of W, where known."""
    t_sel: Optional[Seconds] = None
    """Seconds a block's selective recomputation adds to its B (its norms and MLP activation function run again),
    where known (estimates)."""
    mem_sel: Optional[Bytes] = Field(None, ge=0)
    """Activation bytes F keeps no more when the block recomputes selectively (the outputs of its norms and MLP
    activation function), where known."""
    recompute_modules: Optional[dict[str, ModuleCost]] = None
    """Megatron-LM's ``--recompute-modules`` (``RECOMPUTE_MODULES``) this block has, and torchtitan's per-op policy
    (``OP_POLICY``) where the block is one it describes, each with what recomputing it costs, where known
    (estimates)."""
    shares: Optional[str] = None
    """The layer whose weights this one uses (tied embeddings): a stage holding both holds them once."""
    comm_f: Optional[Seconds] = None
    """Seconds of t_f that are expert-parallel all-to-all (dispatch and combine), which an overlapped F&B pair can
    hide; where known."""
    comm_b: Optional[Seconds] = None
    """Seconds of t_b that are expert-parallel all-to-all, likewise; where known."""
    params: Optional[int] = Field(None, ge=0)
    """Parameters of the layer one device holds (its share under tensor and expert parallelism): their gradients
    are synchronised over the data-parallel replicas and updated by the optimizer after the device's last pass
    (``Model.step``); where known."""
    held_b: Optional[Bytes] = Field(None, ge=0)
    """Activation bytes its B holds while it runs above the level before it (the loss's fp32 gradients of the
    logits), freed by its end; where known."""
    gathered_bytes: Optional[Bytes] = Field(None, ge=0)
    """Under FSDP, bytes its passes hold unsharded beyond ``static_bytes``: its parameters gathered before F and
    again before B, and the gradient B writes before the reduce-scatter; a device holds ``FSDP_LIVE_LAYERS`` of its
    largest at once (``problem.partition.held_static_bytes``); where known."""
    gathered_grad_bytes: Optional[Bytes] = Field(None, ge=0)
    """The gradient's part of ``gathered_bytes`` (the weights are the rest), where known."""

    @model_validator(mode="after")
    def _balanced(self) -> "Layer":
        for comm, t in (("comm_f", "t_f"), ("comm_b", "t_b")):
            if getattr(self, comm) is not None and getattr(self, comm) > getattr(self, t):
                raise ValueError(f"{comm} = {getattr(self, comm)} must be at most {t} = {getattr(self, t)}")
        if self.mem_sel is not None and self.mem_sel > self.mem_f:
            raise ValueError(f"mem_sel = {self.mem_sel} must be at most mem_f = {self.mem_f}")
        for name, cost in (self.recompute_modules or {}).items():
            if name not in (*RECOMPUTE_MODULES, OP_POLICY):
                raise ValueError(f"recompute_modules: {name!r} should be one of {', '.join(RECOMPUTE_MODULES)} "
                                 f"or {OP_POLICY}")
            if cost.mem > self.mem_f:
                raise ValueError(f"recompute_modules.{name}.mem = {cost.mem} must be at most mem_f = {self.mem_f}")
        if (self.grad_bytes or 0) + (self.optimizer_bytes or 0) > self.static_bytes:
            raise ValueError(f"grad_bytes + optimizer_bytes must be at most static_bytes = {self.static_bytes}")
        if (self.gathered_grad_bytes or 0) > (self.gathered_bytes or 0):
            raise ValueError(f"gathered_grad_bytes must be at most gathered_bytes = {self.gathered_bytes}")
        if (self.t_sel is None) != (self.mem_sel is None):
            raise ValueError("give both t_sel and mem_sel, or neither")
        if self.mem_f + self.mem_b + self.mem_w:
            raise ValueError(f"mem_f + mem_b + mem_w = {self.mem_f} + {self.mem_b} + {self.mem_w} = "
                             f"{self.mem_f + self.mem_b + self.mem_w}, must be 0")
        return self

    @property
    def mtp(self) -> bool:
        """Whether this is a multi-token prediction layer (``MTP_PREFIX``: ``mtp.0``, ``mtp.1``, ... as ``zbsolve
        estimate`` names DeepSeek-V3's)."""
        return self.name.startswith(MTP_PREFIX)

    @property
    def experts(self) -> bool:
        """Whether this layer has experts: its all-to-all (``comm_f``) is recorded."""
        return self.comm_f is not None


class Link(InputModel):
    """A link: a point-to-point transfer of n bytes takes n / bytes_per_s + latency_s, a collective NCCL's ring
    (``collective``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    what: ClassVar[str] = "link"

    name: str = ""
    """What the link is, e.g. "nvlink" or "network"."""
    bytes_per_s: float = Field(gt=0, allow_inf_nan=False)
    """Bandwidth per direction, bytes/s: a collective's bus bandwidth."""
    latency_s: Seconds = 0.0
    """Seconds added to every point-to-point transfer."""
    ranks_per_node: Optional[PositiveInt] = None
    """Ranks of a collective's group that share a node, where the group spans nodes (None: one node holds them
    all)."""

    def time(self, num_bytes: float) -> float:
        """Seconds to send ``num_bytes``."""
        return num_bytes / self.bytes_per_s + self.latency_s

    def collective(self, num_bytes: float, ranks: int, factor: int = 1) -> float:
        """Seconds of a ring reduce-scatter or all-gather (``factor`` 2: an all-reduce) of a ``num_bytes`` buffer
        over ``ranks`` ranks on this link, as NCCL's tuning model times it (``nccl.ring``: its latency per step
        within and between nodes, the protocol of the least time); 0 for one rank or no bytes."""
        if ranks == 1 or num_bytes == 0:
            return 0.0
        return nccl.ring(num_bytes, ranks, self.bytes_per_s, self.ranks_per_node, factor)


class Interference(InputModel):
    """How a collective and the computation beside it slow each other (``overlapped``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    what: ClassVar[str] = "interference"

    compute: float = Field(0.0, ge=0, allow_inf_nan=False)
    """Seconds of computation lost per second a collective overlaps it."""
    collective: float = Field(0.0, ge=0, allow_inf_nan=False)
    """Share a collective beside computation takes longer than alone."""

    def overlapped(self, compute: float, transfer: float) -> float:
        """Seconds of ``compute`` seconds of work with a collective of ``transfer`` seconds (alone) beside it: the
        collective slowed by ``collective``, the work by ``compute`` for as long as they overlap, the pair done when
        both are."""
        t = transfer * (1 + self.collective) if transfer else 0.0
        return max(compute + self.compute * min(compute, t), t)


NO_INTERFERENCE = Interference()
"""A collective and computation that do not slow each other."""


class Setting(InputModel):
    """The training setting the costs are for."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    what: ClassVar[str] = "setting"

    seq_len: PositiveInt
    """Tokens per sequence."""
    microbatch_size: PositiveInt
    """Sequences per microbatch."""
    tp: PositiveInt = 1
    """Tensor-parallel degree: every figure is per device of the tensor-parallel group."""
    dp: PositiveInt = 1
    """Data-parallel degree."""
    cp: Optional[PositiveInt] = None
    """Context-parallel degree, where above 1: every figure is per device of the group, which holds 1/cp of a
    sequence's tokens (None: 1)."""
    ep: Optional[PositiveInt] = None
    """Expert-parallel degree of a model with experts (None for a dense model)."""
    dispatcher: Optional[Dispatcher] = None
    """How the expert all-to-all sends a token, as the costs count it (``estimate.moe.DISPATCHERS``; None:
    "alltoall")."""
    zero: Zero = 0
    """ZeRO stage: 1 shards the optimizer states over the dp x cp replicas, 3 (FSDP) also the weights and
    gradients."""
    dtype: str = "bf16"
    """Type of weights and activations."""
    gpu: Optional[str] = None
    """The GPU preset of an estimate (zbsolve.costmodel.gpus), or the device measured on."""
    efficiency: Optional[float] = Field(None, gt=0, le=1, allow_inf_nan=False)
    """Fraction of the peak throughput an estimate assumes."""

    @property
    def tokens(self) -> int:
        """Tokens of one microbatch."""
        return self.seq_len * self.microbatch_size

    def global_batch(self, num_microbatches: int) -> int:
        """Sequences of one step of ``num_microbatches`` on every data-parallel replica."""
        return self.microbatch_size * num_microbatches * self.dp


class StepEnd(InputModel):
    """How a step ends after a device's last pass: its gradients synchronised over the data-parallel replicas and
    the optimizer step (``costmodel.step_tail`` times it from each device's ``Layer.params``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    what: ClassVar[str] = "step"

    dp: PositiveInt = 1
    """Data-parallel replicas the gradients are synchronised over."""
    zero: Zero = 0
    """0: gradients all-reduced; 1: reduce-scattered, the optimizer sharded, the parameters all-gathered (Megatron's
    distributed optimizer); 3: FSDP, parameters all-gathered before each pass and gradients reduce-scattered."""
    link: Link
    """The link of the data-parallel group."""
    hbm_bytes_per_s: float = Field(gt=0, allow_inf_nan=False)
    """Memory bandwidth the optimizer step streams its states at, bytes/s."""
    overlap_grad_reduce: bool = False
    """Whether the gradients' reduction runs during the backward, bucket by bucket (Megatron's
    ``--overlap-grad-reduce``; FSDP always), leaving the last bucket's after the last pass."""
    overlap_param_gather: bool = False
    """Whether the distributed optimizer's parameter all-gather runs during the next step's forward (Megatron's
    ``--overlap-param-gather``; FSDP always), leaving the first bucket's exposed."""
    bucket_params: PositiveInt = 40_000_000
    """Parameters a bucket of the gradients' reduction holds (megatron-core 0.16.1's DDP: max(40M, 1M x dp))."""
    interference: Optional[Interference] = None
    """How the overlapped synchronisation and the passes beside it slow each other (None: not at all)."""


class Model(InputModel):
    """A model's layers in order, with what it takes to move an activation between stages."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    what: ClassVar[str] = "model"
    file_kind: ClassVar[str | None] = MODEL

    name: str = "model"
    """Short name, e.g. "llama3-8b"."""
    source: str = ""
    """How the costs were obtained (for an estimate, the command that writes this file)."""
    t_comm: Optional[Seconds] = None
    """Seconds to move an activation between stages; None derives it from ``link`` and the out_bytes at each
    stage boundary (0 when there is neither)."""
    link: Optional[Link] = None
    """The link between stages, to derive t_comm from."""
    setting: Optional[Setting] = None
    """The training setting the costs are for."""
    step: Optional[StepEnd] = None
    """How the step ends after a device's last pass; None: at its last pass (no tail)."""
    layers: list[Layer] = Field(min_length=1)
    """The layers in the order the forward pass runs them."""

    @model_validator(mode="after")
    def _check(self) -> "Model":
        names = [layer.name for layer in self.layers]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"layer names must be unique: {', '.join(twice)} appear more than once")
        for layer in self.layers:
            if layer.shares is not None and (layer.shares not in names or layer.shares == layer.name):
                raise ValueError(f"layer {layer.name}: shares = {layer.shares!r} must name another layer")
        if self.t_comm is not None and self.link is not None:
            raise ValueError("give t_comm or link, not both")
        return self

    def save(self, path: str | Path) -> None:
        """Write the model as YAML (``.yaml``/``.yml``, one line per layer) or JSON, whole or not at all."""
        path = Path(path)
        data = self.model_dump(exclude_none=True)
        if path.suffix not in (".yaml", ".yml"):
            write_atomic(path, json.dumps(data, indent=1) + "\n")
            return
        data["layers"] = [_OneLine(layer) for layer in data["layers"]]
        write_atomic(path, yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=None, width=1 << 16))

    @property
    def mtp_layers(self) -> list[str]:
        """The names of the model's MTP layers (``Layer.mtp``), in order."""
        return [layer.name for layer in self.layers if layer.mtp]

    def total_flops(self) -> float:
        """FLOPs of F, B and W over every layer, for one microbatch on one device."""
        total = 0.0
        for layer in self.layers:
            if layer.flops_f is None or layer.flops_b is None or layer.flops_w is None:
                raise InputError(f"model {self.name}: layer {layer.name} has no FLOPs (only estimates record them)")
            total += layer.flops_f + layer.flops_b + layer.flops_w
        return total

    def flops_per_token(self) -> float:
        """Training FLOPs (F + B + W) per token of the whole model, over every device of a tensor- and
        context-parallel group."""
        if self.setting is None:
            raise InputError(f"model {self.name} has no setting: its tokens per microbatch are unknown")
        return self.total_flops() * self.setting.tp * (self.setting.cp or 1) / self.setting.tokens
