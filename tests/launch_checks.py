"""Checks of the launch commands the exports write, by the runtimes' own code: torchrun's part by torch's torchrun
parser, Megatron-LM's part by megatron-core's config classes and the Megatron-LM rules zbsolve encodes, torchtitan's
part by its ConfigManager. Shared by the tests (``from launch_checks import ...``) and ``benchmarks/configure.py``.

Versions: torch's ``torch/distributed/run.py`` (``get_args_parser``), megatron-core 0.16.1 and Megatron-LM at tag
core_v0.16.1 (``megatron/training/arguments.py``), torchtitan 0.3.0 (``torchtitan/config/manager.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import warnings
from collections.abc import Mapping
from pathlib import Path

from zbsolve.base.errors import InputError
from zbsolve.costmodel.hf_config import architecture
from zbsolve.io.targets.megatron.rules import check_rules

SHELL = {"$NODE_RANK": "0", "$MASTER_ADDR": "localhost", "$MASTER_PORT": "29500"}
"""Values for the rendezvous variables the commands leave to the user's shell (node 0's)."""
TRANSFORMER_ENGINE = "2.8.0"
"""The Transformer Engine version megatron-core is told where none is installed (it installs only beside CUDA): the
export's FP8 products are Transformer Engine's, and megatron-core asks its version for FP8 with experts."""
ARGUMENTS = "megatron/training/arguments.py"
MEGATRON_LM_FLAGS = {
    "--seq-length": f"{ARGUMENTS} _add_data_args (megatron-core: GPTDatasetConfig.sequence_length)",
    "--micro-batch-size": "megatron/training/training_config.py TrainingConfig.micro_batch_size",
    "--global-batch-size": "megatron/training/training_config.py TrainingConfig.global_batch_size",
    "--use-distributed-optimizer": f"{ARGUMENTS} (megatron-core: DistributedDataParallelConfig)",
    "--use-megatron-fsdp": f"{ARGUMENTS} (megatron-core: DistributedDataParallelConfig)",
    "--data-parallel-sharding-strategy": f"{ARGUMENTS} (megatron-core: DistributedDataParallelConfig)",
    "--overlap-grad-reduce": f"{ARGUMENTS} (megatron-core: DistributedDataParallelConfig)",
    "--overlap-param-gather": f"{ARGUMENTS} (megatron-core: DistributedDataParallelConfig)",
    "--ckpt-format": f"{ARGUMENTS} _add_checkpointing_args",
    "--group-query-attention": f"{ARGUMENTS} _add_network_size_args (core_transformer_config_from_args: "
                               "num_query_groups where set)",
    "--max-position-embeddings": f"{ARGUMENTS} _add_network_size_args (GPTModel's max_sequence_length)",
    "--position-embedding-type": f"{ARGUMENTS} _add_network_size_args (GPTModel's position_embedding_type)",
    "--rotary-base": f"{ARGUMENTS} _add_network_size_args (GPTModel's rotary_base; a field of "
                     "MLATransformerConfig only)",
    "--use-rope-scaling": f"{ARGUMENTS} _add_network_size_args (GPTModel's rope_scaling)",
    "--rope-scaling-factor": f"{ARGUMENTS} _add_network_size_args (GPTModel's rope_scaling_factor)",
    "--untie-embeddings-and-output-weights": f"{ARGUMENTS} _add_network_size_args (GPTModel's "
                                             "share_embeddings_and_output_weights)",
    "--vocab-size": f"{ARGUMENTS} _add_tokenizer_args",
    "--tokenizer-type": f"{ARGUMENTS} _add_tokenizer_args",
    "--tokenizer-model": f"{ARGUMENTS} _add_tokenizer_args",
    "--data-path": f"{ARGUMENTS} _add_data_args",
    "--train-iters": "megatron/training/training_config.py TrainingConfig.train_iters",
    "--lr": f"{ARGUMENTS} _add_learning_rate_args",
}
"""Megatron-LM's flags the Megatron command writes that megatron-core's ``TransformerConfig`` has no field of the
same name for, each with where Megatron-LM (tag core_v0.16.1) declares it and what takes it in megatron-core."""
TRANSLATED = {"--norm-epsilon": ("layernorm_epsilon", None), "--num-experts": ("num_moe_experts", None),
              "--swiglu": ("gated_linear_unit", True), "--disable-bias-linear": ("add_bias_linear", False),
              "--fp8-format": ("fp8", None)}
"""Megatron-LM's flags that become a ``TransformerConfig`` field of another name, with the value a flag without one
gives (``core_transformer_config_from_args`` in arguments.py: ``layernorm_epsilon = args.norm_epsilon``,
``num_moe_experts = args.num_experts``, ``gated_linear_unit = True`` with ``--swiglu``; ``--disable-bias-linear``
is ``dest="add_bias_linear"``, ``store_false``; ``--fp8-format`` is ``dest="fp8"``)."""


def torchrun(command: str) -> tuple[dict[str, str], argparse.Namespace]:
    """The environment a command sets and its torchrun part parsed by torch's own parser (``SHELL``'s values for
    the rendezvous variables): the program it runs is ``training_script`` (``module`` with ``-m``), its arguments
    ``training_script_args``."""
    from torch.distributed.run import get_args_parser

    words = shlex.split(command)
    env = {}
    while "=" in words[0]:
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    assert words[0] == "torchrun", words[:3]
    return env, get_args_parser().parse_args([SHELL.get(word, word) for word in words[1:]])


def _flags(args: list[str]) -> dict[str, str | list[str] | bool]:
    """Megatron's arguments by flag: a flag without a value True, one with several values their list."""
    flags: dict[str, str | list[str] | bool] = {}
    for i, arg in enumerate(args):
        if arg.startswith("--"):
            values = []
            for value in args[i + 1:]:
                if value.startswith("--"):
                    break
                values.append(value)
            flags[arg] = True if not values else values[0] if len(values) == 1 else values
    return flags


