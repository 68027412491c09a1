"""The launch a torchtitan export writes where the schedule document says what to launch (its "launch" section, which
``zbsolve configure`` writes): one ``torchrun ... -m torchtitan.train --module M --config C ...`` command whose
arguments after the config are the export's arguments file (``torchtitan.ARGS_NAME``).

torchtitan 0.3.0 reads no TOML job file: its ``ConfigManager`` (``torchtitan/config/manager.py``) builds the job's
``Trainer.Config`` from a model module (``--module``, a package of ``torchtitan/models`` with a ``config_registry``)
and one of that registry's functions (``--config``), then applies the command line's overrides (``--<section>.<key>
value``), so the job is those arguments. The command is the form of torchtitan's own launchers (``run_train.sh`` and
``multinode_trainer.slurm``: ``torchrun ... -m torchtitan.train --module ${MODULE} --config ${CONFIG} "$@"``, whose
entry point is ``torchtitan/train.py``), with torchrun's flags as the Megatron launch writes them
(``Launch.torchrun``).
"""

from __future__ import annotations

from collections.abc import Sequence

from zbsolve.io.targets.launch import Launch, shell_token

MODULES = {"llama": "llama3", "qwen3_moe": "qwen3", "deepseek_v3": "deepseek_v3"}
"""torchtitan 0.3.0's model module (``torchtitan/models/__init__.py``: ``_supported_models``) of each Hugging Face
``model_type`` zbsolve estimates that one of them builds."""
CONFIGS: dict[tuple[str, object, object], str] = {
    ("llama", 4096, 32): "llama3_8b", ("llama", 8192, 80): "llama3_70b", ("llama", 16384, 126): "llama3_405b",
    ("qwen3_moe", 2048, 48): "qwen3_30b_a3b", ("deepseek_v3", 7168, 61): "deepseek_v3_671b"}
"""The config function (``torchtitan/models/<module>/config_registry.py``, torchtitan 0.3.0) of each published model
by its ``model_type``, ``hidden_size`` and ``num_hidden_layers``: Llama 3 8B, 70B and 3.1 405B, Qwen3-30B-A3B and
DeepSeek-V3 (671B); the model each builds has that width and depth (tests/test_torchtitan_launch.py)."""
MODULE_VARIABLE, CONFIG_VARIABLE = "$TORCHTITAN_MODULE", "$TORCHTITAN_CONFIG"
"""What the command names the module and config function by where torchtitan has none for the model: the user's
shell fills them in."""
PROGRAM = ("-m", "torchtitan.train")
"""What torchrun runs: torchtitan's entry point (``torchtitan/train.py``), which parses the arguments after it."""


def torchtitan_model(config: dict) -> tuple[str, str, list[str]]:
    """torchtitan's ``--module`` and ``--config`` for the Hugging Face ``config`` (``MODULES``, ``CONFIGS``), and the
    lines for the user: where torchtitan has no module or no config function of that size, the shell variable
    (``MODULE_VARIABLE``, ``CONFIG_VARIABLE``) and a line saying the user names it."""
    kind, hidden, layers = config.get("model_type"), config.get("hidden_size"), config.get("num_hidden_layers")
    module = MODULES.get(str(kind))
    if module is None:
        return MODULE_VARIABLE, CONFIG_VARIABLE, [
            f"launch.config.model_type = {kind!r}: torchtitan has no model module for it (it builds "
            f"{', '.join(sorted(MODULES))} as {', '.join(sorted(set(MODULES.values())))}): set TORCHTITAN_MODULE to "
            "a module with a config_registry that builds this model and TORCHTITAN_CONFIG to one of its functions"]
    name = CONFIGS.get((str(kind), hidden, layers))
    if name is None:
        known = ", ".join(fn for (k, _, _), fn in CONFIGS.items() if k == kind)
        return module, CONFIG_VARIABLE, [
            f"launch.config: torchtitan's {module} has no config function of this model's size (hidden_size "
            f"{hidden}, {layers} layers; it has {known}): set TORCHTITAN_CONFIG to a function of "
            f"torchtitan.models.{module}.config_registry (or of a module of your own, with TORCHTITAN_MODULE) that "
            "builds it"]
    return module, name, []


def torchtitan_command(args: Sequence[str], launch: Launch) -> tuple[str, list[str]]:
    """The ``torchrun ... -m torchtitan.train --module M --config C`` command with the export's ``args`` (its
    arguments file's) under ``launch``, and the lines for the user: the model's module and config
    (``torchtitan_model``), what the config function decides, and where to run it."""
    module, config, notes = torchtitan_model(launch.config)
    words = [*launch.torchrun(), *PROGRAM, "--module", module, "--config", config, *args]
    notes.append(f"--config {config} sets what the costs do not decide (the optimizer, learning rate, data, tokenizer "
                 "assets, steps, checkpointing); the arguments after it set the pipeline, the parallel degrees, the "
                 "batch, the sequence length, the precision and the recomputation the costs assumed")
    notes.append(launch.rendezvous_note("from the export folder (the CSV's path is relative to it)", ""))
    return " ".join(map(shell_token, words)), notes
