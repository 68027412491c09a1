"""The Megatron launch: the layout in Megatron's grouped form, the model's arguments from its Hugging Face config,
Megatron-LM's argument rules (each broken and kept) and the torchrun command of a document with a "launch"
section."""

from __future__ import annotations

import json
import random
import shlex
from pathlib import Path

import pytest
from conftest import LLAMA, export_toy, megatron_flags

from zbsolve.base.errors import InputError
from zbsolve.costmodel.model import Model, Setting
from zbsolve.io.targets import export_document
from zbsolve.io.targets.launch import Launch
from zbsolve.io.targets.megatron.layout import grouped_layout, parse_layout
from zbsolve.io.targets.megatron.model_args import model_arguments
from zbsolve.io.targets.megatron.rules import RULES, check_rules
from zbsolve.optimize.solve import solve

ROOT = Path(__file__).resolve().parent.parent
LLAMA_70B = ROOT / "problems" / "models" / "configs" / "llama3-70b.json"


# -- the grouped layout --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("flat,grouped", [
    ("Et|" + "t*2|" * 46 + "t|L", "Et|(t*2|)*46t|L"),
    ("Et*4|t*5|t*4|t*4|t*4|t*4|t*4|t*3L", "Et*4|t*5|(t*4|)*5t*3L"),
    ("E|t|t|t|t|t|L", "E|(t|)*5L"),
    ("Et*32L", "Et*32L"),
    ("Et|t|t*2|t|t*2|t|t*2|tL", "Et|(t|t*2|)*3tL"),
])
def test_grouped_layout_is_shortest_and_parses_the_same(flat: str, grouped: str) -> None:
    assert grouped_layout(flat) == grouped
    assert parse_layout(grouped) == parse_layout(flat)


def test_grouped_layout_round_trips_through_megatron_core() -> None:
    """megatron-core 0.16.1's own parser reads the grouped form as the stage-by-stage one, over random layouts."""
    mod = pytest.importorskip("megatron.core.transformer.pipeline_parallel_layer_layout",
                              reason="megatron-core is not installed (the dev extra pins 0.16.1)")
    parse = mod.PipelineParallelLayerLayout.parse_str_to_list
    rng = random.Random(0)
    for _ in range(200):
        stages = [rng.choice(["t", "t*2", "t*3"]) for _ in range(rng.randrange(1, 40))]
        flat = "|".join(["E" + stages[0], *stages[1:-1], stages[-1] + "mL"] if len(stages) > 1 else
                        ["E" + stages[0] + "L"])
        grouped = grouped_layout(flat)
        assert parse(grouped) == parse(flat) and len(grouped) <= len(flat)


# -- the model's arguments -----------------------------------------------------------------------------------------

def test_llama3_70b_arguments() -> None:
    flags = megatron_flags(model_arguments(LLAMA_70B, 8192))
    assert flags == {
        "--num-layers": "80", "--hidden-size": "8192", "--ffn-hidden-size": "28672", "--num-attention-heads": "64",
        "--group-query-attention": True, "--num-query-groups": "8", "--max-position-embeddings": "8192",
        "--vocab-size": "128256", "--position-embedding-type": "rope", "--rotary-base": "500000",
        "--normalization": "RMSNorm", "--norm-epsilon": "1e-05", "--swiglu": True,
        "--untie-embeddings-and-output-weights": True, "--disable-bias-linear": True, "--attention-dropout": "0.0",
        "--hidden-dropout": "0.0"}


@pytest.mark.filterwarnings("ignore:full scope is deprecated:UserWarning")
def test_transformer_config_takes_the_model_arguments() -> None:
    """megatron-core's TransformerConfig takes each argument that is one of its fields (Megatron-LM's
    ArgumentGroupFactory flags), with swiglu as its gated linear unit."""
    config = pytest.importorskip("megatron.core.transformer.transformer_config",
                                 reason="megatron-core is not installed (the dev extra pins 0.16.1)")
    flags = megatron_flags(model_arguments(LLAMA_70B, 8192))
    fields = {"--num-layers": "num_layers", "--hidden-size": "hidden_size", "--ffn-hidden-size": "ffn_hidden_size",
              "--num-attention-heads": "num_attention_heads", "--num-query-groups": "num_query_groups",
              "--normalization": "normalization", "--norm-epsilon": "layernorm_epsilon",
              "--attention-dropout": "attention_dropout", "--hidden-dropout": "hidden_dropout"}
    typed = {field: flags[flag] if field == "normalization" else float(flags[flag]) if field.endswith(
        ("epsilon", "dropout")) else int(flags[flag]) for flag, field in fields.items()}
    made = config.TransformerConfig(**typed, add_bias_linear=False, gated_linear_unit=True)
    assert made.num_query_groups == 8 and made.kv_channels == 128 and made.ffn_hidden_size == 28672


