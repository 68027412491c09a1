"""The torchtitan launch: the ``torchrun ... -m torchtitan.train --module M --config C`` command of a document with a
"launch" section, its module and config function from the Hugging Face config (checked against torchtitan 0.3.0's
own config functions), torchrun's part parsed by torch's parser and the rest by torchtitan's ConfigManager."""

from __future__ import annotations

import importlib
import inspect
import json
from pathlib import Path

import pytest
from conftest import LLAMA, export_toy

from zbsolve.costmodel.model import Model, Setting
from zbsolve.io.document import load_document
from zbsolve.io.targets import export_document
from zbsolve.io.targets.launch import Launch
from zbsolve.io.targets.plan import read_plan
from zbsolve.io.targets.torchtitan import ARGS_NAME, LAUNCH_NAME, torchtitan_launch
from zbsolve.io.targets.torchtitan_launch import CONFIGS, MODULES, torchtitan_model
from zbsolve.optimize.solve import solve

pytest.importorskip("torch.distributed.pipelining", reason="torch.distributed.pipelining is not available")
ROOT = Path(__file__).resolve().parent.parent
LLAMA_70B = json.loads((ROOT / "problems" / "models" / "configs" / "llama3-70b.json").read_text())
SETTING = Setting(seq_len=4096, microbatch_size=1, tp=2, dp=2, dtype="bf16", gpu="h100")
"""tp 2 x pp 2 x dp 2: 8 GPUs."""


def _export(tmp_path: Path, config: dict, gpus: int = 8, per_node: int = 8) -> tuple[Path, list[str]]:
    """The toy's plan on 2 devices with ``SETTING``, its document carrying a launch of ``config``, exported for
    torchtitan: the folder and the notes."""
    model = Model(name="toy", layers=export_toy().layers, setting=SETTING)
    data = solve(model, num_devices=2, num_microbatches=4, placement="sequential", solver="heuristic").to_json()
    data["launch"] = Launch(config, gpus, per_node, "h100").section()
    (tmp_path / "plan.json").write_text(json.dumps(data))
    notes: list[str] = []
    export_document(tmp_path / "plan.json", "torchtitan", tmp_path / "tt", note=notes.append)
    return tmp_path / "tt", notes


def test_each_config_function_builds_a_model_of_its_size() -> None:
    """Each config function of ``CONFIGS`` is in its module's registry and builds a model of the width and depth it
    is chosen for (llama3_405b's float8 converter needs torchao: its flavour's sizes are read instead)."""
    pytest.importorskip("torchtitan", reason="torchtitan is not installed (the dev extra pins 0.3.0)")
    from conftest import import_llama3

    import_llama3()
    for (kind, hidden, layers), name in CONFIGS.items():
        registry = importlib.import_module(f"torchtitan.models.{MODULES[kind]}.config_registry")
        try:
            model = getattr(registry, name)().model_spec.model
        except ImportError:  # torchao is not installed
            flavour = inspect.getsource(getattr(registry, name)).split("model_registry(")[1].split('"')[1]
            flavours = importlib.import_module(f"torchtitan.models.{MODULES[kind]}").llama3_configs
            model = flavours[flavour](attn_backend="flex")
        assert (model.dim, len(model.layers)) == (hidden, layers), name


def test_the_command_launches_the_plan_with_its_arguments(tmp_path: Path) -> None:
    """The launch script holds one command: torch's torchrun parser takes its torchrun part (8 processes on one
    node, torchtitan.train as a module), torchtitan's ConfigManager takes what follows (llama3_70b with the
    export's arguments, its checks run) into the plan's degrees; the notes say the arguments file is the job."""
    pytest.importorskip("torchtitan", reason="torchtitan is not installed (the dev extra pins 0.3.0)")
    from launch_checks import torchtitan_command_config

    folder, notes = _export(tmp_path, LLAMA_70B)
    script = (folder / LAUNCH_NAME).read_text().splitlines()
    assert script[0] == "#!/bin/sh" and len(script) == 2
    run, config = torchtitan_command_config(script[1])
    assert (run.nproc_per_node, run.nnodes, run.node_rank) == ("8", "1", 0)
    args = list(run.training_script_args)
    assert args[:4] == ["--module", "llama3", "--config", "llama3_70b"]
    assert " ".join(args[4:]) == (folder / ARGS_NAME).read_text().strip()
    assert (config.parallelism.pipeline_parallel_degree, config.parallelism.tensor_parallel_degree,
            config.parallelism.data_parallel_replicate_degree, config.training.seq_len) == (2, 2, 2, 4096)
    assert any("reads no TOML job file" in note and script[1] in note for note in notes)
    assert any("NODE_RANK" in note for note in notes)
    launched = torchtitan_launch(read_plan(load_document(tmp_path / "plan.json", "test"), "torchtitan"))
    assert launched is not None and launched[0] == script[1]  # what configure prints (ConfigureResult.command)


def test_a_model_torchtitan_has_no_config_for_is_named_by_the_user(tmp_path: Path) -> None:
    folder, notes = _export(tmp_path, {**LLAMA, "num_hidden_layers": 6}, gpus=16)
    command = (folder / LAUNCH_NAME).read_text()
    assert '--module llama3 --config "$TORCHTITAN_CONFIG"' in command and "--nnodes 2" in command
    assert any("set TORCHTITAN_CONFIG" in note and "llama3_70b" in note for note in notes)
    module, config, said = torchtitan_model({**LLAMA, "model_type": "mistral"})
    assert (module, config) == ("$TORCHTITAN_MODULE", "$TORCHTITAN_CONFIG") and "set TORCHTITAN_MODULE" in said[0]


def test_without_a_launch_section_no_script_is_written(tmp_path: Path) -> None:
    model = Model(name="toy", layers=export_toy().layers, setting=SETTING)
    solve(model, num_devices=2, num_microbatches=4, placement="sequential",
          solver="heuristic").to_json(tmp_path / "plan.json")
    notes: list[str] = []
    written, _ = export_document(tmp_path / "plan.json", "torchtitan", tmp_path / "tt", note=notes.append)
    assert LAUNCH_NAME not in {path.name for path in written}
    assert any("no launch section" in note for note in notes)
