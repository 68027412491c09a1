"""Helpers that several test modules share, on the runtimes zbsolve exports to: Megatron's arguments (the flags
megatron-core's config takes, the export's flags read back), torchtitan's (the export's files, its config parsed by
its own ConfigManager, its llama3 imported on CPU torch), and small Hugging Face configs of MoE models. Test
modules import them through conftest: ``from conftest import DEEPSEEK``."""

from __future__ import annotations

import importlib.util
import json
import shlex
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from zbsolve.io.targets import export_document

# -- Megatron ------------------------------------------------------------------------------------------------------

MEGATRON_CORE_FIELDS = {
    "--tensor-model-parallel-size": "tensor_model_parallel_size",
    "--pipeline-model-parallel-size": "pipeline_model_parallel_size",
    "--context-parallel-size": "context_parallel_size",
    "--expert-model-parallel-size": "expert_model_parallel_size",
    "--expert-tensor-parallel-size": "expert_tensor_parallel_size",
    "--sequence-parallel": "sequence_parallel",
    "--bf16": "bf16",
    "--fp16": "fp16",
    "--fp8-format": "fp8",
    "--fp8-recipe": "fp8_recipe",
    "--pipeline-model-parallel-layout": "pipeline_model_parallel_layout",
    "--recompute-granularity": "recompute_granularity",
    "--recompute-method": "recompute_method",
    "--recompute-num-layers": "recompute_num_layers",
    "--overlap-moe-expert-parallel-comm": "overlap_moe_expert_parallel_comm",
    "--delay-wgrad-compute": "delay_wgrad_compute",
    "--moe-token-dispatcher-type": "moe_token_dispatcher_type",
    "--moe-flex-dispatcher-backend": "moe_flex_dispatcher_backend",
}
"""The export's flags that Megatron-LM (tag core_v0.16.1, ``megatron/training/arguments.py`` l.1621:
``ArgumentGroupFactory(TransformerConfig)``, a flag per field, ``--`` + the name with dashes) makes from megatron-core's
``TransformerConfig`` (with ``ModelParallelConfig``'s fields), by field; ``--fp8-format`` is its Transformer-Engine
group's, ``dest="fp8"`` (test_export_setting's ``MEGATRON_LM_DESTS``)."""


def megatron_flags(args: list[str]) -> dict[str, str | bool]:
    """Megatron's arguments by flag, a flag without a value as True."""
    flags: dict[str, str | bool] = {}
    for i, arg in enumerate(args):
        if arg.startswith("--"):
            flags[arg] = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else True
    return flags


# -- torchtitan ----------------------------------------------------------------------------------------------------

def torchtitan_export(tmp_path: Path, doc: Path, **kwargs: Any) -> tuple[dict, list[str], list[str]]:
    """The torchtitan export of ``doc`` into ``tmp_path/tt``: its JSON settings, its arguments file split into
    arguments, and the notes it gave."""
    folder, notes = tmp_path / "tt", []
    export_document(doc, "torchtitan", folder, note=notes.append, **kwargs)
    return (json.loads((folder / "torchtitan.json").read_text()),
            shlex.split((folder / "torchtitan-args.txt").read_text()), notes)


def import_llama3() -> types.ModuleType:
    """``torchtitan.models.llama3``. torchtitan 0.3.0's models import the Triton kernels of its MoE token dispatcher
    (``torchtitan/distributed/minimal_async_ep/kernels.py``), and CPU torch comes without triton: where triton is
    not installed, that one module is imported against a stand-in whose decorators return the functions as they are
    (a dense llama3 never runs them), and the stand-in is removed again, so nothing else sees it."""
    if importlib.util.find_spec("triton") is None and "torchtitan.distributed.minimal_async_ep.kernels" not in \
            sys.modules:
        class Anything:
            def __call__(self, *args: Any, **kwargs: Any) -> Any:
                return args[0] if len(args) == 1 and callable(args[0]) and not kwargs else Anything()

            def __getattr__(self, name: str) -> Any:
                if name.startswith("__"):
                    raise AttributeError(name)
                return Anything()

        def attribute(name: str) -> Any:
            if name.startswith("__"):
                raise AttributeError(name)
            return Anything()

        triton, language = types.ModuleType("triton"), types.ModuleType("triton.language")
        triton.__getattr__ = language.__getattr__ = attribute  # type: ignore[method-assign]
        triton.language = language  # type: ignore[attr-defined]
        sys.modules.update({"triton": triton, "triton.language": language})
        try:
            import torchtitan.distributed.minimal_async_ep.kernels  # noqa: F401
        finally:
            del sys.modules["triton"], sys.modules["triton.language"]
    import torchtitan.models.llama3 as llama3

    return llama3


def load_torchtitan_config(args: list[str]) -> Any:
    """torchtitan's Trainer.Config from its ConfigManager on llama3's debugmodel with ``args`` (its checks run)."""
    pytest.importorskip("torchtitan", reason="torchtitan is not installed (the dev extra pins 0.3.0)")
    from torchtitan.config.manager import ConfigManager

    import_llama3()
    return ConfigManager().parse_args(["--module", "llama3", "--config", "llama3_debugmodel", *args])


# -- MoE models' Hugging Face configs ------------------------------------------------------------------------------

MIXTRAL = {"model_type": "mixtral", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "intermediate_size": 96, "num_local_experts": 4, "num_experts_per_tok": 2,
           "vocab_size": 128, "tie_word_embeddings": False}
"""Mixtral-shaped: h = 64, a = 4, k = 2 (d = 16), E = 4 experts of f_e = 96, top-2, V = 128."""
DEEPSEEK = {"model_type": "deepseek_v3", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 4, "q_lora_rank": 32, "kv_lora_rank": 16, "qk_nope_head_dim": 16,
            "qk_rope_head_dim": 8, "v_head_dim": 16, "intermediate_size": 128, "moe_intermediate_size": 32,
            "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2, "first_k_dense_replace": 1,
            "n_group": 2, "topk_group": 1, "num_nextn_predict_layers": 1, "vocab_size": 128,
            "tie_word_embeddings": False, "scoring_func": "sigmoid", "topk_method": "noaux_tc", "moe_layer_freq": 1}
"""DeepSeek-V3-shaped: latent attention (q_rank 32, kv_rank 16, heads of 16 + 8 and values of 16), a dense first
block (f = 128), then E = 8 experts of f_e = 32, top-2, one shared expert; one multi-token prediction layer."""
QWEN2_MOE = {"model_type": "qwen2_moe", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "intermediate_size": 128, "moe_intermediate_size": 32, "num_experts": 4,
             "num_experts_per_tok": 2, "shared_expert_intermediate_size": 48, "mlp_only_layers": [0],
             "vocab_size": 128, "tie_word_embeddings": False}
"""Qwen2-MoE-shaped: a dense first block (mlp_only_layers), then experts with a gated shared expert."""
LLAMA = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 100, "tie_word_embeddings": False}
"""Llama-shaped and dense: h = 64, a = 4, k = 2, f = 128, V = 100."""
