"""NCCL's tuning model of a ring collective (``costmodel.nccl``) and the links it times (``Link.collective``)."""

from __future__ import annotations

import pytest

from zbsolve.costmodel import nccl
from zbsolve.costmodel.communication import group_link
from zbsolve.costmodel.constants import NCCL_BASE_LATENCY, NCCL_NVLINK_HOP
from zbsolve.costmodel.gpus import GPUS

H100 = GPUS["h100"]


def test_a_small_message_is_latency_bound_at_the_least_latency_protocol():
    t = nccl.ring(64, 8, 370e9)
    assert t == pytest.approx(NCCL_BASE_LATENCY["LL"] + 7 * NCCL_NVLINK_HOP["LL"] + 7 / 8 * 64 / 185e9)
    assert nccl.ring(128, 8, 370e9) < 2 * t  # doubling a small message costs little


def test_a_large_message_reaches_the_bus_bandwidth():
    size = 2**30
    assert 7 / 8 * size / 370e9 < nccl.ring(size, 8, 370e9) < 1.02 * 7 / 8 * size / 370e9


def test_an_all_reduce_takes_twice_the_steps_and_bytes():
    assert nccl.ring(2**30, 8, 370e9, factor=2) == pytest.approx(2 * nccl.ring(2**30, 8, 370e9), rel=2e-2)


def test_collective_time_grows_with_ranks_across_nodes():
    times = [group_link(H100, ranks, 8).collective(2**20, ranks) for ranks in (2, 4, 16, 64, 256)]
    assert times == sorted(times) and times[-1] > 2 * times[0]


def test_a_group_across_nodes_drives_the_nics_of_its_ranks_on_a_node():
    one, eight = group_link(H100, 16, 8), group_link(H100, 16, 1)
    assert (one.name, one.ranks_per_node, one.bytes_per_s) == ("network", 1, 50e9)
    assert (eight.ranks_per_node, eight.bytes_per_s) == (8, pytest.approx(450e9 * 20.6 / 25))
    assert group_link(H100, 8, 1).name == "nvlink" and group_link(H100, 8, 1).ranks_per_node is None
