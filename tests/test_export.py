"""Tests of the torch CSV exporter (zbsolve.export), checked by torch's own loader offline."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from zbsolve.document import write_document
from zbsolve.errors import InfeasibleError, InputError
from zbsolve.export import (
    check_with_torch,
    export_command,
    torch_actions,
    torch_csv,
    write_torch_csv,
)
from zbsolve.families import FAMILIES, make_schedule
from zbsolve.heuristic import heuristic
from zbsolve.placement import Placement, interleaved, sequential, vshape
from zbsolve.profile import UNIT, Profile
from zbsolve.schedule import BW, B, F, Pair, Pass, W, build, passes_of
from zbsolve.simulator import simulate

pytest.importorskip("torch.distributed.pipelining")

TORCH = {F: "F", B: "I", W: "W", BW: "B"}


def _family_cases() -> list[tuple[str, int, int]]:
    cases = []
    for name in FAMILIES:
        for p in (2, 4):
            ms = [4, 9, 4 * p]
            for m in ms:
                try:
                    schedule = make_schedule(name, UNIT, p, m)
                except InputError:
                    continue
                if len(schedule.placement.routes) == 1:
                    cases.append((name, p, m))
    return cases


def _expected_cells(schedule) -> list[list[str]]:
    """The cells the export must hold, built independently of zbsolve.export."""
    last = schedule.num_stages - 1
    dev = schedule.placement.device(0, last)
    order = [p.mb for op in schedule.devices[dev] for p in passes_of(op) if p.kind == F and p.stage == last]
    new = {mb: i for i, mb in enumerate(order)}

    def cell(p: Pass) -> str:
        return f"{p.stage}{TORCH[p.kind]}{new[p.mb]}"

    return [[f"({cell(op.f)};{cell(op.b)})OVERLAP_F_B" if isinstance(op, Pair) else cell(op) for op in ops]
            for ops in schedule.devices]


def _load(tmp_path: Path, schedule) -> dict:
    path = tmp_path / "schedule.csv"
    write_torch_csv(schedule, path)
    with open(path, newline="") as f:
        assert list(csv.reader(f)) == _expected_cells(schedule)
    return check_with_torch(path, schedule)


def _last_stage_forwards(actions: dict, last: int) -> list[int]:
    flat = [sub for row in actions.values() for a in row for sub in (a.sub_actions or (a,))]
    return [a.microbatch_index for a in flat if a.computation_type.value == "F" and a.stage_index == last]


@pytest.mark.parametrize("name,p,m", _family_cases())
def test_every_family_loads_in_torch(tmp_path: Path, name: str, p: int, m: int) -> None:
    schedule = make_schedule(name, UNIT, p, m)
    simulate(schedule)
    actions = _load(tmp_path, schedule)
    assert sorted(actions) == list(range(p))
    assert _last_stage_forwards(actions, schedule.num_stages - 1) == list(range(m))


@pytest.mark.parametrize("placement", [sequential(2), sequential(4), interleaved(2), vshape(2), vshape(4)],
                         ids=["seq2", "seq4", "interleaved2", "vshape2", "vshape4"])
@pytest.mark.parametrize("m", [3, 8])
def test_heuristic_loads_in_torch(tmp_path: Path, placement: Placement, m: int) -> None:
    profile = Profile(t_f=1.0, t_b=1.5, t_w=0.7, t_comm=0.1)
    schedule = heuristic(profile, placement, m)
    simulate(schedule)
    actions = _load(tmp_path, schedule)
    assert _last_stage_forwards(actions, schedule.num_stages - 1) == list(range(m))


def test_last_stage_forwards_renumbered(tmp_path: Path) -> None:
    devices = [[Pass(F, 0, 0), Pass(F, 1, 0), Pass(B, 1, 0), Pass(W, 1, 0), Pass(B, 0, 0), Pass(W, 0, 0)],
               [Pass(F, 1, 1), Pass(B, 1, 1), Pass(W, 1, 1), Pass(F, 0, 1), Pass(BW, 0, 1)]]
    schedule = build("swapped", sequential(2), 2, UNIT, devices)
    simulate(schedule)
    assert torch_actions(schedule) == [["0F1", "0F0", "0I0", "0W0", "0I1", "0W1"], ["1F0", "1I0", "1W0", "1F1", "1B1"]]
    actions = _load(tmp_path, schedule)
    assert _last_stage_forwards(actions, 1) == [0, 1]


def test_bidirectional_is_refused() -> None:
    schedule = make_schedule("dualpipe", UNIT, 2, 4)
    with pytest.raises(InputError, match=r"routes = \[\[0, 1\], \[1, 0\]\] is bidirectional"):
        torch_csv(schedule)


def test_device_without_stage_is_refused() -> None:
    placement = Placement(3, ((0, 1),))
    devices = [[Pass(F, 0, 0), Pass(BW, 0, 0)], [Pass(F, 0, 1), Pass(BW, 0, 1)], []]
    schedule = build("idle", placement, 1, UNIT, devices)
    simulate(schedule)
    with pytest.raises(InputError, match="device 2 no stage"):
        torch_csv(schedule)


def test_invalid_schedule_is_refused() -> None:
    schedule = build("bad", sequential(2), 1, UNIT, [[Pass(F, 0, 0), Pass(BW, 0, 0)], [Pass(BW, 0, 1), Pass(F, 0, 1)]])
    with pytest.raises(Exception, match="deadlock"):
        torch_csv(schedule)


def test_torch_rejection_is_an_input_error(tmp_path: Path) -> None:
    schedule = make_schedule("zb-h1", UNIT, 2, 2)
    rows = torch_actions(schedule)
    rows[0] = [c for c in rows[0] if c != "0I1"] + ["0I1"]
    path = tmp_path / "bad.csv"
    path.write_text("\n".join(",".join(r) for r in rows) + "\n")
    with pytest.raises(InputError, match="torch rejects .*Backward Weight for stage 0, microbatch 1"):
        check_with_torch(path, schedule)


def test_export_command(tmp_path: Path) -> None:
    schedule = make_schedule("zb-v", UNIT, 2, 4)
    doc = tmp_path / "zbv.json"
    write_document(simulate(schedule), doc)
    out = tmp_path / "zbv.csv"
    export_command(doc, "torch-csv", out)
    assert out.read_text() == torch_csv(schedule)
    with pytest.raises(InputError, match="format = 'megatron' is unknown"):
        export_command(doc, "megatron", tmp_path / "x")
    with pytest.raises(InputError, match="cannot read"):
        export_command(tmp_path / "missing.json", "torch-csv", out)


def test_export_without_torch() -> None:
    code = ("import sys; sys.modules['torch'] = None\n"
            "from zbsolve.export import torch_csv, write_torch_csv\n"
            "from zbsolve.families import make_schedule\nfrom zbsolve.profile import UNIT\n"
            "print(torch_csv(make_schedule('1f1b', UNIT, 2, 2)), end='')\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout == torch_csv(make_schedule("1f1b", UNIT, 2, 2))


def test_optimizer_schedule_loads_in_torch(tmp_path: Path) -> None:
    from zbsolve.solve import solve

    try:
        result = solve(Profile(t_f=1.0, t_b=1.2, t_w=0.8), 3.0, num_microbatches=6, num_devices=3,
                       solver="heuristic")
    except InfeasibleError as exc:
        pytest.fail(f"solve found no schedule: {exc}")
    simulate(result.schedule)
    actions = _load(tmp_path, result.schedule)
    assert _last_stage_forwards(actions, 2) == list(range(6))
