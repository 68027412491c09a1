"""Per-layer FLOPs and activation bytes counted by torch rather than by formula (``docs/cost-model.md``, "The
counting path"): the model is built from its Hugging Face config with transformers on torch's meta device (no
weights, nothing from the network) and each part runs F, B and W once, as torch's pipeline runtime splits the
backward (``torch_compat.backward_input`` and ``backward_weight``): FLOPs from
``torch.utils.flop_counter.FlopCounterMode``, activation bytes from saved-tensor hooks that count meta tensors by
their storage's size.

The parts are the embedding (everything before the first decoder layer), one decoder layer of each kind (standing
for all of its kind: with or without a sliding window), the final norm, and the head with the loss. Every figure
is for one microbatch on one device without tensor parallelism. Needs transformers; ``available()`` tells
whether it is installed. Mixture-of-experts layers are not counted right on the meta device: their routing depends
on values, which meta tensors lack. ``count_layers`` counts every decoder layer of a model built by the caller, on
a device with values (the tests count small mixture-of-experts models so, on CPU with random weights).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zbsolve.base.errors import InputError
from zbsolve.costmodel.config_values import read_config
from zbsolve.costmodel.hf_config import attended_pairs

ATTENTION = "sdpa"
"""The attention implementation the model is built with without flash attention: torch's
``scaled_dot_product_attention``, which on the meta device runs its math kernel."""
FLASH = "zbsolve"
"""The attention implementation registered with transformers for flash attention (``_flash_attention``). Its name
has no "flash" in it: transformers would take it for a FlashAttention package of its own."""
DTYPES = ("bf16", "fp16")
"""The ``dtype`` values counted."""


def available() -> bool:
    """Whether transformers (and torch) can be imported, which counting needs."""
    return all(importlib.util.find_spec(name) is not None for name in ("torch", "transformers"))


@dataclass(frozen=True)
class Counts:
    """One part's counted costs."""

    flops: tuple[int, int, int]
    """FLOPs of F, B (input gradient, and the gradients of weights that are no matrix) and W (matrix weights)."""
    m_b: int
    """Bytes of the tensors F saves for the backward (the paper's M_B)."""
    m_w: int
    """Bytes W needs: the saved tensors it reads and the gradients B leaves it (M_W)."""


@dataclass(frozen=True)
class CountedModel:
    """The counted parts of a model."""

    embedding: Counts
    blocks: tuple[Counts, ...]
    """The decoder layers asked for, in that order: every layer is counted as the one of its kind."""
    norm: Counts
    output: Counts
    """The head and the loss."""


def count(config: dict | str | Path, *, seq_len: int, microbatch_size: int, dtype: str = "bf16",
          flash_attention: bool = True, blocks: Sequence[int] = (0,)) -> CountedModel:
    """Count the parts of the model of a Hugging Face config (a mapping, or the path of a config.json), and the
    decoder layers of index ``blocks``.

    ``flash_attention`` runs attention as torch's flash-attention kernels, with the sliding window each layer
    passes (as FlashAttention-2's ``window_size``), which keep no s x s probabilities; otherwise as torch's math
    kernel (what SDPA picks on the meta device), with the mask transformers builds.
    """
    if not available():
        raise InputError("method = 'count': transformers is not installed (pip install transformers), or use "
                         "--method formula")
    import torch

    if dtype not in DTYPES:
        raise InputError(f"dtype = {dtype!r}: should be one of {', '.join(DTYPES)}")
    model, vocab_size, loss_function, where = _build(config, dtype, flash_attention)
    model.train()
    before, layers, norm = _decoder_parts(model.base_model, where)
    head = model.get_output_embeddings()
    held = [*model.parameters(), *model.buffers()]
    captured: dict[str, Any] = {}
    shape = (microbatch_size, seq_len)
    loss = _loss(loss_function, head, vocab_size, shape)
    with torch.device("meta"):
        embedding, x = _count(_embedding(model, layers[0], shape, captured, where), [], before.parameters(), held)
        rest, kwargs = captured["args"][1:], dict(captured["kwargs"])
        if "past_key_values" in kwargs:
            kwargs["past_key_values"] = None  # the layer runs as in training, without the cache
        shared = _shared(held, rest, kwargs)
        counted = [_count(_calling(layers[i], rest, kwargs), [x], layers[i].parameters(), shared) for i in blocks]
        final, z = _count(norm, [counted[-1][1]], norm.parameters(), held)
        output, _ = _count(loss, [z], head.parameters(), held)
    return CountedModel(embedding=embedding, blocks=tuple(c for c, _ in counted), norm=final, output=output)


