"""The busiest expert-parallel device's load: the expected maximum of a balanced draw, which the routed experts'
products are timed on."""

from __future__ import annotations

import numpy as np
import pytest

from zbsolve.costmodel.gpus import GPUS
from zbsolve.costmodel.kernels import Kernels, Matmul
from zbsolve.costmodel.routing import busiest


def test_one_device_or_no_copies_has_no_spread():
    assert busiest(4096, 1) == 4096 and busiest(0, 8) == 0


@pytest.mark.parametrize(("copies", "ep"), [(512, 8), (2048, 8), (16384, 32), (4096, 64)])
def test_the_busiest_device_is_the_expected_maximum_of_the_draw(copies, ep):
    """Within 1% of the busiest device's mean load over drawn steps: every copy of the group to one of ``ep``
    devices alike (a multinomial of ep·copies over ep)."""
    draws = np.random.default_rng(0).multinomial(ep * copies, [1 / ep] * ep, size=400)
    drawn = draws.max(axis=1).mean()
    assert busiest(copies, ep) == pytest.approx(drawn, rel=0.01)
    assert copies < busiest(copies, ep)


def test_the_share_above_the_mean_shrinks_with_more_copies_and_grows_with_more_devices():
    assert busiest(512, 8) / 512 > busiest(8192, 8) / 8192
    assert busiest(2048, 64) > busiest(2048, 8)


def test_routed_experts_are_timed_on_the_busiest_device():
    """Routed experts' products over ep = 8 take what the busiest device's copies take on one device holding as many
    experts (no draw there): 8 local experts of ``busiest`` / 8 rows each."""
    kernels = Kernels(GPUS["h100"], "bf16")
    experts = Matmul(2048, 2 * 768, "expert", copies=8)
    spread = kernels.matmul(experts, 4096, 1, 8, 64)
    rows = -(-busiest(8 * 4096, 8) // 8)
    assert rows > 4096
    assert spread == kernels.matmul(experts, rows, 1, 1, 8)
