"""Estimated costs: a ``Model`` from a Hugging Face ``config.json`` of a dense decoder (Llama, Mistral, Qwen2,
GPT-2, GPT-NeoX) or of a mixture-of-experts one (Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V2/V3), whose blocks'
parts come from ``zbsolve.costmodel.block`` and ``zbsolve.costmodel.moe`` (the other layers' from
``zbsolve.costmodel.layer_costs``), and the closed-form cost model of ``docs/cost-model.md``: each pass's
kernels timed by ``zbsolve.costmodel.kernels`` (products by shape, flash attention, memory-bound kernels;
or, with an explicit efficiency, FLOPs over a share of the peak), FP8 products under Transformer Engine's recipe,
activation bytes after Korthikanti et al. 2022, static bytes of mixed-precision Adam after the ZeRO paper,
expert-parallel all-to-alls over NVLink or the network. Every figure is per device of the tensor-parallel group. With
``method="count"`` the FLOPs and activation bytes are counted by torch on the transformers model instead
(``zbsolve.costmodel.counting``); the rest stays the closed form's. The config is read by
``zbsolve.costmodel.hf_config``.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

from zbsolve.base.errors import InputError
from zbsolve.costmodel import context, counting, eager, moe, recompute_modules
from zbsolve.costmodel.block import Part, core_flops
from zbsolve.costmodel.communication import expert_exchange, group_link, link_of, ring_step, tp_collective
from zbsolve.costmodel.constants import (
    BUCKET_PARAMS,
    COMBINE_KEPT_COPIES,
    DTYPE_BYTES,
    FP8_GATHER_BYTES,
    FP8_WEIGHT_BYTES,
    FSDP_REDUCE_BYTES,
    GRAD_BYTES,
    OPTIMIZER_BYTES,
    WEIGHT_BYTES,
)
from zbsolve.costmodel.hf_config import Architecture, architecture, attended_pairs
from zbsolve.costmodel.kernels import Kernels, Matmul, fp8_casts, fp8_saved, product_launches
from zbsolve.costmodel.layer_costs import (
    Hiding,
    LayerCosts,
    Shard,
    embedding_costs,
    hiding,
    norm_costs,
    output_costs,
    probability_bytes,
    with_counts,
)
from zbsolve.costmodel.memory import Memory
from zbsolve.costmodel.model import Layer, Model, ModuleCost, StepEnd
from zbsolve.costmodel.setup import Setup
from zbsolve.costmodel.time import Timing

METHODS = ("formula", "count")
"""Where FLOPs and activation bytes come from: the closed form (the default), or counted by torch on the
transformers model."""


def saving_windows(arch: Architecture, seq_len: int, flash_attention: bool) -> list[int | None]:
    """Each block's sliding window where it saves work (it is shorter than the sequence and flash attention skips
    the pairs outside it), None elsewhere: without flash attention all s² scores are computed and kept."""
    return [w if flash_attention and w is not None and w < seq_len else None for w in arch.windows]


def count_parameters(config: Architecture | dict | str | Path, active: bool = False) -> int:
    """Parameters of the whole model (tied embedding weights counted once; a multi-token prediction layer's own,
    its embedding and head being the model's), or with ``active`` those a token uses (top_k of the routed
    experts)."""
    return _count_parameters(config if isinstance(config, Architecture) else architecture(config), active)


@functools.lru_cache(maxsize=64)
def _count_parameters(arch: Architecture, active: bool) -> int:
    """``count_parameters`` of ``arch``, counted once per architecture."""
    head = 0 if arch.tied else arch.vocab * arch.hidden
    parts = [moe.block(arch, 1, i) for i in range(arch.layers)] + [moe.projection(arch, 1) + moe.block(
        arch, 1, arch.layers) for _ in range(arch.mtp)]
    blocks = sum(moe.active(part, arch) if active else part.params for part in parts)
    return arch.embedding_params + blocks + (1 + arch.mtp) * arch.norm_params + head


def reference_flops_per_token(config: Architecture | dict | str | Path, seq_len: int,
                              flash_attention: bool = True) -> float:
    """Training FLOPs per token by the usual rule, 6·N + 12·L·a·d·s (N parameters; PaLM, Chowdhery et al. 2022,
    appendix B), to compare an estimate's total with; a block whose sliding window saves work counts
    ``attended_pairs / s`` keys a query for s. With experts N is the active parameters (and a multi-token
    prediction layer's use of the head), and attention 3·(F's core FLOPs a pair)·s a block."""
    arch = config if isinstance(config, Architecture) else architecture(config)
    pairs = sum(attended_pairs(seq_len, w) for w in saving_windows(arch, seq_len, flash_attention))
    pairs += arch.mtp * seq_len * seq_len
    head = arch.mtp * arch.vocab * arch.hidden
    return 6 * (count_parameters(arch, active=True) + head) + 3 * core_flops(arch) * pairs / seq_len


def estimate(config: dict | str | Path, setup: Setup | None = None, *, name: str | None = None,
             source: str | None = None, step: bool | None = None, **knobs: Any) -> Model:
    """The model description of a Hugging Face config under the cost model of ``docs/cost-model.md``, for the
    training ``setup`` (or a ``Setup`` of the ``knobs`` given instead: ``gpu``, ``seq_len``, ``microbatch_size``,
    ``tp``, ...).

    ``tp`` divides compute, weights and activations (Megatron-LM's tensor parallelism with sequence parallelism);
    ``cp`` splits each sequence (``zbsolve.costmodel.context``: ring attention); ``zero=1`` shards the
    optimizer states over the ``dp`` x ``cp`` replicas, ``zero=3`` (FSDP) also the weights and gradients, each layer
    gathering its parameters before F and B and reduce-scattering its gradients after W, each transfer overlapped
    with the passes of the layer before it (FSDP2's prefetching): only what outlasts its pass is added to it.
    With ``step`` (None: where there are several replicas or ZeRO) ``Model.step`` says how the step ends
    (``costmodel.step_tail``), with Megatron's ``overlap_grad_reduce`` and ``overlap_param_gather``; each layer
    records its ``params``. ``link`` ("nvlink" or "network") carries the activations between stages. Layers are
    named as torchtitan names them: ``tok_embeddings``, ``layers.0``, ..., ``norm``, ``output``. A block whose
    sliding window is shorter than ``seq_len`` counts the attention scores of ``attended_pairs`` under flash
    attention. ``method`` (``METHODS``): "count" takes each layer's FLOPs and activation bytes from
    ``zbsolve.costmodel.counting`` (divided over ``tp``, rounded up) and the rest from the closed form.

    A mixture-of-experts config (``moe``) spreads its routed experts over ``ep`` devices, whole (not split by
    ``tp``), and runs two all-to-alls in F and two in B of each block with experts, their seconds in t_f and t_b and
    recorded as the layer's comm_f and comm_b: the copies to the device's node over NVLink and the others over the
    network at once (``moe.all_to_all_bytes``, by ``dispatcher``: "alltoall" a copy per expert, "flex" once per
    node under node-limited routing), or every byte over ``a2a_link`` where given; DeepSeek-V3's multi-token
    prediction layers follow the blocks as ``mtp.0``, ...

    ``tp_comm_overlap`` hides each tensor-parallel collective behind the product beside it, up to that product's
    time (``hiding``: Transformer Engine's userbuffers overlap, torch's AsyncTP); off by default, as in both
    runtimes, every collective then adds its time.

    Times come from each pass's kernels (``zbsolve.costmodel.kernels``); an ``efficiency`` in (0, 1] times
    FLOPs and the end layers' HBM bytes at that share of the preset's BF16 peaks instead. ``dtype="fp8"`` runs the
    linear layers' products in FP8 (Transformer Engine), keeps their FP8 weight copies and saves their inputs in
    FP8 for the backward. ``source`` (default: the call, from the setup) says how the costs were obtained.
    """
    if setup is None:
        setup = Setup(**knobs)
    elif knobs:
        raise InputError(f"estimate: give a setup or its knobs ({', '.join(knobs)}), not both")
    if setup.method not in METHODS:
        raise InputError(f"method = {setup.method!r}: should be one of {', '.join(METHODS)}")
    arch = architecture(config)
    _check(arch, setup)
    timing, memory, costs = _parts(config, arch, setup)
    where = "config" if isinstance(config, dict) else str(config)  # as read_config names it
    tail = step if step is not None else setup.replicas > 1 or setup.zero > 0
    return Model(name=name or (Path(where).stem if where != "config" else "model"),
                 source=source or f"zbsolve.estimate({where}, {_arguments(setup)}); cost model: docs/cost-model.md",
                 link=link_of(setup.device, setup.link), setting=setup.setting(arch.experts is not None),
                 step=_step_end(setup) if tail else None, layers=_layers(costs, arch, timing, memory))


def _arguments(setup: Setup) -> str:
    """The setup's knobs that differ from their defaults, as keyword arguments (the GPU always)."""
    changed = {"gpu": setup.gpu_name, **setup.changed()}
    changed.pop("config", None)
    changed["gpu"] = setup.gpu_name
    return ", ".join(f"{key}={value!r}" for key, value in changed.items())


def _check(arch: Architecture, setup: Setup) -> None:
    """Refuse what the architecture cannot run under ``setup``: the experts' degrees and links, the
    context-parallel split, a sequence past the learned positions, a tensor-parallel degree that does not divide
    the heads."""
    tp = setup.tp
    moe.check(arch, setup.method, tp * setup.replicas if setup.zero else 0, setup.ep, setup.a2a_link,
              setup.dispatcher)
    context.check(setup.seq_len, setup.cp, setup.flash_attention, setup.method)
    if not setup.compile and not eager.takes(arch):
        raise InputError("compile = False: eager kernels are counted for torchtitan's Llama block alone (dense, "
                         "grouped-query attention without q/k norms or biases, a SwiGLU MLP)")
    if arch.positions and setup.seq_len > arch.positions:
        raise InputError(f"seq_len = {setup.seq_len}: the config has {arch.positions} learned positions")
    for what, value in moe.split_by_tp(arch):
        if value % tp:
            raise InputError(f"tp = {tp}: {what} = {value} is not a multiple of it")


def _parts(config: dict | str | Path, arch: Architecture, setup: Setup
           ) -> tuple[Timing, Memory, list[tuple[str, LayerCosts]]]:
    """The timing and the memory of ``setup``, and each layer's costs by name."""
    device, tp, cp, zero = setup.device, setup.tp, setup.cp, setup.zero
    tokens, e = setup.seq_len * setup.microbatch_size // cp, DTYPE_BYTES[setup.dtype]
    kernels = Kernels(device, setup.dtype, setup.calibrated)
    shard = Shard(tokens, tp, setup.ep, kernels, arch.experts.routed if arch.experts else 1,
                  cp, ring_step(device, arch, tokens, e, tp, cp), setup.runtime)
    costs = (_dense_layers(config, arch, shard, e, setup) if arch.experts is None else
             _expert_layers(arch, shard, e, setup.seq_len, setup.flash_attention, setup.microbatch_size,
                            moe.sorts(setup.dispatcher, arch.experts.routed // setup.ep)))
    exchange = expert_exchange(device, arch, -(-tokens // tp), e, setup.ep, setup.a2a_link, setup.dispatcher)
    timing = Timing(device, setup.efficiency, tp_collective(device, arch, tokens, e, tp), exchange,
                    setup.tp_comm_overlap, group_link(device, setup.replicas, tp) if zero == 3 else None,
                    setup.replicas, (WEIGHT_BYTES, GRAD_BYTES), setup.calibrated.scale("launch"))
    fp8, torchao = setup.dtype == "fp8", setup.runtime == "torchtitan"
    memory = Memory(WEIGHT_BYTES, GRAD_BYTES, OPTIMIZER_BYTES, FP8_WEIGHT_BYTES if fp8 and not torchao else 0,
                    zero, setup.replicas, tp * setup.replicas // setup.ep,
                    FP8_GATHER_BYTES if fp8 and torchao else WEIGHT_BYTES, FSDP_REDUCE_BYTES[setup.runtime])
    return timing, memory, costs


def _step_end(setup: Setup) -> StepEnd:
    """How a step of ``setup`` ends: its data-parallel synchronisation over its group's link, and the optimizer."""
    replicas = setup.replicas
    return StepEnd(dp=replicas, zero=setup.zero_stage, link=group_link(setup.device, replicas, setup.tp),
                   hbm_bytes_per_s=setup.device.hbm_bytes_per_s, overlap_grad_reduce=setup.overlap_grad_reduce,
                   overlap_param_gather=setup.overlap_param_gather,
                   bucket_params=max(BUCKET_PARAMS[0], BUCKET_PARAMS[1] * replicas),
                   interference=setup.device.interference)


def _layers(costs: list[tuple[str, LayerCosts]], arch: Architecture, timing: Timing, memory: Memory) -> list[Layer]:
    """The layers of ``costs``: blocks of one set of costs built and checked once, the others renamed copies."""
    built: dict[int, Layer] = {}
    layers = []
    for n, c in costs:
        first = built.get(id(c)) if n.startswith("layers.") else None
        layers.append(_layer(n, c, arch, timing, memory) if first is None else first.model_copy(update={"name": n}))
        if first is None and n.startswith("layers."):
            built[id(c)] = layers[-1]
    return layers


def _layer(n: str, c: LayerCosts, arch: Architecture, timing: Timing, memory: Memory) -> Layer:
    """Layer ``n`` of costs ``c``: its passes' seconds, its activation and static bytes, its recomputation's."""
    t_sel, mem_sel = (None, None) if c.selective is None else (c.selective[0] / timing.memory_rate,
                                                               memory.dropped(c, c.selective[1]))
    modules = None if c.modules is None else {
        module: ModuleCost(t=timing.seconds(again, 0), mem=memory.dropped(c, saved))
        for module, (again, saved) in c.modules.items()}
    mem_f, mem_b, mem_w = memory.activations(c)
    comm_f, comm_b = timing.comm(c)
    _, grads, states = memory.static_parts(c)
    return Layer(name=n, block=n.startswith("layers."), t_f=timing.pass_time(c, 0), t_b=timing.pass_time(c, 1),
                 t_w=timing.pass_time(c, 2), mem_f=mem_f, mem_b=mem_b, mem_w=mem_w,
                 static_bytes=memory.static_bytes(c), grad_bytes=grads or None, optimizer_bytes=states or None,
                 params=c.params + c.expert_params, gathered_bytes=memory.gathered_bytes(c),
                 gathered_grad_bytes=memory.gathered_grad_bytes(c), out_bytes=c.out_bytes, held_b=c.held_b or None,
                 flops_f=c.flops[0], flops_b=c.flops[1], flops_w=c.flops[2], t_sel=t_sel, mem_sel=mem_sel,
                 recompute_modules=modules, shares="tok_embeddings" if n == "output" and arch.tied else None,
                 comm_f=comm_f, comm_b=comm_b)


def _dense_layers(config: dict | str | Path, arch: Architecture, shard: Shard, e: int,
                  setup: Setup) -> list[tuple[str, LayerCosts]]:
    """A dense decoder's layers by name: one set of block costs for each distinct sliding window, counted by
    torch with ``method`` "count"."""
    seq_len, microbatch_size, flash_attention = setup.seq_len, setup.microbatch_size, setup.flash_attention
    windows = saving_windows(arch, seq_len, flash_attention)
    kinds = list(dict.fromkeys(windows))  # the blocks' distinct windows: one set of block costs each
    ends = [embedding_costs(arch, shard, e), norm_costs(arch, shard, e), output_costs(arch, shard, e)]
    part = moe.block(arch, e, 0)
    if not setup.compile:
        part = dataclasses.replace(part, elementwise=eager.llama_block(arch, e)[0],
                                   launches=eager.llama_block(arch, e)[1])
    blocks = [_from_part(part, arch, shard, e, seq_len, flash_attention,
                         microbatch_size * attended_pairs(seq_len, w), recompute_modules.modules(arch, e, 0, part))
              for w in kinds]
    if setup.method == "count":
        counted = counting.count(config, seq_len=seq_len, microbatch_size=microbatch_size, dtype=setup.dtype,
                                 flash_attention=flash_attention, blocks=[windows.index(w) for w in kinds])
        ends = [with_counts(part, counts, shard.tp) for part, counts in
                zip(ends, (counted.embedding, counted.norm, counted.output))]
        blocks = [with_counts(part, counts, shard.tp) for part, counts in zip(blocks, counted.blocks)]
    block_of = dict(zip(kinds, blocks))
    return ([("tok_embeddings", ends[0])] + [(f"layers.{i}", block_of[w]) for i, w in enumerate(windows)]
            + [("norm", ends[1]), ("output", ends[2])])


def _expert_layers(arch: Architecture, shard: Shard, e: int, seq_len: int, flash_attention: bool,
                   microbatch_size: int, sort: bool) -> list[tuple[str, LayerCosts]]:
    """A mixture-of-experts decoder's layers by name: the embedding, its blocks (with experts or a dense MLP; the
    dispatch sorting by local expert with ``sort``, ``moe.sorts``), its multi-token prediction layers ``mtp.j``,
    the final norm and the head. Blocks of one kind (experts or not, one window) share one set of costs."""
    kinds: dict[tuple[bool, int | None], LayerCosts] = {}

    def block(index: int, window: int | None) -> LayerCosts:
        assert arch.experts is not None
        kind = arch.experts.layers[min(index, arch.layers - 1)], window
        if kind not in kinds:
            scores = microbatch_size * attended_pairs(seq_len, window)
            part = moe.block(arch, e, index, sort, COMBINE_KEPT_COPIES[shard.runtime])
            kinds[kind] = _from_part(part, arch, shard, e, seq_len, flash_attention, scores,
                                     recompute_modules.modules(arch, e, index))
        return kinds[kind]

    windows = saving_windows(arch, seq_len, flash_attention)
    blocks = [(f"layers.{i}", block(i, w)) for i, w in enumerate(windows)]
    last = block(arch.layers, None)
    mtp = [(f"mtp.{j}", _mtp(arch, shard, e, last, first=j == 0)) for j in range(arch.mtp)]
    return ([("tok_embeddings", embedding_costs(arch, shard, e))] + blocks + mtp
            + [("norm", norm_costs(arch, shard, e)), ("output", output_costs(arch, shard, e))])


def _from_part(part: Part, arch: Architecture, shard: Shard, e: int, seq_len: int, flash_attention: bool,
               scores: int, redone: dict[str, recompute_modules.Redo] | None = None) -> LayerCosts:
    """A block's costs per device from its per-token ``part``: FLOPs and bytes of the device's 1/tp of the
    tokens (its experts receive as many as it sends), the attention core over ``scores`` pairs (the microbatch's
    attended_pairs, b·s² without a window) in F and twice in B, none in W, the routed experts' parameters over
    ``ep``. Selective recomputation drops the outputs of the norms and of the MLP's activation function and runs
    those memory-bound kernels again in B; Megatron's modules (``redone``) each run their part again, and
    torchtitan's per-op policy its products and kernels there, F keeping only the bytes it names (``Redo.kept``).
    Its kernels: the part's products by shape, the core at flash attention's rate, the memory-bound kernels' bytes;
    under FP8 the FP8 products' inputs are kept in FP8 (``kernels.fp8_saved``) and their casts move bytes
    (``kernels.fp8_casts``). Its kernels launched: the part's memory-bound ones, its products' and casts'
    (``kernels.product_launches``), flash attention's core (one in F, three in B: FlashAttention-2's backward
    preprocessing, main and dq conversion kernels)."""
    n, t, kernels = shard.tokens, shard.tp, shard.kernels
    core = core_flops(arch) * scores // (t * shard.cp)
    f, b, w = (n * flops // t for flops in part.flops)
    probabilities = probability_bytes(arch, e, seq_len, flash_attention)
    attention = kernels.attention(core, arch.head_dim, seq_len // shard.cp, flash_attention)
    fp8 = fp8_saved(part.matmuls, e) if kernels.dtype == "fp8" else (0, 0)
    m_b = shard.bytes(part.saved + fp8[0] + probabilities)

    def products(matmuls: tuple[Matmul, ...]) -> tuple[float, float, float]:
        times = [kernels.matmul(mm, n, t, shard.ep, shard.experts) for mm in matmuls]
        if not times:
            return 0.0, 0.0, 0.0
        f, b, w = map(sum, zip(*times))
        return f, b, w

    def hidden(matmuls: tuple[Matmul, ...], collectives: tuple[int, int, int]) -> Hiding:
        return (((), (), ()) if t == 1 else
                hiding(matmuls, [kernels.matmul(mm, n, t, shard.ep, shard.experts) for mm in matmuls], collectives, t))

    def again(r: recompute_modules.Redo) -> tuple[LayerCosts, int]:
        redo = products(r.matmuls)[0] + attention[0] * r.core + kernels.memory(shard.bytes(
            r.traffic + r.elementwise + casts(r.matmuls)[0]))
        return (LayerCosts(flops=(n * r.flops // t + core * r.core, 0, 0), traffic=(shard.bytes(r.traffic), 0, 0),
                       collectives=(r.collectives if t > 1 else 0, 0, 0), m_b=0, m_w=0, params=0, out_bytes=0,
                       all_to_all=(r.all_to_all, 0, 0) if r.all_to_all else None, kernel=(redo, 0.0, 0.0),
                       hiding=hidden(r.matmuls, (r.collectives, 0, 0)),
                       launches=(r.launches, 0, 0)),
                shard.bytes(r.saved + probabilities * r.core) if r.kept is None
                else max(0, m_b - shard.bytes(r.kept + probabilities)))

    def casts(matmuls: tuple[Matmul, ...]) -> tuple[int, int, int]:
        return fp8_casts(matmuls, e) if kernels.dtype == "fp8" else (0, 0, 0)

    gemm = products(part.matmuls)
    k_f, k_b, k_w = (g + a + kernels.memory(shard.bytes(x + c))
                     for g, a, x, c in zip(gemm, (*attention, 0.0), part.elementwise, casts(part.matmuls)))
    launched = product_launches(part.matmuls, shard.experts // shard.ep, kernels.dtype == "fp8")
    launches = (part.launches[0] + launched[0] + (core > 0), part.launches[1] + launched[1] + 3 * (core > 0),
                part.launches[2] + launched[2])
    fp8_params = sum(mm.k * mm.n // (t if mm.split in ("column", "row") else 1)
                     * (shard.experts // shard.ep if mm.split == "expert" else 1) for mm in part.matmuls if mm.fp8)
    return LayerCosts(flops=(f + core, b + 2 * core, w), traffic=(0, 0, 0),
                  collectives=part.collectives if t > 1 else (0, 0, 0),
                  hiding=hidden(part.matmuls, part.collectives),
                  m_b=m_b,
                  m_w=shard.bytes(part.for_w + fp8[1]), params=-(-part.split // t) + part.whole,
                  out_bytes=shard.bytes(arch.hidden * e),
                  selective=(shard.bytes(part.recomputed[0]), shard.bytes(part.recomputed[1])),
                  expert_params=part.experts // shard.ep,
                  all_to_all=(part.all_to_all, part.all_to_all, 0) if part.all_to_all else None,
                  modules=None if redone is None else {name: again(r) for name, r in redone.items()},
                  kernel=(k_f, k_b, k_w), fp8_params=fp8_params,
                  ring=context.exposed(attention, shard.ring, shard.cp) if core else (0.0, 0.0), launches=launches)


def _mtp(arch: Architecture, shard: Shard, e: int, block: LayerCosts, first: bool) -> LayerCosts:
    """A multi-token prediction layer (DeepSeek-V3, after the blocks and before the final norm, where
    Megatron-LM's pipeline layout puts it): the next tokens' embedding (the first holds a copy of the
    embedding's weights, as Megatron-LM's last stage does), its projection, a block of the last block's kind, its
    own norm and the loss through the head of ``output`` (whose weights it shares); it passes the blocks' hidden
    state on to ``norm``."""
    entry = _from_part(moe.projection(arch, e), arch, shard, e, 0, True, 0)
    embedding, head = embedding_costs(arch, shard, e), output_costs(arch, shard, e)
    parts = [embedding if first else dataclasses.replace(embedding, params=0), entry, block, norm_costs(arch, shard, e),
             dataclasses.replace(head, params=0)]

    def total(field: str) -> tuple[int, int, int]:
        f, b, w = map(sum, zip(*(getattr(part, field) for part in parts)))
        return f, b, w

    return LayerCosts(flops=total("flops"), traffic=total("traffic"), collectives=total("collectives"),
                  m_b=sum(part.m_b for part in parts), m_w=sum(part.m_w for part in parts),
                  params=sum(part.params for part in parts), out_bytes=shard.bytes(arch.hidden * e),
                  expert_params=block.expert_params, all_to_all=block.all_to_all, kernel=total("kernel"),
                  hiding=(_joined(parts, 0), _joined(parts, 1), _joined(parts, 2)),
                  fp8_params=entry.fp8_params + block.fp8_params, ring=block.ring, launches=total("launches"))


def _joined(parts: list[LayerCosts], p: int) -> tuple[float, ...]:
    """Pass ``p``'s hiding seconds (``LayerCosts.hiding``) of ``parts``, one part's after the other's."""
    return sum((part.hiding[p] for part in parts), ())