def _build(config: dict | str | Path, dtype: str, flash_attention: bool) -> tuple[Any, int, Callable[..., Any], str]:
    """The model of a Hugging Face config built by transformers on the meta device, in ``dtype`` and with
    ``_flash_attention`` or SDPA: (the model, its vocabulary size, its loss function, where the config is from)."""
    import torch
    from transformers import AttentionInterface, AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging

    data, where = read_config(config)
    kind = _model_type(data, where)
    settings = {key: value for key, value in data.items() if key != "model_type"}
    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()  # transformers' remarks on a config (token ids, loss type) are not ours to print
    try:
        AttentionInterface.register(FLASH, _flash_attention)
        hf_config = AutoConfig.for_model(kind, **settings)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(hf_config, attn_implementation=FLASH if flash_attention
                                                     else ATTENTION,
                                                     dtype=torch.bfloat16 if dtype == "bf16" else torch.float16)
        loss_function = model.loss_function
    except (ValueError, TypeError, KeyError) as exc:
        raise InputError(f"{where}: model_type = {data.get('model_type')!r}: transformers cannot build it "
                         f"({' '.join(str(exc).split())[:200]})") from None
    finally:
        logging.set_verbosity(verbosity)
    return model, hf_config.vocab_size, loss_function, where


def _embedding(model: Any, first_layer: Any, shape: tuple[int, int], captured: dict[str, Any],
               where: str) -> Callable[[], Any]:
    """The embedding's forward: ``model`` run on token ids of ``shape`` (microbatch, sequence) until it calls
    ``first_layer``, whose input it returns; the arguments of that call are left in ``captured``."""
    import torch

    def stop(module: Any, args: tuple, kwargs: dict) -> None:
        captured.update(args=args, kwargs=kwargs)
        raise _Stop

    def embed() -> Any:
        handle = first_layer.register_forward_pre_hook(stop, with_kwargs=True)
        try:
            # An (empty) cache keeps transformers from looking into the position ids for packed sequences, which
            # needs values that meta tensors lack.
            model(input_ids=torch.zeros(*shape, dtype=torch.long), use_cache=True)
        except _Stop:
            return captured["args"][0]
        finally:
            handle.remove()
        raise InputError(f"{where}: the model never calls its first decoder layer")

    return embed


def _loss(loss_function: Callable[..., Any], head: Any, vocab_size: int,
          shape: tuple[int, int]) -> Callable[[Any], Any]:
    """The head and the loss as a function of the final norm's output, on labels of ``shape``."""
    import torch

    def loss(x: Any) -> Any:
        labels = torch.zeros(*shape, dtype=torch.long)
        return loss_function(logits=head(x), labels=labels, vocab_size=vocab_size)

    return loss


def _shared(held: list[Any], rest: tuple, kwargs: dict) -> list[Any]:
    """``held`` and the tensors among a decoder layer's other arguments, which every layer shares (masks, rotary
    embeddings): none is an activation of the layer."""
    import torch

    return held + [t for t in (*rest, *kwargs.values(), *_tensors(kwargs.values())) if isinstance(t, torch.Tensor)]


def count_layers(model: Any, input_ids: Any) -> list[Counts]:
    """Each decoder layer of the transformers ``model`` (built by the caller, in training mode), counted as
    ``count`` counts one, on the arguments a forward of ``input_ids`` passes it. Its routing needs values: a model
    with experts is built on a device that has them, with ``experts_implementation="eager"`` (each token through
    its top-k experts' matmuls: torch's counter has no formula for grouped matmuls)."""
    import torch

    _, layers, _ = _decoder_parts(model.base_model, type(model).__name__)
    calls: list[tuple[tuple, dict]] = []
    hooks = [layer.register_forward_pre_hook(lambda _, args, kwargs: calls.append((args, kwargs)), with_kwargs=True)
             for layer in layers]
    try:
        with torch.no_grad():
            model(input_ids=input_ids, use_cache=False)
    finally:
        for hook in hooks:
            hook.remove()
    held = [*model.parameters(), *model.buffers()]
    counted = []
    for layer, (args, kwargs) in zip(layers, calls):
        x, rest = args[0], args[1:]
        shared = _shared(held, rest, kwargs)
        counted.append(_count(_calling(layer, rest, kwargs), [x], layer.parameters(), shared)[0])
    return counted


