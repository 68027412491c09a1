"""The launch a Megatron export writes where the schedule document says what to launch (its "launch" section, which
``zbsolve configure`` writes): one ``torchrun ... pretrain_gpt.py`` command with the model's arguments
(``model_args``), the plan's, the overlap and optimizer flags the costs assumed, checked by Megatron-LM's rules
(``rules``).

torchrun's flags are torch's (``torch/distributed/run.py``: ``--nproc-per-node``, ``--nnodes``, ``--node-rank``,
``--master-addr``, ``--master-port``); Megatron-LM's entry point is ``pretrain_gpt.py`` at its root (tag
core_v0.16.1).
"""

from __future__ import annotations

from collections.abc import Sequence

from zbsolve.io.targets.launch import Launch, shell_token
from zbsolve.io.targets.megatron.model_args import model_arguments
from zbsolve.io.targets.megatron.rules import Command, check_rules, connections_refusal, parse_flags

USER_ARGS = ("--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", "$TOKENIZER_MODEL",
             "--data-path", "$DATA_PATH", "--train-iters", "$TRAIN_ITERS", "--lr", "$LR")
"""What the costs do not decide and a run needs: the tokenizer, the data, the steps and the learning rate."""


def launch_args(args: Sequence[str], launch: Launch, seq_len: int) -> list[str]:
    """``pretrain_gpt.py``'s arguments: the model's, the plan's ``args``, the switches the costs assumed (those
    that apply: no AsyncTP overlap without tensor parallelism, no parameter gather without the distributed
    optimizer) and ``USER_ARGS``."""
    switches = [f"--{flag.replace('_', '-')}" for flag in launch.switches]
    if "--tp-comm-overlap" in switches and "--sequence-parallel" not in args:
        switches.remove("--tp-comm-overlap")  # tp = 1: no tensor-parallel collective to hide
    if "--overlap-param-gather" in switches and "--use-distributed-optimizer" not in args:
        switches.remove("--overlap-param-gather")  # ZeRO-0: no parameter all-gather to overlap
    return [*model_arguments(launch.config, seq_len), *args, *switches, *USER_ARGS]


def environment(args: Sequence[str], launch: Launch) -> dict[str, str]:
    """The environment the command sets: CUDA_DEVICE_MAX_CONNECTIONS=1 where ``validate_args`` asks for it
    (tensor or context parallelism before compute capability 10, without Megatron FSDP or the MoE overlap)."""
    probe = Command(parse_flags(args), {}, launch.gpu)
    return {"CUDA_DEVICE_MAX_CONNECTIONS": "1"} if connections_refusal(probe) is not None else {}


def megatron_command(args: Sequence[str], launch: Launch, seq_len: int) -> tuple[str, list[str]]:
    """The ``torchrun ... pretrain_gpt.py`` command of the plan's ``args`` under ``launch``, and the lines for the
    user (the rules' warnings, the rendezvous and what to fill in); an ``InputError`` where a rule refuses it."""
    full = launch_args(args, launch, seq_len)
    env = environment(full, launch)
    notes = check_rules(full, {**env, "WORLD_SIZE": str(launch.gpus)}, launch.gpu)
    words = [*launch.torchrun(), "pretrain_gpt.py", *full]
    notes.append(launch.rendezvous_note("from Megatron-LM's root", ", and TOKENIZER_MODEL, DATA_PATH, TRAIN_ITERS and "
                                        "LR (the run's tokenizer, data, steps and learning rate, which the costs do "
                                        "not decide)"))
    return " ".join([*(f"{key}={value}" for key, value in env.items()), *map(shell_token, words)]), notes
