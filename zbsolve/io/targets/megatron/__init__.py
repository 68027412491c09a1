"""The Megatron target: its row of the target table, and its export of a plan as Megatron's pipeline and
recomputation arguments (docs/torch.md); Megatron's combined 1F1B is in ``overlap``.

Checked against megatron-core 0.16.1 from PyPI: ``megatron/core/transformer/pipeline_parallel_layer_layout.py``
(``PipelineParallelLayerLayout``: stage i on pipeline rank i % pp, looped only),
``megatron/core/transformer/transformer_block.py`` (``TransformerBlock._checkpointed_forward``: the recompute
methods, per block of one virtual stage), ``megatron/core/transformer/transformer_config.py``
(``recompute_granularity``, ``recompute_method``, ``recompute_num_layers``, which Megatron-LM's
``megatron/training/arguments.py`` makes its ``--recompute-*`` arguments) and
``megatron/core/pipeline_parallel/schedules.py`` (its own 1F1B and interleaved 1F1B orders; tag core_v0.16.1,
55ac708). The setting's arguments are Megatron-LM's at the same tag (``megatron/training/arguments.py``, which makes
``--tensor-model-parallel-size`` ... ``--bf16`` from megatron-core's ``ModelParallelConfig`` fields and
``--micro-batch-size``, ``--global-batch-size`` from ``megatron/training/training_config.py``; ``--seq-length`` and
``--use-distributed-optimizer``, ``--use-megatron-fsdp`` and ``--data-parallel-sharding-strategy`` it declares itself,
megatron-core's ``DistributedDataParallelConfig`` fields, whose Megatron FSDP shards over the data-parallel group with
context parallelism: ``distributed/fsdp/mcore_fsdp_adapter.py``), and ``megatron/core/parallel_state.py``
(``initialize_model_parallel``: the data-parallel size is the world size over tp x cp x pp; expert-tensor x expert
x pipeline parallel must divide the world size) and ``num_microbatches_calculator.py`` (global batch / (micro-batch
size x dp) microbatches).
"""

from __future__ import annotations

import shlex
from pathlib import Path

from zbsolve.base.errors import InputError
from zbsolve.base.files import write_atomic
from zbsolve.costmodel.model import RECOMPUTE_MODULES, Model, Setting
from zbsolve.io.targets.export import Export, Request
from zbsolve.io.targets.megatron.launch import megatron_command
from zbsolve.io.targets.megatron.layout import grouped_layout, megatron_layout
from zbsolve.io.targets.megatron.overlap import COMBINED_FLAGS, combined_refusal
from zbsolve.io.targets.plan import Plan, counted
from zbsolve.io.targets.target import Target
from zbsolve.problem.recompute import Recompute, leading_counts
from zbsolve.schedulers.builtins import COMBINED, megatron_builtin

MEGATRON_CORE_VERSION = "0.16.1"
"""The megatron-core release whose layout parser and recompute methods the Megatron export was checked with."""
MODULE_RECIPES = ("modules:core_attn", "modules:mlp", "modules:mla_up_proj,mlp", "modules:layernorm,moe_act")
"""The module choices ``plan --recompute auto --target megatron`` times, where the model's blocks have them and they
save bytes (``planning.targets.recompute_choices``): Megatron-LM's default (core_attn), the dense MLP, DeepSeek-V3's
recipe (mla_up_proj, mlp) and the norms with the experts' activation functions."""


def megatron_schedule(chunks: int) -> str:
    """torch's built-in schedule of Megatron-core's order with ``chunks`` virtual stages per device.

    Megatron-core 0.16.1, ``megatron/core/pipeline_parallel/schedules.py``: without interleaving
    (``forward_backward_pipelining_without_interleaving``) rank r warms up with pp - r - 1 forwards, then runs one
    forward and one backward until it drains: torch's ``Schedule1F1B``. With interleaving
    (``forward_backward_pipelining_with_interleaving``) rank r warms up with (pp - r - 1) * 2 + (chunks - 1) *
    ``microbatch_group_size_per_vp_stage`` (pp unless set) forwards, and visits its chunks in groups of that many
    microbatches (``get_schedule_table``), the backwards' chunks reversed: torch's ``ScheduleInterleaved1F1B``,
    whose warm-up is (chunks - 1) * ``microbatches_per_round`` + 2 * (pp - 1 - r) with rounds of pp microbatches
    when pp divides m, which Megatron needs (``MEGATRON.grouped_microbatches``)."""
    return megatron_builtin(chunks)