class _Stop(Exception):
    """Raised by the first decoder layer's pre-hook: the embedding's forward ends there."""


def _decoder_parts(base: Any, where: str) -> tuple[Any, Any, Any]:
    """The base model's children before its decoder layers (the embedding, as one module list), the decoder
    layers (its module list) and the final norm (its first child with parameters after that list)."""
    from torch import nn

    children = list(base.children())
    lists = [i for i, child in enumerate(children) if isinstance(child, nn.ModuleList)]
    norms = [child for child in children[lists[0] + 1:] if any(True for _ in child.parameters())] if lists else []
    if not norms:
        raise InputError(f"{where}: no decoder layers followed by a final norm in {type(base).__name__}")
    return nn.ModuleList(children[:lists[0]]), children[lists[0]], norms[0]


def _tensors(values: Iterable[Any]) -> list[Any]:
    """The items of the tuples and lists among ``values`` (rotary embeddings come as a (cos, sin) pair)."""
    return [item for value in values if isinstance(value, (tuple, list)) for item in value]


def _model_type(data: dict, where: str) -> str:
    """The config's ``model_type``, which transformers builds the model by."""
    kind = data.get("model_type")
    if not isinstance(kind, str):
        raise InputError(f"{where}: model_type = {kind!r}: should name a transformers model type")
    return kind


def _calling(layer: Any, rest: tuple, kwargs: dict) -> Callable[[Any], Any]:
    """``layer`` as a function of its first input, the other arguments it was called with fixed."""
    return lambda x: _first(layer(x, *rest, **kwargs))


def _first(output: Any) -> Any:
    """A layer's output tensor (some layers return a tuple)."""
    return output[0] if isinstance(output, tuple) else output


def _count(forward: Callable[..., Any], inputs: list[Any], params: Iterable[Any],
           held: list[Any]) -> tuple[Counts, Any]:
    """F, B and W of one part, counted, and its output (detached) for the next part.

    F runs ``forward(*inputs)`` on the inputs detached; B takes the gradients of the inputs and of the part's
    parameters that are no matrix (norm weights, biases: only matmul weights wait for W); W those of its matrix
    parameters from what B left, or, when the part has no floating-point input (the embedding), the whole
    backward, as torch's runtime runs a first stage. ``held``: tensors that are no activation of this part
    (parameters, buffers, inputs every layer shares), never counted.
    """
    import torch

    from zbsolve.core import torch_compat

    params = [p for p in params if p.requires_grad]
    weights, others = [p for p in params if p.ndim >= 2], [p for p in params if p.ndim < 2]
    inputs = [x.detach().requires_grad_(True) for x in inputs]
    saved = _SavedMeta(held)
    with saved.hooks(), _counter() as f:
        out = forward(*inputs)
    following = out.detach()
    output_grads = None if out.ndim == 0 else [torch.empty_like(out)]
    groups: list[dict[str, Any]] = []
    with _counter() as b:
        if inputs:
            groups = torch_compat.backward_input([out], output_grads, inputs + others, weights)
    handed = ([g for group in groups for grads in group.get("grads", ()) for g in grads if g is not None]
              if inputs else output_grads or [])
    saved.reading = True
    with _counter() as w:
        if inputs:
            torch_compat.backward_weight(weights, groups)
        else:
            torch.autograd.grad([out], weights + others, output_grads)
    m_w = sum(saved.read.values()) + sum(_storage_bytes(handed).values())
    counts = Counts(flops=(f.get_total_flops(), b.get_total_flops(), w.get_total_flops()),
                    m_b=sum(saved.saved.values()), m_w=m_w)
    return counts, following


def _storage_key(tensor: Any) -> int:
    """The identity of a tensor's storage, which views share (meta storages all have data pointer 0)."""
    return tensor.untyped_storage()._cdata


