"""Megatron's combined 1F1B: the expert-parallel all-to-all of one microbatch's F overlapped with another's B
(``--overlap-moe-expert-parallel-comm --delay-wgrad-compute``, megatron-core >= 0.14), where it runs, and its
arguments.

Checked against megatron-core 0.16.1: ``megatron/core/transformer/transformer_config.py``
(``TransformerConfig.__post_init__``: the checks of ``overlap_moe_expert_parallel_comm`` and ``delay_wgrad_compute``),
``megatron/core/pipeline_parallel/schedules.py`` (``get_pp_rank_microbatches``: one more warm-up forward;
``forward_backward_helper_wrapper``: each steady-state step's F and B run together by
``combined_1f1b.combined_1f1b_schedule_for_interleaved_pipelining``) and
``megatron/core/models/gpt/fine_grained_callables.py`` (with the overlap, a MoE layer runs as its parts: route,
dispatch, experts, combine).
"""

from __future__ import annotations

from collections.abc import Sequence

from zbsolve.costmodel.model import Model

COMBINED_FLAGS = ("--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute")
"""The arguments that make Megatron run combined 1F1B: the overlap and the weight gradients it delays (with the
setting's token dispatcher, alltoall or flex, which the export writes for every model with experts:
``megatron.DISPATCHER_FLAGS``; megatron-core's default, allgather, is refused)."""
OVERLAP_DTYPES = ("bf16", "fp16", "fp8")
"""The ``Setting.dtype`` values combined 1F1B runs with (``bf16 or fp16``: fp8's weights are BF16, ``--bf16``
beside ``--fp8-format``, as in DeepSeek-V3's and Qwen3's FP8 recipes with the overlap)."""


def combined_refusal(model: Model, num_devices: int, chunks: int, full: bool,
                     modules: Sequence[str] = ()) -> str | None:
    """Why Megatron cannot run combined 1F1B for ``model`` (its setting) over ``num_devices`` pipeline ranks with
    ``chunks`` virtual stages each, blocks recomputed whole (``full``) and ``modules`` recomputed in every block, or
    None. megatron-core 0.16.1's ``TransformerConfig`` refuses, in its order: pipeline parallelism without virtual
    stages; an expert-parallel size of 1 (and a model without experts has none); full recomputation, a
    ``--recompute-method`` or ``--recompute-num-layers`` (zbsolve's blocks recomputed whole are all three); neither
    bf16 nor fp16; more than one MTP layer, or one without pipeline parallelism. zbsolve adds one: no ``moe`` among
    the recomputed modules, as megatron-core then runs a MoE layer's parts itself and never the checkpoint of
    ``MoELayer.forward``, so the bytes the cost model frees stay held. The dispatcher (alltoall or flex) is the
    setting's; ``moe_shared_expert_overlap`` off and no CUDA graphs are megatron-core's defaults; torch >= 2.6 and
    Transformer Engine >= 2.3 are the installation's."""
    setting = model.setting
    if setting is None:
        return "the model has no setting: its expert-parallel size and dtype are unknown"
    if num_devices > 1 and chunks == 1:
        return (f"pipeline parallelism over {num_devices} ranks needs virtual stages (interleaved, 2 or more stages "
                "per rank)")
    if (setting.ep or 1) == 1 or not any(layer.experts for layer in model.layers):
        return "it needs expert parallelism (a model with experts, ep > 1)"
    if full:
        return "blocks are recomputed whole (--recompute-granularity full)"
    if setting.dtype not in OVERLAP_DTYPES:
        return f"dtype = {setting.dtype!r}: it runs bf16, fp16 or fp8 (BF16 weights) only"
    mtp = len(model.mtp_layers)
    if mtp > 1:
        return f"the model has {mtp} MTP layers: it runs at most one"
    if mtp and num_devices == 1:
        return "an MTP layer needs pipeline parallelism with it"
    if "moe" in modules:
        return ("'moe' is among the recomputed modules, which it runs as its parts without MoELayer.forward's "
                "checkpoint")
    return None