def megatron_order(model: Model, num_devices: int, chunks: int, recompute: Recompute) -> str:
    """The built-in schedule of the order Megatron runs ``model`` in over ``num_devices`` pipeline ranks with
    ``chunks`` virtual stages each and ``recompute``: combined 1F1B (``COMBINED``) where it runs it with the
    export's ``COMBINED_FLAGS`` (``combined_refusal`` is None: blocks recomputed whole are its full
    recomputation), else ``megatron_schedule``.

    With ``--delay-wgrad-compute`` the weight gradients still run inside the combined step that runs the backward
    (``models/common/model_chunk_schedule_plan.py``: each layer's MLP weight gradient right after its MLP backward,
    its attention's after its attention backward), so the pair's backward is a whole BW. One simplification: the
    first layer's attention weight gradient runs after the stage sends its input gradient, which zbsolve sends at
    the BW's end."""
    full = recompute.mode != "none"
    if combined_refusal(model, num_devices, chunks, full, recompute.modules) is None:
        return COMBINED
    return megatron_schedule(chunks)


MEGATRON = Target(
    name="megatron", label=f"Megatron (megatron-core {MEGATRON_CORE_VERSION})",
    placements={"sequential": (1,), "interleaved": None}, order="own", own_schedule=megatron_order,
    recompute=("none", "full", "uniform"), selective=False, selective_experts=False,
    auto_recompute=("none", "full", "uniform:1", "uniform:2", *MODULE_RECIPES), pairs=False, mtp=True,
    grouped_microbatches=True, layout_only=True,
    source="megatron/core/transformer/pipeline_parallel_layer_layout.py, transformer_block.py, "
           "pipeline_parallel/schedules.py, parallel_state.py, transformer_config.py (recompute_modules)",
    modules=RECOMPUTE_MODULES, paired_orders=(COMBINED,))
"""Megatron builds looped placements from its layout, runs its own 1F1B or interleaved 1F1B order on them (the
interleaved one in groups of pp microbatches), recomputes the first N blocks of every (virtual) stage, one N for all,
or some of its modules in every block (``--recompute-modules``: no MLP activation function alone, so not zbsolve's
selective), overlaps F&B pairs only in its combined 1F1B, where its flags are written (``megatron_order``), and places
MTP layers in the last virtual stage of their rank."""


def megatron_recompute(plan: Plan) -> list[str]:
    """Megatron's recomputation arguments for ``plan``'s recomputed blocks: ``--recompute-granularity selective
    --recompute-modules M ...`` for its modules (and ``--moe-grouped-gemm``, which megatron-core's
    ``TransformerConfig`` needs for ``moe_act``); none when no block recomputes;
    ``--recompute-granularity full --recompute-method uniform --recompute-num-layers 1`` when every block does;
    ``... --recompute-method block --recompute-num-layers N`` when every stage recomputes its first N blocks (all
    of them where it has N or fewer).

    In megatron-core's ``TransformerBlock._checkpointed_forward`` (one block per virtual stage), ``block``
    checkpoints each of the stage's first N layers alone and ``uniform`` checkpoints groups of N layers; with N = 1
    both keep each layer's input and recompute one layer's forward inside its backward, zbsolve's per-block cost
    model. ``uniform`` with N > 1 keeps only each group's input and holds the whole group's recomputed activations
    at once, which the cost model does not describe, so it is never written. Megatron takes one N for every stage:
    recomputed blocks that are not the first of their stage, or a different N per stage, are an ``InputError``
    naming the stages' counts. The target table's refusals (``Plan.check``) come first."""
    plan.check(MEGATRON)
    if plan.modules:
        return (["--recompute-granularity", "selective", "--recompute-modules", *plan.modules]
                + ["--moe-grouped-gemm"] * ("moe_act" in plan.modules))
    if not plan.recomputed:
        return []
    stages = plan.stage_recompute()
    names = [layer.name for layer in plan.model.layers]
    leading = leading_counts([blocks for blocks, _ in stages], plan.recomputed)
    if isinstance(leading, int):
        shown = [", ".join(names[i] for i in indices) for indices in stages[leading][::-1]]
        raise InputError(f"partition.recompute: stage {leading} recomputes [{shown[0]}] of its blocks [{shown[1]}], "
                         "not the first ones; Megatron's --recompute-method block recomputes the first N blocks of "
                         "every stage")
    counts = [(n, len(blocks)) for n, (blocks, _) in zip(leading, stages)]
    partial = {n for n, total in counts if n < total}
    if not partial:
        return ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    n = max(partial)
    if len(partial) > 1 or any(total > n for m, total in counts if m == total):
        raise InputError(f"partition.recompute: {counted(stages)}; Megatron's --recompute-num-layers N recomputes the "
                         "first N blocks of every stage, one N for all")
    return ["--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", str(n)]


DTYPE_FLAGS = {"bf16": ([], ["--bf16"]), "fp16": ([], ["--fp16"]),
               "fp8": (["--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"], ["--bf16"]), "fp32": ([], [])}
