"""The cost model's constants: each defined once in ``zbsolve.costmodel.constants`` with its unit and source, the
table of ``docs/cost-model.md`` the same records, the measured kernel tables read as the figures were, the memory
per device decided in one place, and the calibration's refusals."""

from __future__ import annotations

import math
import re

import pytest
from conftest import ROOT

from zbsolve.base.errors import InputError
from zbsolve.costmodel import constants
from zbsolve.costmodel.calibration import TERMS, Calibration
from zbsolve.costmodel.constants import CONSTANTS, table
from zbsolve.costmodel.gpus import GPUS, device_memory
from zbsolve.costmodel.kernels import Kernels, Matmul, attention_rate
from zbsolve.costmodel.measured import kernel_table

DOCS = ROOT / "docs"
PACKAGE = ROOT / "zbsolve"


def _doc_table() -> str:
    text = (DOCS / "cost-model.md").read_text()
    found = re.search(r"<!-- constants table: begin -->\n(.*)<!-- constants table: end -->", text, re.S)
    assert found, "docs/cost-model.md has no constants table"
    return found[1]


def test_the_docs_table_is_the_constants():
    rows = {line.split(" | ")[0].strip("| `"): line for line in _doc_table().splitlines()[2:]}
    assert set(rows) == set(CONSTANTS)
    for name, c in CONSTANTS.items():
        assert rows[name] == f"| `{name}` | {constants.shown(c.value)} | {c.unit} | {c.source} | {c.description} |"
    assert _doc_table() == table()


def test_every_constant_is_bound_by_name_with_a_unit_and_a_source():
    for name, c in CONSTANTS.items():
        assert c.name == name and getattr(constants, name) == c.value
        assert c.unit and c.source and c.description


@pytest.mark.parametrize("name", ["FP32_BYTES", "MIB", "GIB", "WEIGHT_BYTES", "P2P_LATENCY", "FSDP_LIVE_LAYERS",
                                  "DEFAULT_RESERVE", "TILE", "ID_BYTES"])
def test_defined_once(name):
    defined = [path for path in PACKAGE.rglob("*.py") for line in path.read_text().splitlines()
               if re.match(rf"{name}\s*(:[^=]*)?=", line)]
    assert len(defined) == 1, defined


def test_no_issue_numbers_in_the_cost_model():
    paths = [DOCS / "cost-model.md", DOCS / "measurements.md", *(PACKAGE / "costmodel").glob("*.py")]
    for path in paths:
        assert not re.search(r"\bissues? #?\d+", path.read_text(), re.I), path


def test_measured_tables_read_as_the_figures_were():
    h100 = kernel_table("h100")
    assert h100.attention == {64: {4096: (323e12, 306e12)},
                              128: {2048: (317e12, 263e12), 4096: (363e12, 323e12), 8192: (395e12, 370e12)},
                              192: {4096: (311e12, 278e12)}}
    assert all(gpu.memory_fraction == 0.80 and gpu.measured == "h100" for gpu in GPUS.values())
    assert GPUS["h100"].memory_bytes_per_s == 3.35e12 * 0.80
    assert attention_rate(128, 4096) == (363e12, 323e12)
    h200 = kernel_table("h200")
    assert round(h200.streamed_bytes_per_s / GPUS["h200"].hbm_bytes_per_s, 2) == 0.75
    assert attention_rate(128, 4096, "h200") == (360e12, 325e12)
    with pytest.raises(InputError, match="measured = 'tpu': should be one of h100, h200"):
        kernel_table("tpu")


def test_device_memory_is_decided_in_one_place():
    assert device_memory("h100") == GPUS["h100"].memory_bytes
    assert device_memory("H200") == GPUS["h200"].memory_bytes
    assert device_memory("h100", 40 * 2**30) == 40 * 2**30
    assert device_memory(None) is None and device_memory(None, 7) == 7
    with pytest.raises(InputError, match="gpu = 'tpu': should be one of"):
        device_memory("tpu")


def test_calibration_scales_named_terms():
    plain = Kernels(GPUS["h100"], "bf16")
    assert Calibration().scale("memory_bound") == 1.0 and Calibration().scale("fragmentation") == 0.0
    assert set(TERMS) == {"gemm", "grouped", "memory_bound", "launch", "interference", "fragmentation"}
    assert all(t.low <= t.neutral <= t.high and t.source for t in TERMS.values())
    scaled = Kernels(GPUS["h100"], "bf16", Calibration({"memory_bound": 2, "gemm": 1.25}))
    assert scaled.memory(1e9) == pytest.approx(2 * plain.memory(1e9))
    assert scaled.attention(1e12, 128, 4096, True)[0] == pytest.approx(plain.attention(1e12, 128, 4096, True)[0] * 1.25)
    assert hash(scaled) == hash(Kernels(GPUS["h100"], "bf16", Calibration({"gemm": 1.25, "memory_bound": 2})))
    grouped = Kernels(GPUS["h100"], "bf16", Calibration({"grouped": 1.5}))
    expert, dense = Matmul(2048, 1536, "expert", copies=8), Matmul(4096, 4096)
    assert grouped.matmul(expert, 4096, 1, 8, 128) == pytest.approx(
        tuple(1.5 * t for t in plain.matmul(expert, 4096, 1, 8, 128)))
    assert grouped.matmul(dense, 4096, 2) == plain.matmul(dense, 4096, 2)


@pytest.mark.parametrize("multipliers, line", [
    ({"network": 1.1}, "calibration.network = 1.1: 'network' should be one of gemm, grouped, memory_bound, launch, "
                       "interference, fragmentation"),
    ({"gemm": 2.0}, "calibration.gemm = 2.0: should be a number in [0.9, 1.3]"),
    ({"gemm": 0.475}, "calibration.gemm = 0.475: should be a number in [0.9, 1.3]"),
    ({"fragmentation": 0.5}, "calibration.fragmentation = 0.5: should be a number in [0, 0.15]"),
    ({"gemm": math.nan}, "calibration.gemm = nan: should be a number in [0.9, 1.3]"),
    ({"gemm": True}, "calibration.gemm = True: should be a number in [0.9, 1.3]"),
    ({"gemm": "1"}, "calibration.gemm = '1': should be a number in [0.9, 1.3]"),
    ([("gemm", 1.0)], "calibration = [('gemm', 1.0)]: should be a mapping of term to multiplier"),
])
def test_calibration_refuses_bad_input(multipliers, line):
    with pytest.raises(InputError, match=re.escape(line)):
        Calibration(multipliers)
    with pytest.raises(InputError, match=re.escape("term = 'x': should be one of gemm, grouped, memory_bound, launch")):
        Calibration().scale("x")