def test_refused_configs_name_the_field() -> None:
    with pytest.raises(InputError, match=r"rope_scaling = .*Llama 3's"):
        model_arguments({**LLAMA, "max_position_embeddings": 64, "rope_scaling": {"rope_type": "dynamic",
                                                                                   "factor": 2.0}}, 64)
    with pytest.raises(InputError, match=r"max_position_embeddings = None"):
        model_arguments(LLAMA, 64)


# -- Megatron-LM's rules, each broken and kept -----------------------------------------------------------------------

BASE = ["--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "4", "--seq-length", "4096",
        "--max-position-embeddings", "8192", "--pipeline-model-parallel-layout", "Et|(t|)*6tL", "--bf16"]
"""A command every rule takes."""
CASES = {
    "world size": (["--tensor-model-parallel-size", "3"], {"WORLD_SIZE": "64"}, []),
    "interleaving": (["--pipeline-model-parallel-size", "1", "--pipeline-model-parallel-layout", "Et|tL"], {}, []),
    "overlap param gather": (["--overlap-param-gather"], {}, ["--overlap-param-gather", "--overlap-grad-reduce",
                                                              "--use-distributed-optimizer"]),
    "FSDP connections": (["--use-megatron-fsdp", "--ckpt-format", "fsdp_dtensor"],
                         {"CUDA_DEVICE_MAX_CONNECTIONS": "1"},
                         ["--use-megatron-fsdp", "--ckpt-format", "fsdp_dtensor"]),
    "FSDP checkpoint format": (["--use-megatron-fsdp"], {}, ["--use-megatron-fsdp", "--ckpt-format",
                                                              "fsdp_dtensor"]),
    "bf16 or fp16": (["--fp16"], {}, []),
    "seq length over cp": (["--context-parallel-size", "3", "--seq-length", "4095"], {},
                           ["--context-parallel-size", "2"]),
    "max position embeddings": (["--seq-length", "16384"], {}, []),
    "selective recompute": (["--recompute-granularity", "selective", "--recompute-method", "uniform"], {},
                            ["--recompute-granularity", "selective", "--recompute-modules", "core_attn"]),
    "sequence parallel": (["--sequence-parallel"], {}, []),
    "tp comm overlap": (["--tp-comm-overlap"], {}, []),
    "FSDP beside TP or CP": (["--use-megatron-fsdp", "--ckpt-format", "fsdp_dtensor", "--context-parallel-size",
                              "2"], {}, ["--use-megatron-fsdp", "--ckpt-format", "fsdp_dtensor"]),
    "CUDA_DEVICE_MAX_CONNECTIONS": (["--tensor-model-parallel-size", "2"], {}, []),
    "expert parallelism": (["--expert-model-parallel-size", "4", "--num-experts", "6"], {},
                           ["--expert-model-parallel-size", "4", "--num-experts", "8"]),
    "fsdp_dtensor": (["--ckpt-format", "fsdp_dtensor"], {}, []),
}
"""Per rule: arguments (after BASE) and environment that break it, and arguments that keep it."""


def test_every_rule_has_a_case() -> None:
    assert set(CASES) == set(RULES)


@pytest.mark.parametrize("name", list(CASES))
def test_rule_broken_and_kept(name: str) -> None:
    broken, env, kept = CASES[name]
    rule = RULES[name]
    assert check_rules(BASE + kept, {"CUDA_DEVICE_MAX_CONNECTIONS": "1"} if "--use-megatron-fsdp" not in kept
                       else {}, "h100") == []
    if rule.refuses:
        with pytest.raises(InputError, match=rf"arguments\.py validate_args {rule.line}, {name}\)$"):
            check_rules(BASE + broken, env, "h100")
    else:
        assert any(line.endswith(f"{rule.line}, {name})") for line in check_rules(BASE + broken, env, "h100"))


def test_blackwell_drops_the_connections_rule() -> None:
    assert check_rules([*BASE, "--tensor-model-parallel-size", "2", "--sequence-parallel"], {}, "b200") == []


