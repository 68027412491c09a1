"""The argument rules Megatron-LM states for the flags the Megatron export writes: its ``validate_args``
(``megatron/training/arguments.py`` at tag core_v0.16.1), each rule with its line. A rule that asserts refuses the
command (``InputError``); one that warns, or one that holds only on the cluster (an environment variable), gives a
line for the user.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from zbsolve.base.errors import InputError
from zbsolve.io.targets.megatron.layout import parse_layout

SOURCE = "Megatron-LM core_v0.16.1 megatron/training/arguments.py validate_args"
"""Where every rule is stated."""
BLACKWELL = ("b200", "b300", "gb200", "gb300")
"""GPU presets of compute capability 10 or more, on which ``validate_args`` drops the CUDA_DEVICE_MAX_CONNECTIONS rule
(``get_device_arch_version() < 10``, l.928)."""


@dataclass(frozen=True)
class Command:
    """A Megatron-LM command as the rules read it: its arguments by flag (a flag without value True), the
    environment it sets, and the GPU preset it runs on."""

    flags: Mapping[str, str | bool]
    env: Mapping[str, str]
    gpu: str | None = None

    def size(self, flag: str) -> int:
        """A size flag's value (1 where absent)."""
        return int(self.flags.get(flag, 1))

    @property
    def fsdp(self) -> bool:
        """Whether it runs Megatron FSDP."""
        return "--use-megatron-fsdp" in self.flags

    @property
    def hopper_or_older(self) -> bool:
        """Whether the GPU's compute capability is below 10 (every preset but Blackwell's)."""
        return (self.gpu or "").lower() not in BLACKWELL


@dataclass(frozen=True)
class Rule:
    """One rule of ``validate_args``: where it is stated, whether it refuses or warns, and the check (None where it
    holds, else what breaks it)."""

    line: str
    """Its lines in arguments.py."""
    refuses: bool
    check: Callable[[Command], str | None]


def parse_flags(args: Sequence[str]) -> dict[str, str | bool]:
    """Megatron's arguments by flag, a flag followed by another flag (or by nothing) as True."""
    flags: dict[str, str | bool] = {}
    for i, arg in enumerate(args):
        if arg.startswith("--"):
            following = args[i + 1] if i + 1 < len(args) else "--"
            flags[arg] = following if not following.startswith("--") else True
    return flags


def _interleaved(c: Command) -> str | None:
    layout = c.flags.get("--pipeline-model-parallel-layout")
    pp = c.size("--pipeline-model-parallel-size")
    chunks = len(parse_layout(layout)) // pp if isinstance(layout, str) else 1
    if chunks > 1 and pp <= 2 and "--no-overlap-p2p-communication" in c.flags:
        return f"interleaving ({chunks} virtual stages) with p2p overlap off needs --pipeline-model-parallel-size > 2"
    if chunks > 1 and pp < 2:
        return "interleaving needs --pipeline-model-parallel-size > 1"
    return None


def _param_gather(c: Command) -> str | None:
    if "--overlap-param-gather" not in c.flags:
        return None
    if not ("--use-distributed-optimizer" in c.flags or c.fsdp):
        return "--overlap-param-gather needs --use-distributed-optimizer or --use-megatron-fsdp"
    if "--overlap-grad-reduce" not in c.flags:
        return "--overlap-param-gather needs --overlap-grad-reduce"
    return None


def _fsdp_connections(c: Command) -> str | None:
    if c.fsdp and c.env.get("CUDA_DEVICE_MAX_CONNECTIONS") == "1":
        return "Megatron FSDP needs CUDA_DEVICE_MAX_CONNECTIONS other than 1"
    return None


def _fsdp_checkpoint(c: Command) -> str | None:
    if c.fsdp and c.flags.get("--ckpt-format") != "fsdp_dtensor":
        return "Megatron FSDP needs --ckpt-format fsdp_dtensor"
    return None


def _dtensor_needs_fsdp(c: Command) -> str | None:
    if c.flags.get("--ckpt-format") == "fsdp_dtensor" and not c.fsdp:
        return "--ckpt-format fsdp_dtensor needs --use-megatron-fsdp"
    return None


def _seq_over_cp(c: Command) -> str | None:
    cp, seq = c.size("--context-parallel-size"), c.flags.get("--seq-length")
    if cp > 1 and isinstance(seq, str) and int(seq) % (2 * cp):
        return f"--seq-length {seq} must be a multiple of 2 x --context-parallel-size = {2 * cp}"
    return None


def _positions(c: Command) -> str | None:
    seq, limit = c.flags.get("--seq-length"), c.flags.get("--max-position-embeddings")
    if isinstance(seq, str) and isinstance(limit, str) and int(limit) < int(seq):
        return f"--max-position-embeddings {limit} must be at least --seq-length {seq}"
    return None


