"""The kinds of input file, told apart by their keys once (``file_kind``), so a command given a file of another kind
says which kind it takes and which it was given (``check_kind``) instead of naming the first key it does not
know."""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from zbsolve.base.errors import InputError


class Kind(NamedTuple):
    """One kind of input file."""

    keys: frozenset[str]
    """Top-level keys that only this kind has (among the kinds before it in ``KINDS``): one of them makes a file
    of this kind."""
    shown: str
    """Its keys as a message names them."""
    use: str
    """The commands that take it."""
    note: str = ""
    """What those commands make of it, where that helps."""


PROFILE, PROBLEM, MODEL, DOCUMENT, GRID, HF_CONFIG = ("profile", "problem file", "model description",
                                                      "schedule document", "grid file", "Hugging Face config.json")
KINDS: dict[str, Kind] = {
    DOCUMENT: Kind(frozenset({"format", "version", "routes", "microbatch_route", "devices", "figures"}),
                   "format: zbsolve-schedule", "zbsolve check/plot/export/run"),
    GRID: Kind(frozenset({"axes", "problems", "models"}), "axes, problems or models", "zbsolve grid"),
    MODEL: Kind(frozenset({"layers", "link", "setting", "source"}), "layers", "zbsolve plan/solve"),
    HF_CONFIG: Kind(frozenset({"model_type", "architectures", "hidden_size", "num_hidden_layers", "n_embd", "n_layer",
                               "vocab_size"}), "model_type, hidden_size, ...",
                    "zbsolve estimate", ", which writes a model description from it"),
    PROBLEM: Kind(frozenset({"num_devices", "num_microbatches", "mem_factor", "mem_limit", "published", "placement",
                             "description"}), "num_devices, num_microbatches, profile", "zbsolve solve/frontier"),
    PROFILE: Kind(frozenset({"t_f", "t_b", "t_w", "t_comm", "mem_f", "mem_b", "mem_w", "mem_r", "mem_rw", "comm_f",
                             "comm_b",
                             "overlap_saving", "overlap_slowdown"}), "t_f, t_b, ...",
                  "zbsolve compare/schedule --profile or zbsolve solve"),
}
"""Every kind of input file, in the order ``file_kind`` tries them (a schedule document before a problem file: it
has num_devices too)."""


def file_kind(data: object) -> str | None:
    """The kind of input file whose content is ``data``, told by its top-level keys: the first of ``KINDS`` with one
    of its keys there; None for anything else (no mapping, or none of those keys)."""
    if not isinstance(data, dict):
        return None
    return next((name for name, kind in KINDS.items() if not kind.keys.isdisjoint(data)), None)


def check_kind(data: object, where: str, accepted: Iterable[str], taker: str) -> None:
    """Nothing when ``data`` (the content of the file ``where``) is of a kind in ``accepted`` or of no kind
    ``file_kind`` knows (its fields are then judged as the kind expected); otherwise an ``InputError`` line naming
    the kind given, what ``taker`` (a command, an option or a function) takes, and what takes the file given."""
    accepted = list(accepted)
    given = file_kind(data)
    if given is None or given in accepted:
        return
    takes = [f"a {name} ({KINDS[name].shown})" for name in accepted]
    takes_text = takes[0] if len(takes) == 1 else f"{', '.join(takes[:-1])} or {takes[-1]}"
    raise InputError(f"{where} is a {given}; {taker} takes {takes_text}: "
                     f"use {KINDS[given].use} for a {given}{KINDS[given].note}")