# -- the command ---------------------------------------------------------------------------------------------------

def _launched(tmp_path: Path, setting: Setting, gpus: int) -> Path:
    """The toy's plan on 2 devices with ``setting``, its document carrying a launch of LLAMA on ``gpus`` GPUs."""
    model = Model(name="toy", layers=export_toy().layers, setting=setting)
    path = tmp_path / "plan.json"
    result = solve(model, num_devices=2, num_microbatches=4, placement="sequential", solver="heuristic")
    data = result.to_json()
    config = {**LLAMA, "num_hidden_layers": 6, "max_position_embeddings": 8192}
    data["launch"] = Launch(config, gpus, 8, "h100", ("overlap_grad_reduce", "overlap_param_gather")).section()
    path.write_text(json.dumps(data))
    return path


def test_the_command_launches_the_plan(tmp_path: Path) -> None:
    setting = Setting(seq_len=4096, microbatch_size=1, tp=2, dp=4, zero=1, gpu="h100")
    notes: list[str] = []
    text = export_document(_launched(tmp_path, setting, 16), "megatron", None, note=notes.append)[1]
    words = shlex.split(text)
    assert words[:5] == ["CUDA_DEVICE_MAX_CONNECTIONS=1", "torchrun", "--nproc-per-node", "8", "--nnodes"]
    assert words[5] == "2" and "pretrain_gpt.py" in words and "$NODE_RANK" in text
    flags = megatron_flags(words[words.index("pretrain_gpt.py") + 1:])
    assert flags["--num-layers"] == "6" and flags["--tensor-model-parallel-size"] == "2"
    assert {"--overlap-grad-reduce", "--overlap-param-gather", "--use-distributed-optimizer", "--swiglu"} <= set(flags)
    assert any("NODE_RANK" in note for note in notes)


def test_fsdp_beside_cp_writes_its_checkpoint_format_and_warns(tmp_path: Path) -> None:
    setting = Setting(seq_len=4096, microbatch_size=1, tp=2, cp=2, dp=2, zero=3, gpu="h100")
    notes: list[str] = []
    text = export_document(_launched(tmp_path, setting, 16), "megatron", None, note=notes.append)[1]
    flags = megatron_flags(shlex.split(text))
    assert flags["--ckpt-format"] == "fsdp_dtensor" and "CUDA_DEVICE_MAX_CONNECTIONS" not in text
    assert any("FSDP beside TP or CP" in note for note in notes)


def test_a_broken_rule_refuses_the_export(tmp_path: Path) -> None:
    setting = Setting(seq_len=16384, microbatch_size=1, tp=1, dp=8, gpu="h100")
    with pytest.raises(InputError, match=r"--max-position-embeddings 8192 must be at least --seq-length 16384"):
        export_document(_launched(tmp_path, setting, 16), "megatron", None)


@pytest.mark.parametrize("setting", [Setting(seq_len=4096, microbatch_size=1, tp=2, dp=4, zero=1, gpu="h100"),
                                     Setting(seq_len=4096, microbatch_size=1, tp=2, cp=2, dp=2, zero=3, gpu="h100")],
                         ids=["zero1", "fsdp-cp2"])
def test_torchrun_megatron_core_and_the_rules_take_the_command(tmp_path: Path, setting: Setting) -> None:
    """torch's torchrun parser takes the command's torchrun part (16 processes, pretrain_gpt.py), and megatron-core's
    config classes and Megatron-LM's encoded rules take what follows (``launch_checks``); a command for other
    microbatches, or with a flag megatron-core does not know, is refused."""
    pytest.importorskip("megatron.core", reason="megatron-core is not installed (the dev extra pins 0.16.1)")
    from launch_checks import megatron_command_refusal, torchrun

    text = export_document(_launched(tmp_path, setting, 16), "megatron", None)[1]
    config = {**LLAMA, "num_hidden_layers": 6, "max_position_embeddings": 8192}
    assert megatron_command_refusal(text, config, 16, 4, "h100") is None
    _, run = torchrun(text)
    assert (int(run.nproc_per_node) * int(run.nnodes), run.training_script, run.node_rank) == (16, "pretrain_gpt.py", 0)
    assert "calculator makes 4 microbatches, the plan 8" in (megatron_command_refusal(text, config, 16, 8, "h100")
                                                               or "")
    assert "--made-up is neither" in (megatron_command_refusal(text + " --made-up", config, 16, 4, "h100") or "")