def _storage_bytes(tensors: Iterable[Any]) -> dict[int, int]:
    """Bytes of the storages of ``tensors``, each once."""
    return {_storage_key(t): t.untyped_storage().nbytes() for t in tensors}


class _SavedMeta:
    """The storages autograd saves for backward, each counted once by its size (which meta tensors have), except
    those of ``held``; and, once ``reading`` is set, those the backward reads."""

    def __init__(self, held: Iterable[Any]) -> None:
        self.held = {_storage_key(t) for t in held}
        self.saved: dict[int, int] = {}
        """Bytes per counted storage saved."""
        self.read: dict[int, int] = {}
        """Bytes per counted storage read since ``reading`` was set."""
        self.reading = False

    def hooks(self) -> Any:
        """Context in which the tensors autograd saves are counted (and their reads recorded later)."""
        import torch

        return torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _pack(self, tensor: Any) -> tuple[int, Any]:
        key = _storage_key(tensor)
        if key not in self.held:
            self.saved[key] = tensor.untyped_storage().nbytes()
        return key, tensor

    def _unpack(self, packed: tuple[int, Any]) -> Any:
        key, tensor = packed
        if self.reading and key in self.saved:
            self.read[key] = self.saved[key]
        return tensor


def _flash_attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
                     **options: Any) -> tuple[Any, None]:
    """transformers' attention function (``AttentionInterface``) as FlashAttention-2 runs it: queries, keys and values
    of shape (batch, heads, sequence, head size), grouped-query attention as such, causal, and with the layer's
    ``sliding_window`` (the keys a query attends, itself included) where it is shorter than the sequence; the output
    of shape (batch, sequence, heads, head size). transformers builds no mask for an implementation it has no mask
    function for, so ``attention_mask`` is None: the causal and window patterns are the kernel's arguments.
    ``options``: the keywords transformers passes (``dropout``, default 0; ``scaling``; ``sliding_window``;
    ``is_causal``, default the module's, else causal)."""
    import torch

    dropout: float = options.get("dropout", 0.0)
    scaling: float | None = options.get("scaling")
    sliding_window: int | None = options.get("sliding_window")
    causal = options.get("is_causal", getattr(module, "is_causal", True))
    if sliding_window is None or key.shape[2] <= sliding_window:
        out = torch.ops.aten._scaled_dot_product_flash_attention(query, key, value, dropout, causal, scale=scaling)[0]
        return out.transpose(1, 2).contiguous(), None
    out = torch.ops.aten._flash_attention_forward(
        query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), None, None, query.shape[2], key.shape[2],
        dropout, causal, False, scale=scaling, window_size_left=sliding_window - 1, window_size_right=0)[0]
    return out, None


def _counter() -> Any:
    """torch's FLOP counter, with the formulas of its flash-attention kernel with a window
    (``aten._flash_attention_forward`` and its backward), which torch's own lack: they ignore the window and read
    the kernel's (batch, sequence, heads, head size) shapes as SDPA's (batch, heads, sequence, head size). Here they
    are SDPA's formulas on the same shapes over the pairs the window lets through, as the closed form counts them
    (``hf_config.attended_pairs``)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count


    def windowed(flops: int, query: tuple, window_size_left: int | None) -> int:
        s = query[1]
        return flops // (s * s) * attended_pairs(s, None if window_size_left is None else window_size_left + 1)

    def heads_first(shape: tuple) -> tuple:
        return shape[0], shape[2], shape[1], shape[3]

    def forward(query: tuple, key: tuple, value: tuple, *args: Any, window_size_left: int | None = None,
                **kwargs: Any) -> int:
        return windowed(sdpa_flop_count(heads_first(query), heads_first(key), heads_first(value)), query,
                        window_size_left)

    def backward(grad_out: tuple, query: tuple, key: tuple, value: tuple, *args: Any,
                 window_size_left: int | None = None, **kwargs: Any) -> int:
        return windowed(sdpa_backward_flop_count(*map(heads_first, (grad_out, query, key, value))), query,
                        window_size_left)

    return FlopCounterMode(display=False, custom_mapping={torch.ops.aten._flash_attention_forward: forward,
                                                          torch.ops.aten._flash_attention_backward: backward})