def _value(name: str, value: object) -> object:
    """A flag's value as Megatron-LM's parser types it: whole numbers, decimals, ``--moe-layer-freq``'s list
    expression (its ``moe_freq_type`` evaluates it)."""
    if not isinstance(value, str):
        return value
    if name == "moe_layer_freq":
        return eval(value, {"__builtins__": {}})  # noqa: S307 (Megatron-LM's own reading of the flag)
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            continue
    return value


def megatron_core_values(args: list[str], kind: type) -> dict[str, object] | str:
    """``args``' values of ``kind``'s fields (a flag of its field's name, or ``TRANSLATED``), or why a flag is
    neither such a field nor one of ``MEGATRON_LM_FLAGS``."""
    fields = {f.name: str(f.type) for f in dataclasses.fields(kind)}
    values: dict[str, object] = {}
    for flag, value in _flags(args).items():
        name, given = TRANSLATED.get(flag, (flag[2:].replace("-", "_"), None))
        if flag in MEGATRON_LM_FLAGS:
            continue
        if name not in fields:
            return f"{flag} is neither a field of megatron-core's {kind.__name__} nor a Megatron-LM flag"
        if value is True and given is not None:
            value = given
        if "List" in fields[name] and isinstance(value, str) and name != "moe_layer_freq":
            value = [value]  # Megatron-LM's nargs="+": one value is a list
        values[name] = _value(name, value)
    return values


def megatron_core_refusal(args: list[str], config: dict | str | Path, gpus: int,
                          num_microbatches: int) -> str | None:
    """Why megatron-core 0.16.1 does not take ``pretrain_gpt.py``'s ``args`` for the model of ``config`` on ``gpus``
    GPUs, or None: every flag a field of its ``TransformerConfig`` (``MLATransformerConfig`` for latent
    attention), run through its checks with the model's own sizes where no flag gives them, or one of
    ``MEGATRON_LM_FLAGS``; its microbatch calculator gives ``num_microbatches``; its
    ``DistributedDataParallelConfig`` takes the sharding flags; and expert x pipeline parallel divides the GPUs
    (``initialize_model_parallel``). Where Transformer Engine is not installed, megatron-core is told
    ``TRANSFORMER_ENGINE``."""
    import torch
    from packaging.version import Version

    with warnings.catch_warnings():  # without Transformer Engine or Apex, megatron-core says it falls back
        warnings.simplefilter("ignore")
        from megatron.core import utils
        from megatron.core.distributed import DistributedDataParallelConfig
        from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator
        from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    if utils.get_te_version() is None:  # not installed: FP8 with experts asks its version
        utils._te_version = Version(TRANSFORMER_ENGINE)
    arch = architecture(config)
    kind = MLATransformerConfig if arch.latent else TransformerConfig
    values = megatron_core_values(args, kind)
    if isinstance(values, str):
        return values
    sizes: dict[str, object] = dict(num_layers=arch.layers, hidden_size=arch.hidden, num_attention_heads=arch.heads,
                                    num_query_groups=arch.kv_heads, ffn_hidden_size=arch.ffn,
                                    kv_channels=arch.head_dim, pipeline_dtype=torch.bfloat16,
                                    mtp_num_layers=arch.mtp or None)
    if arch.experts is not None:
        sizes |= dict(num_moe_experts=arch.experts.routed, moe_router_topk=arch.experts.top_k,
                      moe_ffn_hidden_size=arch.experts.ffn)
    if arch.latent is not None:
        sizes |= dict(multi_latent_attention=True, q_lora_rank=arch.latent.q_rank or None,
                      kv_lora_rank=arch.latent.kv_rank, qk_head_dim=arch.latent.nope,
                      qk_pos_emb_head_dim=arch.latent.rope, v_head_dim=arch.latent.v)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            made = kind(**{**sizes, **values})
    except (AssertionError, ValueError, TypeError) as exc:
        return f"megatron-core's {kind.__name__} refuses it: {exc}"
    return _parallel_refusal(made, _flags(args), gpus, num_microbatches, DistributedDataParallelConfig,
                             ConstantNumMicroBatchesCalculator)


