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
import math
from pathlib import Path

from zbsolve.costmodel import context, counting, moe, recompute_modules
from zbsolve.costmodel.block import Part, core_flops
from zbsolve.base.checks import check_count
from zbsolve.base.errors import InputError
from zbsolve.costmodel.constants import (BUCKET_PARAMS, DTYPE_BYTES, FP8_WEIGHT_BYTES, GRAD_BYTES, OPTIMIZER_BYTES,
                                         P2P_LATENCY, WEIGHT_BYTES)
from zbsolve.costmodel.gpus import LINKS, Gpu, get_gpu
from zbsolve.costmodel.hf_config import Architecture, architecture, attended_pairs
from zbsolve.costmodel.kernels import Kernels, Matmul, fp8_casts, fp8_saved
from zbsolve.costmodel.layer_costs import (LayerCosts, Shard, embedding_costs, hiding, norm_costs,
                                                  output_costs, probability_bytes, with_counts)
from zbsolve.core.profile import paper_deltas
from zbsolve.costmodel.model import Layer, Link, Model, ModuleCost, Setting, StepEnd

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


def estimate(config: dict | str | Path, *, gpu: str | Gpu = "h100", seq_len: int, microbatch_size: int, tp: int = 1,
             dp: int = 1, zero: int = 0, dtype: str = "bf16", efficiency: float | None = None,
             flash_attention: bool = True, link: str = "nvlink", name: str | None = None,
             source: str | None = None, method: str = "formula", ep: int = 1,
             a2a_link: str | None = None, cp: int = 1, overlap_grad_reduce: bool = False,
             overlap_param_gather: bool = False, step: bool | None = None, dispatcher: str = "alltoall",
             tp_comm_overlap: bool = False) -> Model:
    """The model description of a Hugging Face config under the cost model of ``docs/cost-model.md``.

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
    FP8 for the backward.
    """
    if method not in METHODS:
        raise InputError(f"method = {method!r}: should be one of {', '.join(METHODS)}")
    arch = architecture(config)
    device = gpu if isinstance(gpu, Gpu) else get_gpu(gpu)
    for what, value in (("seq_len", seq_len), ("microbatch_size", microbatch_size), ("tp", tp), ("dp", dp),
                        ("ep", ep), ("cp", cp)):
        check_count(what, value)
    if zero not in (0, 1, 3) or isinstance(zero, bool):
        raise InputError(f"zero = {zero!r}: should be 0, 1 or 3")
    replicas = dp * cp
    moe.check(arch, method, tp * replicas if zero else 0, ep, a2a_link, dispatcher)
    context.check(seq_len, cp, flash_attention, method)
    if dtype not in DTYPE_BYTES:
        raise InputError(f"dtype = {dtype!r}: should be one of {', '.join(DTYPE_BYTES)}")
    if dtype == "fp8" and device.fp8_flops is None:
        raise InputError(f"dtype = 'fp8': the {device.name} has no FP8 tensor cores")
    if efficiency is not None and (isinstance(efficiency, bool) or not isinstance(efficiency, (int, float))
                                   or not 0 < efficiency <= 1):
        raise InputError(f"efficiency = {efficiency!r}: should be a number in (0, 1], or None for the kernel model")
    if link not in LINKS:
        raise InputError(f"link = {link!r}: should be one of {', '.join(LINKS)}")
    if arch.positions and seq_len > arch.positions:
        raise InputError(f"seq_len = {seq_len}: the config has {arch.positions} learned positions")
    for what, value in moe.split_by_tp(arch):
        if value % tp:
            raise InputError(f"tp = {tp}: {what} = {value} is not a multiple of it")

    tokens, e = seq_len * microbatch_size // cp, DTYPE_BYTES[dtype]
    ring = (tokens * context.kv_bytes(arch, e) // tp / device.link(device.group_link(tp * cp)) + P2P_LATENCY
            if cp > 1 else 0.0)
    shard = Shard(tokens, tp, ep, Kernels(device, dtype), arch.experts.routed if arch.experts else 1, cp, ring)
    costs = (_dense_layers(config, arch, shard, e, seq_len, microbatch_size, flash_attention, method, dtype)
             if arch.experts is None else _expert_layers(arch, shard, e, seq_len, flash_attention, microbatch_size))
    collective = (tp - 1) / tp * tokens * arch.hidden * e / device.nvlink_bytes_per_s + P2P_LATENCY if tp > 1 else 0.0
    exchange = _exchange(device, arch, -(-tokens // tp), e, ep, a2a_link, dispatcher) if ep > 1 else 0.0

    memory_rate = device.hbm_bytes_per_s * (device.memory_fraction if efficiency is None else efficiency)

    def seconds(c: LayerCosts, p: int) -> float:
        compute = (c.kernel[p] if efficiency is None else
                   c.flops[p] / (device.flops * efficiency) + c.traffic[p] / memory_rate)
        return compute + _collectives(c, p, collective, tp_comm_overlap) + (c.all_to_all[p] * exchange
                                                                            if c.all_to_all else 0.0)

    def static(params: int, shards: int) -> int:
        if zero == 3:
            return math.ceil(params * (WEIGHT_BYTES + GRAD_BYTES + OPTIMIZER_BYTES) / shards)
        return params * (WEIGHT_BYTES + GRAD_BYTES) + math.ceil(params * OPTIMIZER_BYTES / shards)

    fp8 = FP8_WEIGHT_BYTES if dtype == "fp8" else 0
    dp_link_name = device.group_link(tp * replicas)
    dp_link = Link(name=dp_link_name, bytes_per_s=device.link(dp_link_name), latency_s=P2P_LATENCY)

    def pass_time(c: LayerCosts, p: int) -> float:
        """Seconds of pass ``p``: its kernels and collectives, the ring's exposed exchange, and under FSDP what of
        its parameters' all-gather (F, B) or its gradients' reduce-scatter (W) outlasts it."""
        t = seconds(c, p) + (c.ring[p] if p < 2 else 0.0)
        if zero != 3:
            return t
        moved = (c.params + c.expert_params) * (GRAD_BYTES if p == 2 else WEIGHT_BYTES)
        return t + max(0.0, dp_link.collective(moved, replicas) - t)

    def layer(n: str, c: LayerCosts) -> Layer:
        return Layer(name=n, block=n.startswith("layers."), t_f=pass_time(c, 0), t_b=pass_time(c, 1),
                     t_w=pass_time(c, 2),
                     **dict(zip(("mem_f", "mem_b", "mem_w"), paper_deltas(max(c.m_b, c.m_w), c.m_w))),
                     static_bytes=static(c.params, replicas if zero else 1)
                     + math.ceil(fp8 * c.fp8_params / (replicas if zero == 3 else 1))
                     + (static(c.expert_params, tp * replicas // ep if zero else 1) if c.expert_params else 0),
                     params=c.params + c.expert_params,
                     gathered_bytes=(c.params + c.expert_params) * (WEIGHT_BYTES + GRAD_BYTES) if zero == 3 else None,
                     out_bytes=c.out_bytes, flops_f=c.flops[0], flops_b=c.flops[1], flops_w=c.flops[2],
                     **({} if c.selective is None else
                        {"t_sel": c.selective[0] / memory_rate,
                         "mem_sel": min(c.selective[1], max(c.m_b, c.m_w))}),
                     **({} if c.modules is None else {"recompute_modules": {
                         name: ModuleCost(t=seconds(again, 0), mem=min(saved, max(c.m_b, c.m_w)))
                         for name, (again, saved) in c.modules.items()}}),
                     shares="tok_embeddings" if n == "output" and arch.tied else None,
                     **({} if c.all_to_all is None else
                        {"comm_f": c.all_to_all[0] * exchange, "comm_b": c.all_to_all[1] * exchange}))

    built: dict[int, Layer] = {}  # blocks of one set of costs: built and checked once, the others renamed copies
    layers = []
    for n, c in costs:
        first = built.get(id(c)) if n.startswith("layers.") else None
        layers.append(layer(n, c) if first is None else first.model_copy(update={"name": n}))
        if first is None and n.startswith("layers."):
            built[id(c)] = layers[-1]
    gpu_name = gpu.lower() if isinstance(gpu, str) else device.name
    where = "config" if isinstance(config, dict) else str(config)  # as read_config names it
    return Model(name=name or (Path(where).stem if where != "config" else "model"),
                 source=source or f"zbsolve.estimate({where}, gpu={gpu_name!r}, seq_len={seq_len}, "
                                  f"microbatch_size={microbatch_size}, tp={tp}, dp={dp}, zero={zero}, "
                                  f"dtype={dtype!r}, efficiency={efficiency}, flash_attention={flash_attention}, "
                                  f"link={link!r}, method={method!r}"
                                  + (f", ep={ep}, a2a_link={a2a_link!r}, dispatcher={dispatcher!r}" if arch.experts
                                     else "") + f", tp_comm_overlap={tp_comm_overlap}"
                                  + (f", cp={cp}" if cp > 1 else "")
                                  + (f", overlap_grad_reduce={overlap_grad_reduce}, "
                                     f"overlap_param_gather={overlap_param_gather}, step={step}"
                                     if replicas > 1 or zero or step else "")
                                  + "); cost model: docs/cost-model.md",
                 link=Link(name=link, bytes_per_s=device.link(link), latency_s=P2P_LATENCY),
                 setting=Setting(seq_len=seq_len, microbatch_size=microbatch_size, tp=tp, dp=dp,
                                 cp=cp if cp > 1 else None, ep=ep if arch.experts else None,
                                 dispatcher=dispatcher if arch.experts else None, zero=zero, dtype=dtype,
                                 gpu=gpu_name, efficiency=efficiency),
                 step=StepEnd(dp=replicas, zero=zero, link=dp_link, hbm_bytes_per_s=device.hbm_bytes_per_s,
                              overlap_grad_reduce=overlap_grad_reduce, overlap_param_gather=overlap_param_gather,
                              bucket_params=max(BUCKET_PARAMS[0], BUCKET_PARAMS[1] * replicas))
                 if (replicas > 1 or zero > 0 if step is None else step) else None,
                 layers=layers)


def _exchange(device: Gpu, arch: Architecture, tokens: int, e: int, ep: int, a2a_link: str | None,
              dispatcher: str) -> float:
    """Seconds of one dispatch or combine of a device's ``tokens``: its NVLink and network bytes
    (``moe.all_to_all_bytes``) sent at once, the slower link's time, or all of them over ``a2a_link``."""
    nvlink, network = moe.all_to_all_bytes(tokens, arch, e, ep, device.gpus_per_node, dispatcher)
    if a2a_link is not None:
        return (nvlink + network) / device.link(a2a_link) + P2P_LATENCY
    return max(nvlink / device.nvlink_bytes_per_s, network / device.network_bytes_per_s) + P2P_LATENCY


def _collectives(c: LayerCosts, p: int, collective: float, overlap: bool) -> float:
    """Seconds pass ``p`` of ``c`` spends in tensor-parallel collectives of ``collective`` seconds each: all of
    them, or under overlap what each shows past the time it can hide behind (``LayerCosts.hiding``)."""
    if not overlap:
        return c.collectives[p] * collective
    hidden = c.hiding[p]
    return sum(max(0.0, collective - g) for g in hidden) + (c.collectives[p] - len(hidden)) * collective


def _dense_layers(config: dict | str | Path, arch: Architecture, shard: Shard, e: int, seq_len: int,
                  microbatch_size: int, flash_attention: bool, method: str, dtype: str) -> list[tuple[str, LayerCosts]]:
    """A dense decoder's layers by name: one set of block costs for each distinct sliding window, counted by
    torch with ``method`` "count"."""
    windows = saving_windows(arch, seq_len, flash_attention)
    kinds = list(dict.fromkeys(windows))  # the blocks' distinct windows: one set of block costs each
    ends = [embedding_costs(arch, shard, e), norm_costs(arch, shard, e), output_costs(arch, shard, e)]
    blocks = [_from_part(moe.block(arch, e, 0), arch, shard, e, seq_len, flash_attention,
                         microbatch_size * attended_pairs(seq_len, w), recompute_modules.modules(arch, e, 0))
              for w in kinds]
    if method == "count":
        counted = counting.count(config, seq_len=seq_len, microbatch_size=microbatch_size, dtype=dtype,
                                 flash_attention=flash_attention, blocks=[windows.index(w) for w in kinds])
        ends = [with_counts(part, counts, shard.tp) for part, counts in
                zip(ends, (counted.embedding, counted.norm, counted.output))]
        blocks = [with_counts(part, counts, shard.tp) for part, counts in zip(blocks, counted.blocks)]
    block_of = dict(zip(kinds, blocks))
    return ([("tok_embeddings", ends[0])] + [(f"layers.{i}", block_of[w]) for i, w in enumerate(windows)]
            + [("norm", ends[1]), ("output", ends[2])])


def _expert_layers(arch: Architecture, shard: Shard, e: int, seq_len: int, flash_attention: bool,
                   microbatch_size: int) -> list[tuple[str, LayerCosts]]:
    """A mixture-of-experts decoder's layers by name: the embedding, its blocks (with experts or a dense MLP),
    its multi-token prediction layers ``mtp.j``, the final norm and the head. Blocks of one kind (experts or not,
    one window) share one set of costs."""
    kinds: dict[tuple[bool, int | None], LayerCosts] = {}

    def block(index: int, window: int | None) -> LayerCosts:
        assert arch.experts is not None
        kind = arch.experts.layers[min(index, arch.layers - 1)], window
        if kind not in kinds:
            scores = microbatch_size * attended_pairs(seq_len, window)
            kinds[kind] = _from_part(moe.block(arch, e, index), arch, shard, e, seq_len, flash_attention, scores,
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
    those memory-bound kernels again in B; Megatron's modules (``redone``) each run their part again. Its kernels:
    the part's products by shape, the core at flash attention's rate, the memory-bound kernels' bytes; under
    FP8 the FP8 products' inputs are kept in FP8 (``kernels.fp8_saved``) and their casts move bytes
    (``kernels.fp8_casts``)."""
    n, t, kernels = shard.tokens, shard.tp, shard.kernels
    core = core_flops(arch) * scores // (t * shard.cp)
    f, b, w = (n * flops // t for flops in part.flops)
    probabilities = probability_bytes(arch, e, seq_len, flash_attention)
    attention = kernels.attention(core, arch.head_dim, seq_len // shard.cp, flash_attention)

    def products(matmuls: tuple[Matmul, ...]) -> tuple[float, float, float]:
        times = [kernels.matmul(mm, n, t, shard.ep, shard.experts) for mm in matmuls]
        return tuple(map(sum, zip(*times))) if times else (0.0, 0.0, 0.0)  # type: ignore[return-value]

    def hidden(matmuls: tuple[Matmul, ...], collectives: tuple[int, int, int]) -> tuple[tuple[float, ...], ...]:
        return (((), (), ()) if t == 1 else
                hiding(matmuls, [kernels.matmul(mm, n, t, shard.ep, shard.experts) for mm in matmuls], collectives, t))

    def again(r: recompute_modules.Redo) -> tuple[LayerCosts, int]:
        redo = products(r.matmuls)[0] + attention[0] * r.core + kernels.memory(shard.bytes(
            r.traffic + r.elementwise + casts(r.matmuls)[0]))
        return (LayerCosts(flops=(n * r.flops // t + core * r.core, 0, 0), traffic=(shard.bytes(r.traffic), 0, 0),
                       collectives=(r.collectives if t > 1 else 0, 0, 0), m_b=0, m_w=0, params=0, out_bytes=0,
                       all_to_all=(r.all_to_all, 0, 0) if r.all_to_all else None, kernel=(redo, 0.0, 0.0),
                       hiding=hidden(r.matmuls, (r.collectives, 0, 0))),  # type: ignore[arg-type]
                shard.bytes(r.saved + probabilities * r.core))

    def casts(matmuls: tuple[Matmul, ...]) -> tuple[int, int, int]:
        return fp8_casts(matmuls, e) if kernels.dtype == "fp8" else (0, 0, 0)

    gemm = products(part.matmuls)
    kernel = tuple(g + a + kernels.memory(shard.bytes(x + c))
                   for g, a, x, c in zip(gemm, (*attention, 0.0), part.elementwise, casts(part.matmuls)))
    fp8 = fp8_saved(part.matmuls, e) if kernels.dtype == "fp8" else (0, 0)
    fp8_params = sum(mm.k * mm.n // (t if mm.split in ("column", "row") else 1)
                     * (shard.experts // shard.ep if mm.split == "expert" else 1) for mm in part.matmuls if mm.fp8)
    return LayerCosts(flops=(f + core, b + 2 * core, w), traffic=(0, 0, 0),
                  collectives=part.collectives if t > 1 else (0, 0, 0),
                  hiding=hidden(part.matmuls, part.collectives),  # type: ignore[arg-type]
                  m_b=shard.bytes(part.saved + fp8[0] + probabilities),
                  m_w=shard.bytes(part.for_w + fp8[1]), params=-(-part.split // t) + part.whole,
                  out_bytes=shard.bytes(arch.hidden * e), selective=tuple(map(shard.bytes, part.recomputed)),
                  expert_params=part.experts // shard.ep,
                  all_to_all=(part.all_to_all, part.all_to_all, 0) if part.all_to_all else None,
                  modules=None if redone is None else {name: again(r) for name, r in redone.items()},
                  kernel=kernel, fp8_params=fp8_params,  # type: ignore[arg-type]
                  ring=context.exposed(attention, shard.ring, shard.cp) if core else (0.0, 0.0))


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
        return tuple(map(sum, zip(*(getattr(part, field) for part in parts))))  # type: ignore[return-value]

    return LayerCosts(flops=total("flops"), traffic=total("traffic"), collectives=total("collectives"),
                  m_b=sum(part.m_b for part in parts), m_w=sum(part.m_w for part in parts),
                  params=sum(part.params for part in parts), out_bytes=shard.bytes(arch.hidden * e),
                  expert_params=block.expert_params, all_to_all=block.all_to_all, kernel=total("kernel"),
                  hiding=tuple(sum((part.hiding[p] for part in parts), ()) for p in range(3)),  # type: ignore[arg-type]
                  fp8_params=entry.fp8_params + block.fp8_params, ring=block.ring)

