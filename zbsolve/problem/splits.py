"""The stage splits two training frameworks make by default, reproduced over a ``Model`` (Megatron's
``--pipeline-model-parallel-layout`` string of any split, and back: ``io.targets.megatron.layout``).

Every split is half-open ranges of ``model.layers`` per stage (what ``zbsolve.costmodel.model.partition`` returns); the
frameworks deal out only the repeated blocks (``Layer.block``), so the layers before the first block (the
embedding) go to the first stage, those after the last block (MTP layers, final norm and head) to the last, and a
non-block layer between blocks stays with the block before it, as in ``partition(model, n, "uniform")``.

Sources read (the rules are the same in each pair):

- torchtitan 0.3.0 from PyPI, and pytorch/torchtitan main at b5bcd76c66d0acb1a08b176d9639425bc55e0b2a:
  ``torchtitan/distributed/pipeline_parallel.py``, ``_generate_llm_fqn_per_model_part`` (public as
  ``generate_llm_fqn_per_model_part`` up to 0.2.2).
- megatron-core 0.16.1 from PyPI, and NVIDIA/Megatron-LM main at d98e8a64ddf34856e74b24714e3bedb2f5a39553:
  ``megatron/core/transformer/transformer_block.py``, ``get_num_layers_to_build``;
  ``megatron/core/transformer/pipeline_parallel_layer_layout.py``, ``PipelineParallelLayerLayout``; the uneven first
  and last ranks from 0.16.1 alone: ``get_num_layers_to_build`` and ``TransformerConfig.__post_init__``
  (``megatron/core/transformer/transformer_config.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

from zbsolve.base.checks import check_count
from zbsolve.base.errors import InputError
from zbsolve.costmodel.model import Model
from zbsolve.problem.partition import check_ranges, partition

# -- torchtitan ------------------------------------------------------------------------------------------------

def torchtitan_blocks_per_stage(num_stages: int, num_blocks: int, first_stage_less_layers: int = 1,
                                last_stage_less_layers: int = 1) -> list[int]:
    """Blocks per stage as torchtitan deals them out when ``module_fqns_per_model_part`` is not given.

    torchtitan ``_generate_llm_fqn_per_model_part`` (``torchtitan/distributed/pipeline_parallel.py``): one stage
    takes everything; otherwise the embedding counts as ``first_stage_less_layers`` layers and norm + head as
    ``last_stage_less_layers``, the ``num_blocks + first + last`` effective layers are dealt out evenly with the
    remainder one each to the first stages, and the first stage's share less ``first`` (the last stage's less
    ``last``) is its blocks. torchtitan refuses more stages than effective layers and a knob larger than the
    smallest share; so does this, with an ``InputError``.
    """
    check_count("num_stages", num_stages)
    check_count("num_blocks", num_blocks, 0)
    first = check_count("first_stage_less_layers", first_stage_less_layers, 0)
    last = check_count("last_stage_less_layers", last_stage_less_layers, 0)
    if num_stages == 1:
        return [num_blocks]
    effective = num_blocks + first + last
    if num_stages > effective:
        raise InputError(f"num_stages = {num_stages} exceeds torchtitan's {effective} effective layers ({num_blocks} "
                         f"blocks + first_stage_less_layers {first} + last_stage_less_layers {last})")
    per, extra = divmod(effective, num_stages)
    for name, value in (("first_stage_less_layers", first), ("last_stage_less_layers", last)):
        if value > per:
            raise InputError(f"{name} = {value} exceeds the {per} effective layers per stage torchtitan deals "
                             f"{num_stages} stages ({effective} effective layers)")
    counts = []
    left = num_blocks
    for s in range(num_stages):
        share = per + (s < extra) - (first if s == 0 else last if s == num_stages - 1 else 0)
        take = min(share, left)  # torchtitan's `if current_layer < num_layers`; never binds given the checks
        counts.append(take)
        left -= take
    return counts


def torchtitan_split(model: Model, num_stages: int, first_stage_less_layers: int = 1,
                     last_stage_less_layers: int = 1) -> list[tuple[int, int]]:
    """torchtitan's default split of ``model`` into ``num_stages`` stages (all stages, over every device:
    ``pipeline_parallel_degree`` x stages per rank), as half-open layer ranges.

    The knobs are torchtitan's ``parallelism.pipeline_parallel_first_stage_less_layers`` and
    ``parallelism.pipeline_parallel_last_stage_less_layers`` (default 1 each); the rule is
    ``torchtitan_blocks_per_stage``, from ``_generate_llm_fqn_per_model_part`` in
    ``torchtitan/distributed/pipeline_parallel.py``. E.g. 32 blocks on 8 stages: 4, 5, 4, 4, 4, 4, 4, 3.
    """
    counts = torchtitan_blocks_per_stage(num_stages, _num_blocks(model), first_stage_less_layers,
                                         last_stage_less_layers)
    return _ranges(model, counts, "torchtitan's split")


# -- Megatron --------------------------------------------------------------------------------------------------

def megatron_blocks_per_stage(num_stages: int, num_blocks: int, account_for_embedding: bool = True,
                              account_for_loss: bool = True) -> list[int]:
    """Transformer layers per stage as Megatron-core builds them without a custom layout or uneven first/last
    stage.

    Megatron-core ``get_num_layers_to_build`` (``megatron/core/transformer/transformer_block.py``): with
    ``account_for_embedding_in_pipeline_split`` (``account_for_loss_in_pipeline_split``) the embedding (the loss)
    counts as one more layer; the total must divide evenly over the pipeline ranks and each rank's share over its
    virtual stages, which is to divide by ``num_stages`` = pp x vpp; the first stage then builds one layer fewer
    for the embedding, the last one fewer for the loss. A total that does not divide is an ``InputError``, as it
    is a ``ValueError`` in ``TransformerConfig.__post_init__``.
    """
    check_count("num_stages", num_stages)
    check_count("num_blocks", num_blocks, 0)
    for name, value in (("account_for_embedding", account_for_embedding), ("account_for_loss", account_for_loss)):
        if not isinstance(value, bool):
            raise InputError(f"{name} = {value!r} must be true or false")
    total = num_blocks + account_for_embedding + account_for_loss
    if total % num_stages:
        raise InputError(f"num_stages = {num_stages} does not divide Megatron's {total} layers ({num_blocks} blocks"
                         f"{' + embedding' * account_for_embedding}{' + loss' * account_for_loss}); give "
                         "an uneven split as a --pipeline-model-parallel-layout (megatron_layout)")
    counts = [total // num_stages] * num_stages
    counts[0] -= account_for_embedding
    counts[-1] -= account_for_loss  # never below 0: a total that divides gives every stage at least 1
    return counts


def megatron_split(model: Model, num_stages: int, account_for_embedding: bool = True,
                   account_for_loss: bool = True) -> list[tuple[int, int]]:
    """Megatron-core's even split of ``model`` into ``num_stages`` stages (pp x vpp, all virtual stages over every
    device, in layer order), as half-open layer ranges.

    The flags are ``--account-for-embedding-in-pipeline-split`` and ``--account-for-loss-in-pipeline-split``
    (``TransformerConfig.account_for_embedding_in_pipeline_split`` / ``..._loss_...``, False by default in
    Megatron); the rule is ``megatron_blocks_per_stage``, from ``get_num_layers_to_build`` in
    ``megatron/core/transformer/transformer_block.py``. E.g. 30 blocks on 8 stages with both: 3, 4, ..., 4, 3.
    """
    counts = megatron_blocks_per_stage(num_stages, _num_blocks(model), account_for_embedding, account_for_loss)
    return _ranges(model, counts, "Megatron's split")


def megatron_uneven_blocks_per_stage(num_devices: int, num_blocks: int,
                                     num_layers_in_first_pipeline_stage: int | None = None,
                                     num_layers_in_last_pipeline_stage: int | None = None,
                                     chunks: int = 1) -> list[int]:
    """Transformer layers per stage (``num_devices`` x ``chunks`` stages in layer order, stage s on device
    s % ``num_devices``) with Megatron-core's ``num_layers_in_first_pipeline_stage`` and
    ``num_layers_in_last_pipeline_stage`` (``--decoder-first-pipeline-num-layers``, ``--decoder-last-...``), each the
    blocks of a whole pipeline rank over its ``chunks`` virtual stages; None leaves that rank an even share, and
    both None is ``megatron_blocks_per_stage`` without the embedding and the loss.

    ``TransformerConfig.__post_init__`` and ``get_num_layers_to_build`` (``transformer_block.py``): the blocks left
    after the first and the last rank's are dealt evenly over the other ranks, every rank's count divided evenly
    over its virtual stages. What Megatron refuses is an ``InputError``: a count below 1, one that ``chunks`` does
    not divide, middle ranks without blocks or blocks without middle ranks, blocks the middle ranks (or a middle
    rank's virtual stages) do not divide; so is a first and a last rank on one device.
    """
    p = check_count("num_devices", num_devices)
    n = check_count("num_blocks", num_blocks)
    v = check_count("chunks", chunks)
    knobs = {"first": num_layers_in_first_pipeline_stage, "last": num_layers_in_last_pipeline_stage}
    if knobs == {"first": None, "last": None}:
        return megatron_blocks_per_stage(p * v, n, False, False)
    given = {end: check_count(f"num_layers_in_{end}_pipeline_stage", value) for end, value in knobs.items()
             if value is not None}
    if len(given) > p:
        raise InputError(f"num_devices = {p} cannot hold both a first and a last pipeline rank")
    for end, value in given.items():
        if value % v:
            raise InputError(f"num_layers_in_{end}_pipeline_stage = {value} is not a multiple of chunks = {v}, the "
                             "virtual stages of the rank")
    middle, ranks = n - sum(given.values()), p - len(given)
    if middle < 0 or bool(middle) != bool(ranks) or ranks and middle % (ranks * v):
        raise InputError(f"num_blocks = {n} leaves {middle} blocks besides the first and last ranks' for {ranks} "
                         f"middle ranks of {v} virtual stages: Megatron needs the same whole number (> 0) on each")
    shares = [given["first"] if d == 0 and "first" in given else given["last"] if d == p - 1 and "last" in given
              else middle // ranks for d in range(p)]
    return [shares[s % p] // v for s in range(p * v)]


def megatron_uneven_split(model: Model, num_devices: int, first: int | None, last: int | None,
                          chunks: int = 1) -> list[tuple[int, int]]:
    """Megatron-core's split of ``model`` with ``num_layers_in_first_pipeline_stage`` = ``first`` and
    ``num_layers_in_last_pipeline_stage`` = ``last`` (``megatron_uneven_blocks_per_stage``), as half-open layer
    ranges: the embedding on the first stage, the final norm and the head on the last."""
    counts = megatron_uneven_blocks_per_stage(num_devices, _num_blocks(model), first, last, chunks)
    return _ranges(model, counts, "Megatron's uneven split")


# -- helpers ---------------------------------------------------------------------------------------------------

def _blocks(model: Model) -> list[int]:
    """Indices of the model's blocks; none is an ``InputError``."""
    blocks = [i for i, layer in enumerate(model.layers) if layer.block]
    if not blocks:
        raise InputError(f"model {model.name} has no blocks (layers with block = true) to deal out over stages")
    return blocks


def _num_blocks(model: Model) -> int:
    return len(_blocks(model))


def _ranges(model: Model, counts: Sequence[int], what: str) -> list[tuple[int, int]]:
    """Layer ranges giving stage s ``counts[s]`` blocks: each stage with blocks after the first starts at its
    first block, a last stage without blocks just after the last block; a stage left with no layer is an
    ``InputError``."""
    blocks = _blocks(model)
    n = len(model.layers)
    starts = [0]
    dealt = counts[0]
    for s in range(1, len(counts)):
        if counts[s] == 0 and s != len(counts) - 1:  # neither framework leaves a middle stage without blocks
            raise InputError(f"{what} gives stage {s} no blocks")
        starts.append(blocks[dealt] if counts[s] else blocks[-1] + 1)
        dealt += counts[s]
    ends = starts[1:] + [n]
    for s, (a, b) in enumerate(zip(starts, ends)):
        if b <= a:
            side = "before its first block" if s == 0 else "after its last block"
            raise InputError(f"{what} gives stage {s} no blocks, and model {model.name} has no layer {side}")
    return check_ranges(model, list(zip(starts, ends)))


def split_ranges(split: str, model: Model, num_stages: int) -> list[tuple[int, int]]:
    """The layer ranges per stage of a baseline split; an ``InputError`` where the split does not exist."""
    if split == "uniform":
        return partition(model, num_stages)
    if split == "torchtitan":
        return torchtitan_split(model, num_stages)
    return megatron_split(model, num_stages)
