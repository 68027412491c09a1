"""What a runtime says of a configuration before it runs: the argument rules Megatron-LM's ``validate_args`` states
(``io.targets.megatron.rules``) on the parallel, batch and precision flags the Megatron export writes for it. A
configuration a rule refuses is left out of a search; one a rule warns against is kept with the warning, which
names the rule and its source."""

from __future__ import annotations

from zbsolve.base.errors import InputError
from zbsolve.configure.predict import Configuration
from zbsolve.costmodel.hf_config import architecture
from zbsolve.io.targets.megatron import DTYPE_FLAGS
from zbsolve.io.targets.megatron.rules import Command, check_rules, connections_refusal, parse_flags

MEGATRON = "megatron"
"""The target whose rules are encoded."""


def megatron_flags(c: Configuration) -> list[str]:
    """The Megatron-LM arguments of ``c`` the rules read: its degrees, sequence, optimizer sharding (the
    distributed optimizer for ZeRO 1 and 3, Megatron FSDP with its checkpoint format for ZeRO 3), precision and
    overlap switches, as the Megatron export writes them (``io.targets.megatron``)."""
    experts = architecture(c.config).experts
    valued, flags = DTYPE_FLAGS.get(c.dtype, ([], []))
    return ["--tensor-model-parallel-size", str(c.tp), "--pipeline-model-parallel-size", str(c.pp),
            "--context-parallel-size", str(c.cp), "--seq-length", str(c.seq_len),
            *(["--expert-model-parallel-size", str(c.ep), "--num-experts", str(experts.routed)] if experts else []),
            *(["--use-distributed-optimizer"] if c.zero else []),
            *(["--use-megatron-fsdp", "--ckpt-format", "fsdp_dtensor"] if c.zero == 3 else []),
            *(["--sequence-parallel"] if c.tp > 1 else []), *valued, *flags,
            *(["--overlap-grad-reduce"] if c.overlap_grad_reduce else []),
            *(["--overlap-param-gather"] if c.overlap_param_gather and c.zero else []),
            *(["--tp-comm-overlap"] if c.tp_comm_overlap and c.tp > 1 else [])]


def runtime_warnings(target: str, c: Configuration) -> tuple[str, ...]:
    """The warnings ``target``'s rules give on ``c``, each with its rule's source; an ``InputError`` naming the
    rule and its source where one refuses it. None for targets without encoded rules."""
    if target != MEGATRON:
        return ()
    args = megatron_flags(c)
    probe = Command(parse_flags(args), {}, c.gpu_name)
    env = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"} if connections_refusal(probe) is not None else {}
    return tuple(check_rules(args, {**env, "WORLD_SIZE": str(c.gpus)}, c.gpu_name))


def runtime_refusal(target: str, c: Configuration) -> str | None:
    """Why ``target``'s rules refuse ``c``, or None."""
    try:
        runtime_warnings(target, c)
    except InputError as exc:
        return str(exc)
    return None
