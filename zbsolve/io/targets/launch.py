"""A schedule document's "launch" section: what the plan is to be launched with (the model's Hugging Face config,
the GPUs, the switches the costs assumed), which ``zbsolve configure`` writes and the exports read
(``megatron.launch``, ``torchtitan_launch``), with the torchrun that starts it on each node."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

from zbsolve.base.errors import InputError

FLAGS = ("overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap")
"""The setup's switches the costs assumed that are Megatron flags of the same name (``--overlap-grad-reduce``...)."""
RENDEZVOUS = ("--node-rank", "$NODE_RANK", "--master-addr", "$MASTER_ADDR", "--master-port", "$MASTER_PORT")
"""torchrun's rendezvous flags (``torch/distributed/run.py``), left to the user's shell (one value per node for the
rank)."""


@dataclass(frozen=True)
class Launch:
    """What the document's "launch" section says: the model's Hugging Face config, the GPUs and the switches."""

    config: dict[str, Any]
    """The Hugging Face config.json's mapping."""
    gpus: int
    gpus_per_node: int
    gpu: str
    switches: tuple[str, ...] = ()
    """The ``FLAGS`` that are on."""

    def section(self) -> dict[str, object]:
        """As the document holds it."""
        return {"config": self.config, "gpus": self.gpus, "gpus_per_node": self.gpus_per_node, "gpu": self.gpu,
                **{flag: flag in self.switches for flag in FLAGS}}

    @property
    def nodes(self) -> int:
        """The nodes the GPUs take."""
        return -(-self.gpus // self.gpus_per_node)

    def torchrun(self) -> list[str]:
        """torchrun with its flags (torch's ``torch/distributed/run.py``: ``--nproc-per-node``, ``--nnodes`` and
        ``RENDEZVOUS``), up to the program it runs."""
        return ["torchrun", "--nproc-per-node", str(min(self.gpus, self.gpus_per_node)), "--nnodes",
                str(self.nodes), *RENDEZVOUS]

    def rendezvous_note(self, where: str, also: str) -> str:
        """Where the user runs the command and what they set on each node: the rendezvous, then ``also``."""
        return (f"run it on each of the {self.nodes} node(s) {where} with NODE_RANK (0 to {self.nodes - 1}), "
                f"MASTER_ADDR and MASTER_PORT (node 0's) set{also}")


def read_launch(section: object, where: str) -> Launch | None:
    """The document's "launch" section, checked (None without one); an ``InputError`` naming the key otherwise."""
    if section is None:
        return None
    if not isinstance(section, dict) or not isinstance(section.get("config"), dict):
        raise InputError(f"{where}: launch must be a mapping with the model's config (a config.json's mapping)")
    for key in ("gpus", "gpus_per_node"):
        value = section.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(f"{where}: launch.{key} = {value!r} must be a whole number >= 1")
    if not isinstance(section.get("gpu"), str):
        raise InputError(f"{where}: launch.gpu = {section.get('gpu')!r} must be a GPU preset's name")
    return Launch(section["config"], section["gpus"], section["gpus_per_node"], section["gpu"],
                  tuple(flag for flag in FLAGS if section.get(flag) is True))


def shell_token(arg: str) -> str:
    """One argument for the shell: a ``$NAME`` left for the shell to expand (quoted), anything else quoted where it
    needs it."""
    return f'"{arg}"' if arg.startswith("$") else shlex.quote(arg)
