"""Activation recomputation, the cost rule: what a block that recomputes costs, and a stage of such blocks
(docs/cost-model.md, "Recomputation"; the choice of blocks is ``problem.recompute``'s).

A block that recomputes keeps only its input from its F to its B (the previous layer's output). Its B first runs
the forward again, so B takes F's time too and holds the forward's activations (M_B) while it runs; what W reads
(M_W) stays from B's end to W's end, as without recomputation. So F allocates the input, B allocates M_W less
the input, W frees M_W, and ``mem_r``, what B holds above the level before it while it runs, is M_B less the
input it already keeps (the recomputed forward saves that same tensor, not a copy). A block that recomputes
selectively keeps all but the outputs of its norms and MLP activation function (``Layer.mem_sel``), which its B
makes again first (``Layer.t_sel``), by the same rule; so does a block that recomputes some of Megatron-LM's modules
(``Layer.recompute_modules``: the bytes and seconds of those it has, added), the ``moe`` module's all-to-alls
(``comm_f``) in its B again.

A runtime's full backward (a BW) runs each block's B and W together, block after block (torch.utils.checkpoint
around each block: torchtitan 9dec370 ``apply_ac``, Megatron-LM's ``--recompute-granularity full``): a block's
recomputed forward lives only while its own backward runs, so a stage's BW holds the inputs it kept and one block's
activations at a time (``mem_rw``), not every block's at once as its B alone, which keeps what each W reads, does."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from zbsolve.base.errors import InputError
from zbsolve.costmodel.model import Model

COSTS = ("t_f", "t_b", "t_w", "mem_f", "mem_b", "mem_w", "mem_r", "mem_rw", "comm_f", "comm_b")
"""A layer's or a stage's pass times, memory deltas, the memory its B and its BW hold while they run, and the
communication parts of its F and B times."""
HELD = ("mem_r", "mem_rw")
"""The costs that are peaks while a pass runs, not sums."""


def layer_costs(model: Model, index: int, recomputes: bool, selective: bool = False,
                modules: Sequence[str] = ()) -> dict[str, float]:
    """``COSTS`` of layer ``index``: its own (``mem_r`` and ``mem_rw`` what its B holds while it runs:
    ``Layer.held_b``), with its forward recomputed inside its B (``recomputes``), or with its
    norms and MLP activation function recomputed there (``selective``: ``Layer.t_sel`` more in B, ``mem_sel`` less
    kept by F; a recomputed forward's communication, ``comm_f``, is B's again), or the ``modules`` of a block that
    has them (``Layer.recompute_modules``)."""
    layer = model.layers[index]
    held = layer.held_b or 0
    own = {"t_f": layer.t_f, "t_b": layer.t_b, "t_w": layer.t_w, "mem_f": layer.mem_f, "mem_b": layer.mem_b,
           "mem_w": layer.mem_w, "mem_r": held, "mem_rw": held, "comm_f": layer.comm_f or 0.0,
           "comm_b": layer.comm_b or 0.0}
    if recomputes:
        kept, again = (model.layers[index - 1].out_bytes if index else 0), layer.t_f
        own["comm_b"] += own["comm_f"]
    elif selective:
        if layer.mem_sel is None or layer.t_sel is None:
            raise InputError(f"layer {layer.name}: selective recomputation needs its t_sel and mem_sel")
        kept, again = layer.mem_f - layer.mem_sel, layer.t_sel
    elif modules and layer.block and layer.recompute_modules:
        chosen = [layer.recompute_modules[name] for name in modules if name in layer.recompute_modules]
        kept, again = layer.mem_f - sum(c.mem for c in chosen), sum(c.t for c in chosen)
        own["comm_b"] += own["comm_f"] * ("moe" in modules and "moe" in layer.recompute_modules)
    else:
        return own
    read_by_w = -layer.mem_w
    again_held = max(0.0, layer.mem_f - kept) + held
    return {**own, "t_b": layer.t_b + again, "mem_f": kept, "mem_b": read_by_w - kept, "mem_r": again_held,
            "mem_rw": max(again_held, read_by_w - kept)}


def stage_costs(model: Model, first: int, end: int, recomputed: Collection[int],
                selective: Collection[int] = (), modules: Sequence[str] = ()) -> dict[str, float]:
    """``COSTS`` of a stage of layers [first, end), its blocks recomputing ``modules`` where they are not in
    ``recomputed`` or ``selective``: sums of its layers', ``mem_r`` the most its B holds above the level it starts
    from (its layers' B run last to first, each layer's ``mem_b`` counted from its end), where that is more than
    the level before and after it, and ``mem_rw`` the most its BW holds so (each layer's B and W run together, its
    ``mem_b`` and ``mem_w`` counted from their end)."""
    costs = [layer_costs(model, i, i in recomputed, i in selective, modules) for i in range(first, end)]
    stage = {name: sum(c[name] for c in costs) for name in COSTS if name not in HELD}
    stage["mem_r"] = _held(costs, "mem_r", ("mem_b",))
    stage["mem_rw"] = _held(costs, "mem_rw", ("mem_b", "mem_w"))
    return stage


def _held(costs: Sequence[dict[str, float]], held: str, deltas: tuple[str, ...]) -> float:
    """The most a stage's backward holds above the level it starts from, its layers' passes run last to first,
    each holding its ``held`` while it runs and changing the level by its ``deltas`` at its end; 0 where that is
    no more than the level before and after it."""
    above, top = 0.0, 0.0
    for c in reversed(costs):
        top = max(top, above + c[held])
        above += sum(c[name] for name in deltas)
    return top if top > max(0.0, above) else 0.0
