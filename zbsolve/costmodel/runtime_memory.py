"""What a training runtime allocates beside the model's tensors: the CUDA context and NCCL's buffers (outside
torch's caching allocator), torch.distributed.pipelining's receive buffers and the last stage's output chunks, and
the caching allocator's fragmentation. Each a stated term of ``CONSTANTS``."""

from __future__ import annotations

import math
from collections.abc import Sequence

from zbsolve.costmodel.constants import (
    ALLOCATOR_FRAGMENTATION,
    CUDA_CONTEXT,
    NCCL_BUFFSIZE,
    NCCL_CHANNELS,
    NCCL_PEERS,
    PP_OUTPUT_CHUNKS,
    PP_RECV_BUFFERS,
)

RUNTIMES = ("megatron", "torchtitan")
"""The runtimes whose allocations the memory model follows: Megatron-LM (Megatron-Core, Transformer Engine) and
torchtitan (FSDP2, torchao float8, torch.distributed.pipelining)."""


def nccl_bytes(degrees: Sequence[int]) -> int:
    """Bytes of NCCL's buffers on a device whose communicators span ``degrees`` ranks each (tp, cp, dp, pp, ep: one
    communicator per degree above 1): ``NCCL_BUFFSIZE`` per channel and peer."""
    return sum(NCCL_BUFFSIZE * NCCL_CHANNELS * NCCL_PEERS for d in degrees if d > 1)


def outside_allocator(degrees: Sequence[int]) -> int:
    """Bytes a device spends outside torch's allocator: the CUDA context and NCCL's buffers (``nccl_bytes``)."""
    return CUDA_CONTEXT + nccl_bytes(degrees)


def fragmentation(allocated: float, share: float = ALLOCATOR_FRAGMENTATION) -> int:
    """Bytes the caching allocator reserves beyond ``allocated`` bytes: ``share`` of them (``ALLOCATOR_FRAGMENTATION``
    unless a calibration states it)."""
    return math.ceil(share * allocated)


def pipeline_buffers(runtime: str, microbatches: int, received: int, sent: int, last: bool, outputs: int) -> int:
    """Bytes a stage's pipeline runtime holds for the whole step beyond the activations: under torchtitan
    (``PP_RECV_BUFFERS``) a buffer per microbatch for the ``received`` activation bytes (0 for the first stage)
    and for the gradient of its ``sent`` output bytes (0 for the last), and on the ``last`` stage each
    microbatch's ``outputs`` bytes (``PP_OUTPUT_CHUNKS``); Megatron receives into the activation it keeps (0)."""
    if runtime != "torchtitan":
        return 0
    return microbatches * (PP_RECV_BUFFERS * (received + sent) + (PP_OUTPUT_CHUNKS * outputs if last else 0))