def _selective(c: Command) -> str | None:
    if c.flags.get("--recompute-granularity") == "selective" and "--recompute-method" in c.flags:
        return "--recompute-granularity selective takes no --recompute-method"
    return None


def _sequence_parallel(c: Command) -> str | None:
    if "--sequence-parallel" in c.flags and c.size("--tensor-model-parallel-size") == 1:
        return "--sequence-parallel with --tensor-model-parallel-size 1 is switched off"
    return None


def _tp_comm_overlap(c: Command) -> str | None:
    if "--tp-comm-overlap" in c.flags and ("--sequence-parallel" not in c.flags
                                           or c.size("--tensor-model-parallel-size") == 1):
        return "--tp-comm-overlap needs --sequence-parallel (and tensor parallelism)"
    return None


def connections_refusal(c: Command) -> str | None:
    model_parallel = c.size("--tensor-model-parallel-size") > 1 or c.size("--context-parallel-size") > 1
    if not model_parallel or not c.hopper_or_older or c.fsdp or "--overlap-moe-expert-parallel-comm" in c.flags:
        return None
    if c.env.get("CUDA_DEVICE_MAX_CONNECTIONS") != "1":
        return "tensor or context parallelism needs CUDA_DEVICE_MAX_CONNECTIONS=1 before compute capability 10"
    return None


def _fsdp_beside_model_parallel(c: Command) -> str | None:
    model_parallel = c.size("--tensor-model-parallel-size") > 1 or c.size("--context-parallel-size") > 1
    if c.fsdp and model_parallel and c.hopper_or_older:
        return ("Megatron FSDP beside tensor or context parallelism: Megatron-LM warns that they ask for different "
                "CUDA_DEVICE_MAX_CONNECTIONS (1 for TP/CP's overlap, more for FSDP's), so one of them runs slower")
    return None


def _experts(c: Command) -> str | None:
    ep, experts = c.size("--expert-model-parallel-size"), c.flags.get("--num-experts")
    if ep > 1 and not isinstance(experts, str):
        return f"--expert-model-parallel-size {ep} needs --num-experts"
    if ep > 1 and isinstance(experts, str) and int(experts) % ep:
        return f"--num-experts {experts} must be a multiple of --expert-model-parallel-size {ep}"
    return None


def _precision(c: Command) -> str | None:
    if "--bf16" in c.flags and "--fp16" in c.flags:
        return "--bf16 and --fp16 together"
    return None


def _world(c: Command) -> str | None:
    world = c.env.get("WORLD_SIZE")
    model = (c.size("--tensor-model-parallel-size") * c.size("--pipeline-model-parallel-size")
             * c.size("--context-parallel-size"))
    if world is not None and int(world) % model:
        return f"the world size {world} is not a multiple of tp x pp x cp = {model}"
    return None


RULES = {
    "world size": Rule("l.317-319", True, _world),
    "interleaving": Rule("l.573-585", True, _interleaved),
    "overlap param gather": Rule("l.597-602", True, _param_gather),
    "FSDP connections": Rule("l.687-688", True, _fsdp_connections),
    "FSDP checkpoint format": Rule("l.690-691", True, _fsdp_checkpoint),
    "bf16 or fp16": Rule("l.701-713", True, _precision),
    "seq length over cp": Rule("l.837-840", True, _seq_over_cp),
    "max position embeddings": Rule("l.848-851", True, _positions),
    "selective recompute": Rule("l.899-902", True, _selective),
    "sequence parallel": Rule("l.907-913", False, _sequence_parallel),
    "tp comm overlap": Rule("l.915-916", True, _tp_comm_overlap),
    "FSDP beside TP or CP": Rule("l.926-941", False, _fsdp_beside_model_parallel),
    "CUDA_DEVICE_MAX_CONNECTIONS": Rule("l.926-953", True, connections_refusal),
    "expert parallelism": Rule("l.1025-1028", True, _experts),
    "fsdp_dtensor": Rule("l.1049-1050", True, _dtensor_needs_fsdp),
}
"""Every rule encoded, by name."""


def check_rules(args: Sequence[str], env: Mapping[str, str], gpu: str | None = None) -> list[str]:
    """The warnings of ``RULES`` on Megatron-LM's ``args`` run with ``env`` on ``gpu``, each naming its rule and
    line; an ``InputError`` for the first rule that refuses."""
    command = Command(parse_flags(args), env, gpu)
    warnings = []
    for name, rule in RULES.items():
        broken = rule.check(command)
        if broken is None:
            continue
        if rule.refuses:
            raise InputError(f"{broken} (Megatron-LM refuses it: {SOURCE} {rule.line}, {name})")
        warnings.append(f"{broken} ({SOURCE} {rule.line}, {name})")
    return warnings
