"""Context parallelism (``docs/cost-model.md``, "Context parallelism"): a sequence split over ``cp`` devices, as
Megatron-LM runs it (Transformer Engine's ring attention, ``cp_comm_type="p2p"``) and torchtitan's ring attention.

Each device holds ``1/cp`` of every microbatch's tokens, so everything but the attention core is that of ``1/cp`` of
the tokens. The core runs in ``cp`` steps: a device's queries against its own key/value chunk, then against each of
the ``cp - 1`` others as they pass round the ring. The causal load balancing Megatron-LM uses (the sequence cut into
``2·cp`` chunks, device ``i`` holding chunks ``i`` and ``2·cp - 1 - i``) gives every device ``1/cp`` of the attended
pairs and every step the same share of them. Each step's exchange of the next key/value chunk runs beside the step's
attention: only what outlasts it is exposed; B exchanges the keys and values again and their gradients.
"""

from __future__ import annotations

from zbsolve.base.errors import InputError
from zbsolve.costmodel.hf_config import Architecture


def check(seq_len: int, cp: int, flash_attention: bool, method: str) -> None:
    """Refuse a context-parallel split the runtimes do not run: a sequence not cut into ``2·cp`` equal chunks, ring
    attention without flash attention, and counting (which runs the whole sequence on one device)."""
    if cp == 1:
        return
    if seq_len % (2 * cp):
        raise InputError(f"cp = {cp}: seq_len = {seq_len} is not a multiple of 2·cp = {2 * cp} (load-balanced "
                         "causal chunks)")
    if not flash_attention:
        raise InputError(f"cp = {cp}: ring attention runs on flash attention; drop --no-flash-attention")
    if method == "count":
        raise InputError(f"cp = {cp}: method = 'count' counts the whole sequence on one device; use --method formula")


def kv_bytes(arch: Architecture, e: int) -> int:
    """Bytes a token's keys and values take, every head, as the ring passes them: ``k`` heads of ``d`` each, or
    latent attention's up-projected keys (nope + rope) and values of every head."""
    if arch.latent:
        m = arch.latent
        return e * arch.heads * (m.nope + m.rope + m.v)
    return 2 * arch.kv_width * e


def exposed(attention: tuple[float, float], exchange: float, cp: int) -> tuple[float, float]:
    """Seconds of the ring's exchanges left exposed in F and B: ``cp - 1`` steps, each exchanging a key/value chunk
    (``exchange`` seconds; twice that in B, with the chunk's gradients) beside ``1/cp`` of the attention core's
    ``attention`` seconds."""
    if cp == 1:
        return 0.0, 0.0
    f, b = ((cp - 1) * max(0.0, k * exchange - t / cp) for k, t in zip((1, 2), attention))
    return f, b