def _parallel_refusal(made: object, flags: Mapping[str, object], gpus: int, num_microbatches: int,
                      ddp: type, calculator: type) -> str | None:
    """Why megatron-core's parallel state, microbatch calculator or data-parallel config refuse the degrees and
    batch of ``made`` (a ``TransformerConfig``) and ``flags`` on ``gpus`` GPUs, or None."""
    replica = made.tensor_model_parallel_size * made.context_parallel_size * made.pipeline_model_parallel_size
    if gpus % replica:
        return f"{gpus} GPUs are not a multiple of tp x cp x pp = {replica}"
    if gpus % (made.expert_model_parallel_size * (made.expert_tensor_parallel_size or 1)
               * made.pipeline_model_parallel_size):
        return "expert-tensor x expert x pipeline parallel does not divide the GPUs"
    counted = calculator(int(flags["--global-batch-size"]), int(flags["--micro-batch-size"]), gpus // replica,
                         False, 0).get()
    if counted != num_microbatches:
        return f"megatron-core's calculator makes {counted} microbatches, the plan {num_microbatches}"
    try:
        ddp(use_distributed_optimizer="--use-distributed-optimizer" in flags,
            use_megatron_fsdp="--use-megatron-fsdp" in flags, overlap_grad_reduce="--overlap-grad-reduce" in flags,
            overlap_param_gather="--overlap-param-gather" in flags,
            data_parallel_sharding_strategy=flags.get("--data-parallel-sharding-strategy", "no_shard"))
    except (AssertionError, ValueError, TypeError) as exc:
        return f"megatron-core's DistributedDataParallelConfig refuses it: {exc}"
    return None


def megatron_command_refusal(command: str, config: dict | str | Path, gpus: int, num_microbatches: int,
                             gpu: str) -> str | None:
    """Why the Megatron export's ``torchrun ... pretrain_gpt.py`` ``command`` does not launch the model of
    ``config`` on ``gpus`` GPUs of preset ``gpu``, or None: torch's torchrun parser takes its torchrun part (on
    ``gpus`` processes in all), Megatron-LM's rules (``check_rules``) take ``pretrain_gpt.py``'s arguments with the
    command's environment, and megatron-core takes them (``megatron_core_refusal``)."""
    env, run = torchrun(command)
    if run.module or run.training_script != "pretrain_gpt.py":
        return f"torchrun runs {run.training_script!r}, not pretrain_gpt.py"
    if int(run.nproc_per_node) * int(run.nnodes) < gpus:
        return f"torchrun starts {run.nproc_per_node} x {run.nnodes} processes for {gpus} GPUs"
    args = list(run.training_script_args)
    try:
        check_rules(args, {**env, "WORLD_SIZE": str(gpus)}, gpu)
    except InputError as exc:
        return str(exc)
    return megatron_core_refusal(args, config, gpus, num_microbatches)


def torchtitan_command_config(command: str) -> tuple[argparse.Namespace, object]:
    """The torchtitan export's ``torchrun ... -m torchtitan.train`` ``command``: its torchrun part parsed by torch's
    parser, and torchtitan's ``Trainer.Config`` that its ConfigManager makes of the arguments after
    ``-m torchtitan.train`` (its checks run)."""
    from helpers import import_llama3
    from torchtitan.config.manager import ConfigManager

    _, run = torchrun(command)
    assert run.module and run.training_script == "torchtitan.train", (run.module, run.training_script)
    import_llama3()  # torchtitan's models without triton (helpers.import_llama3)
    return run, ConfigManager().parse_args(list(run.training_script_args))