"""Megatron's arguments for each ``Setting.dtype``, valued and flags: fp8 is Transformer Engine's FP8 products with
BF16 weights (``--fp8-format hybrid``, Megatron-LM's ``dest="fp8"``: E4M3 forward, E5M2 gradients, beside
``--bf16``) with per-tensor current scaling (``--fp8-recipe tensorwise``, Megatron-Bridge's FP8 recipes'; delayed
scaling, megatron-core's default, refuses recomputing the norms and the experts' activation functions), fp32 none
(its default)."""
DISPATCHER_FLAGS = {"alltoall": ["--moe-token-dispatcher-type", "alltoall"],
                    "flex": ["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", "deepep"]}
"""Megatron's arguments for each ``Setting.dispatcher`` (None: alltoall), as the costs count the all-to-all:
its alltoall dispatcher, or its flex dispatcher with DeepEP (megatron-core's default, allgather, is not modelled)."""
SETTING_FLAGS = ("--tensor-model-parallel-size", "--context-parallel-size", "--expert-model-parallel-size",
                 "--expert-tensor-parallel-size", "--moe-token-dispatcher-type", "--moe-flex-dispatcher-backend",
                 "--seq-length", "--micro-batch-size", "--global-batch-size", "--data-parallel-sharding-strategy",
                 "--ckpt-format",
                 "--fp8-format", "--fp8-recipe", "--bf16", "--fp16", "--sequence-parallel",
                 "--use-distributed-optimizer", "--use-megatron-fsdp")
"""The arguments ``megatron_args`` takes from the plan's setting ("partition.setting")."""


def megatron_args(plan: Plan) -> list[str]:
    """Megatron's arguments for ``plan``: ``--pipeline-model-parallel-size`` p, ``--pipeline-model-parallel-layout``
    (``layout.megatron_layout`` in Megatron's grouped form, ``layout.grouped_layout``), ``megatron_recompute``'s
    and, where the document has the setting
    the costs are for, ``megatron_setting``'s (the valued ones first, the flags that take no value last), with
    ``COMBINED_FLAGS`` before those flags where Megatron runs combined 1F1B (``combined_refusal`` is None, as
    ``megatron_order`` decides). Megatron places stage i on pipeline rank i % p, so any other placement (a V-shape,
    DualPipe's two routes) is an ``InputError`` naming ``MEGATRON``'s row, and so is what else the row refuses, and
    a combined 1F1B document where Megatron does not run it. The arguments give Megatron the partition, placement,
    recomputation and setting; it runs its own schedule on them (``megatron_order``)."""
    placement = plan.schedule.placement
    _, chunks = plan.check(MEGATRON)
    why = combined_refusal(plan.model, placement.num_devices, chunks, bool(plan.recomputed), plan.modules)
    if why is not None and plan.schedule.name == COMBINED:
        raise InputError(f"schedule {COMBINED}: Megatron runs combined 1F1B only where its conditions hold: {why}")
    layout = grouped_layout(megatron_layout(plan.model, plan.stages, placement.num_devices))
    sizes, batch, switches = megatron_setting(plan.model.setting, plan.schedule.num_microbatches)
    return [*sizes[:2], "--pipeline-model-parallel-size", str(placement.num_devices), *sizes[2:], *batch,
            "--pipeline-model-parallel-layout", layout, *megatron_recompute(plan),
            *(COMBINED_FLAGS if why is None else ()), *switches]


def megatron_setting(setting: Setting | None, num_microbatches: int) -> tuple[list[str], list[str], list[str]]:
    """The arguments of ``setting`` for a step of ``num_microbatches``: the parallel sizes (tensor, context, expert
    with experts whole, ``--expert-tensor-parallel-size 1``, and the token dispatcher, ``DISPATCHER_FLAGS``, for a
    model with experts, and ``--data-parallel-sharding-strategy optim_grads_params`` with ``--ckpt-format
    fsdp_dtensor``, which Megatron-LM's ``validate_args`` asks of Megatron FSDP, for ZeRO-3), the batch
    (``--seq-length``, ``--micro-batch-size``, ``--global-batch-size`` = micro-batch size x microbatches x dp, then
    the dtype's valued arguments: ``DTYPE_FLAGS``) and the flags (``--bf16``/``--fp16``, ``--sequence-parallel``
    where tp > 1: the cost model divides every activation over the tensor-parallel group,
    ``--use-distributed-optimizer`` for ZeRO-1 and ZeRO-3, with ``--use-megatron-fsdp`` for ZeRO-3: Megatron FSDP
    shards weights, gradients and optimizer states over dp x cp and runs its optimizer step in megatron-core's
    ``DistributedOptimizer``); none without a setting."""
    if setting is None:
        return [], [], []
    sizes = ["--tensor-model-parallel-size", str(setting.tp), "--context-parallel-size", str(setting.cp or 1)]
    if setting.ep is not None:
        sizes += ["--expert-model-parallel-size", str(setting.ep), "--expert-tensor-parallel-size", "1",
                  *DISPATCHER_FLAGS[setting.dispatcher or "alltoall"]]
    if setting.zero == 3:
        sizes += ["--data-parallel-sharding-strategy", "optim_grads_params", "--ckpt-format", "fsdp_dtensor"]
    batch = ["--seq-length", str(setting.seq_len), "--micro-batch-size", str(setting.microbatch_size),
             "--global-batch-size", str(setting.global_batch(num_microbatches))]
    valued, flags = DTYPE_FLAGS.get(setting.dtype, ([], []))
    batch += valued
    switches = [*flags, *(["--sequence-parallel"] if setting.tp > 1 else []),
                *(["--use-distributed-optimizer"] if setting.zero else []),
                *(["--use-megatron-fsdp"] if setting.zero == 3 else [])]
    return sizes, batch, switches


