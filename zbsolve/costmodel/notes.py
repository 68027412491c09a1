"""One-line notes ``zbsolve estimate`` prints beside a model: what its method's figures stand for, and its training
FLOPs per token against 6·N + 12·L·a·d·s."""

from __future__ import annotations

from pathlib import Path

from zbsolve.base.errors import InputError
from zbsolve.costmodel import moe
from zbsolve.costmodel.estimate import count_parameters, reference_flops_per_token, saving_windows
from zbsolve.costmodel.hf_config import Architecture, architecture
from zbsolve.costmodel.model import Model


def method_note(method: str) -> str:
    """One line saying what the figures of ``method`` stand for, and which is an upper bound."""
    if method == "count":
        return ("method: count (counted by torch on transformers' eager modules: the activation bytes are an upper "
                "bound; fused norm and MLP kernels keep those of --method formula)")
    return ("method: formula (the closed form, docs/cost-model.md: activations as fused norm and MLP kernels keep "
            "them; --method count counts transformers' eager modules, an upper bound)")


def flops_note(model: Model, config: dict | str | Path, flash_attention: bool = True) -> str:
    """One line comparing the estimate's training FLOPs per token with 6·N + 12·L·a·d·s
    (``reference_flops_per_token``)."""
    arch = architecture(config)
    if model.setting is None:
        raise InputError(f"model {model.name} has no setting: its tokens per microbatch are unknown")
    params, matmuls = _weights_a_token(arch)
    reference = reference_flops_per_token(arch, model.setting.seq_len, flash_attention)
    attention = reference - 6 * params
    windows = {w for w in saving_windows(arch, model.setting.seq_len, flash_attention) if w is not None}
    ours = model.flops_per_token()
    no_matmul = params - matmuls
    counted = ours - reference + 6 * no_matmul
    return (f"FLOPs per token: estimate {ours / 1e9:.2f} G (F + B + W of every layer) vs 6·N + 12·L·a·d·s = "
            f"{reference / 1e9:.2f} G (N = {params / 1e9:.3f}e9 {'active ' * bool(arch.experts)}parameters: "
            f"6·N = {6 * params / 1e9:.2f} G, "
            f"attention {attention / 1e9:.2f} G"
            + (f" over the pairs of a sliding window of {', '.join(map(str, sorted(windows)))}" if windows else "")
            + f"), ratio {ours / reference:.3f}; 6·N also counts the "
            f"{no_matmul / 1e6:.1f}e6 weights that are no matmul here (input embedding, norms, biases)"
            + (f"; the estimate counts {counted / 1e9:.2f} G more (counted by torch: flash attention's recomputation "
               "of QK^T in B)" if abs(counted) >= 5e6 else ""))


def _weights_a_token(arch: Architecture) -> tuple[int, int]:
    """The N of 6·N (the parameters; with experts those a token uses, and the head once more for each
    multi-token prediction layer) and how many of them are matmul weights."""
    head = arch.vocab * arch.hidden
    parts = [moe.block(arch, 1, i) for i in range(arch.layers + arch.mtp)]
    parts += [moe.projection(arch, 1)] * arch.mtp
    return (count_parameters(arch, active=True) + arch.mtp * head,
            sum(part.flops[0] // 2 for part in parts) + (1 + arch.mtp) * head)