def megatron_notes(plan: Plan) -> list[str]:
    """Lines for the user on what ``megatron_args`` could not write or Megatron takes from elsewhere: the setting's
    arguments without one, a dtype Megatron has no flag for, the world size to launch on, an expert-parallel size
    megatron-core's ranks cannot hold, and Megatron-LM's own conditions on Megatron FSDP."""
    setting, m = plan.model.setting, plan.schedule.num_microbatches
    if setting is None:
        return [f"partition.setting is missing (the model has no setting): the line has no "
                f"{', '.join(SETTING_FLAGS)}; add those of the setting the plan's costs are for (--global-batch-size = "
                f"micro-batch size x {m} microbatches x data-parallel size)"]
    p, cp = plan.schedule.num_devices, setting.cp or 1
    notes = [f"Megatron takes the data-parallel size from the world size: launch on tp x cp x pp x dp = {setting.tp} "
             f"x {cp} x {p} x {setting.dp} = {setting.tp * cp * p * setting.dp} GPUs, so that --global-batch-size "
             f"{setting.global_batch(m)} is {m} microbatches of {setting.microbatch_size} per "
             "data-parallel rank, the plan's"]
    if setting.dtype not in DTYPE_FLAGS:
        notes.append(f"partition.setting.dtype = {setting.dtype!r} is not written: Megatron's flags are --bf16, "
                     "--fp16, --fp8-format hybrid --fp8-recipe tensorwise with --bf16 (fp8) or none (fp32)")
    ranks = setting.tp * cp * setting.dp
    if setting.ep is not None and ranks % setting.ep:
        notes.append(f"--expert-model-parallel-size {setting.ep} with --expert-tensor-parallel-size 1 needs tp x cp x "
                     f"dp = {ranks} ranks per pipeline stage to be a multiple of {setting.ep} (megatron-core's "
                     "initialize_model_parallel refuses it otherwise)")
    if setting.zero == 3 and plan.launch is None:
        notes.append("--use-megatron-fsdp: Megatron-LM's validate_args (megatron/training/arguments.py l.687) asks "
                     "for CUDA_DEVICE_MAX_CONNECTIONS other than 1")
    return notes


def megatron_launch(plan: Plan) -> tuple[str, list[str]]:
    """The line ``megatron_export`` prints and the lines for the user: where the document says what to launch
    (``Plan.launch``), ``launch.megatron_command``'s ``torchrun ... pretrain_gpt.py`` command with every argument
    and its notes (an ``InputError`` where Megatron-LM's rules refuse it: ``rules``); else ``megatron_args`` as
    one shell line and ``megatron_notes``."""
    args = megatron_args(plan)
    setting = plan.model.setting
    if plan.launch is None or setting is None:
        return shlex.join(args), megatron_notes(plan)
    command, notes = megatron_command(args, plan.launch, setting.seq_len)
    return command, megatron_notes(plan)[1:] + notes


def megatron_export(plan: Plan) -> str:
    """Megatron's launch of ``plan`` (``megatron_launch``): the command, or the arguments as one shell line."""
    return megatron_launch(plan)[0]


def write_args(request: Request) -> tuple[list[Path], str]:
    """The request's plan as ``megatron_launch``'s line, written to its output where it has one, and its notes to
    the request's ``note``; returns the file written (if any) and the line."""
    plan = request.plan()
    text, notes = megatron_launch(plan)
    if request.output is not None:
        write_atomic(request.output, text + "\n")
    note = request.note
    if note is not None:
        for line in notes:
            note(line)
    return ([] if request.output is None else [Path(request.output)]), text


EXPORT = Export(target=MEGATRON, format="megatron", rank=2, write=write_args, takes=megatron_args, output="optional")
"""The Megatron target in the registry: its arguments, one shell line, printed without an output."""
