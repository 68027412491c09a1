"""Tests of the torch CSV exporter (zbsolve.io.torch_csv), checked by torch's own loader offline."""

from __future__ import annotations

import csv
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import export_toy

from zbsolve.base.errors import InfeasibleError, InputError
from zbsolve.core.placement import Placement, bidirectional, interleaved, sequential, vshape
from zbsolve.core.profile import UNIT, Profile
from zbsolve.core.schedule import BW, B, F, Pair, Pass, W, build, pair_count, passes_of
from zbsolve.core.simulator import simulate
from zbsolve.core.torch_compat import lower_csv
from zbsolve.core.transforms import renumber_last_stage, torch_actions
from zbsolve.io.document import read_document, write_document
from zbsolve.io.targets import export_document
from zbsolve.io.targets.megatron import megatron_export
from zbsolve.io.targets.megatron.layout import parse_layout
from zbsolve.io.targets.plan import Plan, read_plan
from zbsolve.io.targets.torchtitan import torchtitan_args, torchtitan_config, torchtitan_schedule_name
from zbsolve.io.torch_csv import export_schedule, torch_csv
from zbsolve.optimize.solve import solve
from zbsolve.schedulers.families import FAMILIES, make_schedule
from zbsolve.schedulers.heuristic import heuristic

pytest.importorskip("torch.distributed.pipelining",
                    reason="torch.distributed.pipelining is not available (the torch extra)")

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
    """The cells the export must hold, built independently of zbsolve.io.torch_csv."""
    last = schedule.num_stages - 1
    dev = schedule.placement.device(0, last)
    order = [p.mb for op in schedule.devices[dev] for p in passes_of(op) if p.kind == F and p.stage == last]
    new = {mb: i for i, mb in enumerate(order)}

    def cell(p: Pass) -> str:
        return f"{p.stage}{TORCH[p.kind]}{new[p.mb]}"

    return [[f"({cell(op.f)};{cell(op.b)})OVERLAP_F_B" if isinstance(op, Pair) else cell(op) for op in ops]
            for ops in schedule.devices]


_ACTION = re.compile(r"(\d+)([A-Z_]+)(\d*)")
"""A torch action inside an action string: stage, computation type, microbatch."""


def _lower(schedule) -> list[list[str]]:
    """The CSV text of ``schedule`` lowered by torch, checked against the expected cells."""
    text = torch_csv(schedule)
    assert list(csv.reader(text.splitlines())) == _expected_cells(schedule)
    return lower_csv(text, num_stages=schedule.num_stages, num_microbatches=schedule.num_microbatches,
                     num_devices=schedule.num_devices)


def _last_stage_forwards(actions: list[list[str]], last: int) -> list[int]:
    return [int(mb) for row in actions for cell in row for stage, kind, mb in _ACTION.findall(cell)
            if kind == "F" and int(stage) == last]


def _compute_only(actions: list[list[str]]) -> list[list[str]]:
    """Torch's actions without the communication and sharding ones it adds."""
    return [[cell for cell in row if all(kind in TORCH.values() for _, kind, _ in _ACTION.findall(cell))]
            for row in actions]


@pytest.mark.parametrize("name,p,m", _family_cases())
def test_every_family_loads_in_torch(name: str, p: int, m: int) -> None:
    schedule = make_schedule(name, UNIT, p, m)
    simulate(schedule)
    actions = _lower(schedule)
    assert _compute_only(actions) == _expected_cells(schedule)
    assert _last_stage_forwards(actions, schedule.num_stages - 1) == list(range(m))


@pytest.mark.parametrize("placement", [sequential(2), sequential(4), interleaved(2), vshape(2), vshape(4)],
                         ids=["seq2", "seq4", "interleaved2", "vshape2", "vshape4"])
@pytest.mark.parametrize("m", [3, 8])
def test_heuristic_loads_in_torch(placement: Placement, m: int) -> None:
    profile = Profile(t_f=1.0, t_b=1.5, t_w=0.7, t_comm=0.1)
    schedule = heuristic(profile, placement, m)
    simulate(schedule)
    actions = _lower(schedule)
    assert _last_stage_forwards(actions, schedule.num_stages - 1) == list(range(m))


def test_last_stage_forwards_renumbered() -> None:
    devices = [[Pass(F, 0, 0), Pass(F, 1, 0), Pass(B, 1, 0), Pass(W, 1, 0), Pass(B, 0, 0), Pass(W, 0, 0)],
               [Pass(F, 1, 1), Pass(B, 1, 1), Pass(W, 1, 1), Pass(F, 0, 1), Pass(BW, 0, 1)]]
    schedule = build("swapped", sequential(2), 2, UNIT, devices)
    simulate(schedule)
    assert torch_actions(schedule) == [["0F0", "0F1", "0I1", "0W1", "0I0", "0W0"],
                                       ["1F1", "1I1", "1W1", "1F0", "1B0"]]
    renumbered = renumber_last_stage(schedule)
    assert torch_actions(renumbered) == [["0F1", "0F0", "0I0", "0W0", "0I1", "0W1"],
                                         ["1F0", "1I0", "1W0", "1F1", "1B1"]]
    assert simulate(renumbered).makespan == simulate(schedule).makespan
    actions = _lower(schedule)
    assert _last_stage_forwards(actions, 1) == [0, 1]


def test_renumbering_keeps_routes_and_pairs() -> None:
    schedule = make_schedule("dualpipe", UNIT, 2, 4)

    def last_forwards(s) -> list[int]:
        return [p.mb for ops in s.devices for op in ops for p in passes_of(op) if p.kind == F and p.stage == 1]

    old = last_forwards(schedule)
    assert old != list(range(4))
    renumbered = renumber_last_stage(schedule)
    assert last_forwards(renumbered) == list(range(4))
    assert list(renumbered.microbatch_route) == [schedule.microbatch_route[mb] for mb in old]
    assert pair_count(renumbered) == pair_count(schedule) > 0
    assert simulate(renumbered).makespan == simulate(schedule).makespan


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


def test_torch_rejection_is_an_input_error() -> None:
    schedule = make_schedule("zb-h1", UNIT, 2, 2)
    rows = torch_actions(schedule)
    rows[0] = [c for c in rows[0] if c != "0I1"] + ["0I1"]
    text = "\n".join(",".join(r) for r in rows) + "\n"
    with pytest.raises(InputError, match="torch rejects the exported schedule: .*Backward Weight for stage 0, "
                                         "microbatch 1"):
        lower_csv(text, num_stages=2, num_microbatches=2, num_devices=2)


def test_export_schedule(tmp_path: Path) -> None:
    schedule = make_schedule("zb-v", UNIT, 2, 4)
    out = tmp_path / "zbv.csv"
    out.write_text("old")
    assert export_schedule(schedule, out) == out.read_text() == torch_csv(schedule)
    assert [p.name for p in tmp_path.iterdir()] == ["zbv.csv"]
    with pytest.raises(InputError, match="format = 'onnx' is unknown"):
        export_schedule(schedule, tmp_path / "x", "onnx")
    with pytest.raises(InputError, match="output = .*missing/zbv.csv: the folder .*missing does not exist"):
        export_schedule(schedule, tmp_path / "missing" / "zbv.csv")
    with pytest.raises(InputError, match="is bidirectional"):
        export_schedule(make_schedule("dualpipe", UNIT, 2, 4), out)
    assert out.read_text() == torch_csv(schedule)
    assert [p.name for p in tmp_path.iterdir()] == ["zbv.csv"]


def test_export_command(tmp_path: Path) -> None:
    doc, out = tmp_path / "zbv.json", tmp_path / "zbv.csv"
    write_document(simulate(make_schedule("zb-v", UNIT, 2, 4)), doc)
    run = subprocess.run([sys.executable, "-m", "zbsolve", "export", str(doc), "--format", "torch-csv", "-o",
                          str(out)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == f"wrote {out}"
    assert out.read_text() == torch_csv(make_schedule("zb-v", UNIT, 2, 4))
    run = subprocess.run([sys.executable, "-m", "zbsolve", "export", str(doc), "-f", "onnx", "-o", str(out)],
                         capture_output=True, text=True)
    assert run.returncode == 2 and "format = 'onnx' is unknown; choose one of torch-csv, torchtitan, megatron" in \
        run.stderr


def test_export_without_torch(tmp_path: Path) -> None:
    out = tmp_path / "1f1b.csv"
    code = ("import sys; sys.modules['torch'] = None\n"
            "from zbsolve.io.torch_csv import export_schedule\n"
            "from zbsolve.schedulers.families import make_schedule\nfrom zbsolve.core.profile import UNIT\n"
            f"export_schedule(make_schedule('1f1b', UNIT, 2, 2), {str(out)!r})\n"
            "import zbsolve.core.torch_compat as tc; assert not tc.has_pipelining()\n")
    subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.read_text() == torch_csv(make_schedule("1f1b", UNIT, 2, 2))


def test_optimizer_schedule_loads_in_torch() -> None:
    from zbsolve.optimize.solve import solve

    try:
        result = solve(Profile(t_f=1.0, t_b=1.2, t_w=0.8), 3.0, num_microbatches=6, num_devices=3,
                       solver="heuristic")
    except InfeasibleError as exc:
        pytest.fail(f"solve found no schedule: {exc}")
    simulate(result.schedule)
    actions = _lower(result.schedule)
    assert _last_stage_forwards(actions, 2) == list(range(6))


# -- torchtitan and Megatron exports (zbsolve.io.targets) ------------------------------------------------------

TORCHTITAN_PARALLELISM_KEYS = {
    "pipeline_parallel_degree",
    "pipeline_parallel_schedule",
    "pipeline_parallel_schedule_csv",
    "pipeline_parallel_microbatch_size",
    "module_fqns_per_model_part",
}
"""The ``ParallelismConfig`` fields the torchtitan export writes, read in torchtitan 0.3.0 (the PyPI wheel),
``torchtitan/config/configs.py``, class ``ParallelismConfig`` (l.112; these fields at l.174-226). On torchtitan main
``pipeline_parallel_microbatch_size`` is gone (``num_pp_microbatches`` instead, 2026-08-20)."""
TORCHTITAN_TRAINING_KEYS = {"local_batch_size", "disable_cuda_graphs"}
"""The ``TrainingConfig`` fields it writes for a plan without a setting: torchtitan 0.3.0
``torchtitan/config/configs.py`` l.37 and l.65; the pipeline runs ``local_batch_size //
pipeline_parallel_microbatch_size`` microbatches (``pipeline_parallel.py`` l.303), and ``Trainer.Config`` refuses
pipeline parallelism unless ``disable_cuda_graphs`` (``_validate_cuda_graphs``, ``torchtitan/trainer.py`` l.179)."""
SCHEDULE_NAMES = {"sequential": "1F1B", "interleaved": "Interleaved1F1B", "vshape": "ZBVZeroBubble"}
MEGATRON_STAGE = r"E?(?:t(?:\*\d+)?)?L?"
MEGATRON_LAYOUT = re.compile(rf"{MEGATRON_STAGE}(?:\|{MEGATRON_STAGE})*")
"""The part of Megatron's layout grammar the export writes (``parse_str_to_list`` in megatron-core 0.16.1
``megatron/core/transformer/pipeline_parallel_layer_layout.py``): stages split at ``|``, each an optional ``E``,
``t`` blocks (``t*n`` for n), an optional ``L``."""




def _plan_document(tmp_path: Path, placement: str) -> Path:
    """A solved plan of the toy model on 2 devices, 4 microbatches, with its "partition" section."""
    path = tmp_path / f"{placement}.json"
    solve(export_toy(), num_devices=2, num_microbatches=4, placement=placement, solver="heuristic").to_json(path)
    return path


def _stage_names(doc: Path) -> list[list[str]]:
    data = json.loads(doc.read_text())
    names = [layer["name"] for layer in data["partition"]["layers"]]
    return [names[a:b] for a, b in data["partition"]["stages"]]


def _torchtitan_stages_of_rank(name: str, rank: int, p: int, num_stages: int) -> tuple[int, ...]:
    """The stages torchtitan 0.3.0 builds on ``rank`` for schedule ``name`` (``_get_pp_rank_to_stage_indices_mapping``
    in ``torchtitan/distributed/pipeline_parallel.py``): "v" for ZBVZeroBubble and DualPipeV, looped otherwise."""
    if name in ("ZBVZeroBubble", "DualPipeV"):
        return (rank, num_stages - 1 - rank)
    return tuple(range(rank, num_stages, p))


@pytest.mark.parametrize("placement", list(SCHEDULE_NAMES))
def test_torchtitan_export(tmp_path: Path, placement: str) -> None:
    doc = _plan_document(tmp_path, placement)
    folder = tmp_path / "tt"
    written, text = export_document(doc, "torchtitan", folder)
    assert written == [folder / "schedule.csv", folder / "torchtitan.json", folder / "torchtitan-args.txt"]
    schedule = read_document(doc)[0]
    assert text == (folder / "schedule.csv").read_text() == torch_csv(schedule)
    config = json.loads((folder / "torchtitan.json").read_text())
    assert set(config) == {"parallelism", "training", "activation_checkpoint"}
    # Nothing recomputes, so the export turns off torchtitan's default (selective) checkpointing.
    assert config["activation_checkpoint"] == "none"
    assert set(config["parallelism"]) == TORCHTITAN_PARALLELISM_KEYS
    assert set(config["training"]) == TORCHTITAN_TRAINING_KEYS
    parallelism = config["parallelism"]
    name = SCHEDULE_NAMES[placement]
    assert parallelism["pipeline_parallel_schedule"] == name
    assert parallelism["pipeline_parallel_degree"] == 2
    # The CSV is named relative to the folder, so the folder can be copied to the cluster as it is.
    assert parallelism["pipeline_parallel_schedule_csv"] == "schedule.csv"
    assert parallelism["pipeline_parallel_microbatch_size"] == 1 and config["training"]["local_batch_size"] == 4
    stages = _stage_names(doc)
    assert stages[-1][-1] == "output"
    assert parallelism["module_fqns_per_model_part"] == [[n.replace("output", "lm_head") for n in s] for s in stages]
    assert shlex.split((folder / "torchtitan-args.txt").read_text()) == torchtitan_args(config)
    # The stages torchtitan builds on each rank for this name are the ones the plan puts there.
    routes = schedule.placement.routes[0]
    for rank in range(2):
        built = _torchtitan_stages_of_rank(name, rank, 2, len(routes))
        assert sorted(built) == [s for s, d in enumerate(routes) if d == rank]


@pytest.mark.parametrize("placement", list(SCHEDULE_NAMES))
def test_torchtitan_export_loads_in_torchtitan(tmp_path: Path, placement: str) -> None:
    """torchtitan's own config classes take the JSON fragment, and its command-line parser the arguments file."""
    configs = pytest.importorskip("torchtitan.config", reason="torchtitan is not installed (the dev extra pins 0.3.0)")
    manager = pytest.importorskip("torchtitan.config.manager",
                                  reason="torchtitan is not installed (the dev extra pins 0.3.0)")
    import dataclasses

    import tyro
    from torch.distributed.pipelining.schedules import get_schedule_class
    from torchtitan.distributed.activation_checkpoint import ActivationCheckpointingConfig, SelectiveAC

    assert TORCHTITAN_PARALLELISM_KEYS <= {f.name for f in dataclasses.fields(configs.ParallelismConfig)}
    assert TORCHTITAN_TRAINING_KEYS <= {f.name for f in dataclasses.fields(configs.TrainingConfig)}
    folder = tmp_path / "tt"
    export_document(_plan_document(tmp_path, placement), "torchtitan", folder)
    config = json.loads((folder / "torchtitan.json").read_text())
    parallelism = configs.ParallelismConfig(**config["parallelism"])
    training = configs.TrainingConfig(**config["training"])
    get_schedule_class(parallelism.pipeline_parallel_schedule)

    sections = dataclasses.make_dataclass("Sections", [
        ("parallelism", configs.ParallelismConfig, dataclasses.field(default_factory=configs.ParallelismConfig)),
        ("training", configs.TrainingConfig, dataclasses.field(default_factory=configs.TrainingConfig)),
        ("activation_checkpoint", ActivationCheckpointingConfig,
         dataclasses.field(default_factory=SelectiveAC.Config))])
    manager.ConfigManager()  # registers torchtitan's command-line rules (a list[str] as A,B,C)
    parsed = tyro.cli(sections, args=shlex.split((folder / "torchtitan-args.txt").read_text()),
                      registry=manager.custom_registry)
    assert parsed.parallelism == parallelism and parsed.training == training
    assert config["activation_checkpoint"] == "none" and parsed.activation_checkpoint is None


@pytest.mark.parametrize("placement", list(SCHEDULE_NAMES))
def test_torchtitan_builds_the_plans_stages(tmp_path: Path, placement: str) -> None:
    """torchtitan's stage placement for the exported schedule name matches the plan's."""
    pp = pytest.importorskip("torchtitan.distributed.pipeline_parallel",
                             reason="torchtitan is not installed (the dev extra pins 0.3.0)")
    doc = _plan_document(tmp_path, placement)
    export_document(doc, "torchtitan", tmp_path / "tt")
    name = json.loads((tmp_path / "tt" / "torchtitan.json").read_text())["parallelism"]["pipeline_parallel_schedule"]
    routes = read_document(doc)[0].placement.routes[0]
    for rank in range(2):
        built = pp._get_pp_rank_to_stage_indices_mapping(rank, 2, name, len(routes))
        assert tuple(built) == _torchtitan_stages_of_rank(name, rank, 2, len(routes))


def test_torchtitan_renames_and_microbatch_size(tmp_path: Path) -> None:
    plan = read_plan(_plan_document(tmp_path, "sequential"), "torchtitan")
    assert torchtitan_config(plan, "s.csv")["parallelism"]["module_fqns_per_model_part"][-1][-2:] == ["norm",
                                                                                                       "lm_head"]
    config = torchtitan_config(plan, "s.csv", 2, ["output=output", "norm=final_norm"])
    assert config["parallelism"]["module_fqns_per_model_part"][-1][-2:] == ["final_norm", "output"]
    assert config["parallelism"]["pipeline_parallel_microbatch_size"] == 2 and config["training"] == {
        "local_batch_size": 8, "disable_cuda_graphs": True}
    for renames, message in ((["norm"], r"^rename = 'norm' should be OLD=NEW"),
                             (["head=x"], r"^rename = 'head=x': the partition has no layer 'head'$"),
                             (["norm=lm_head"], r"^rename = \['norm=lm_head'\]: module FQN 'lm_head' would name two")):
        with pytest.raises(InputError, match=message):
            torchtitan_config(plan, "s.csv", renames=renames)
    with pytest.raises(InputError, match=r"^microbatch_size = 0 must be an integer >= 1"):
        torchtitan_config(plan, "s.csv", 0)


def test_torchtitan_refuses_what_it_cannot_place() -> None:
    assert torchtitan_schedule_name(sequential(4)) == "1F1B"
    assert torchtitan_schedule_name(interleaved(4, 3)) == "Interleaved1F1B"
    assert torchtitan_schedule_name(vshape(4)) == "ZBVZeroBubble"
    for placement in (vshape(2, 4), bidirectional(2), Placement(2, ((1, 0),))):
        with pytest.raises(InputError, match=r"^placement .*: torchtitan 0\.3\.0 builds .*\(runtime table: "
                                             r"torchtitan\.placements\)$"):
            torchtitan_schedule_name(placement)
    with pytest.raises(InputError, match=r"^num_devices = 1: torchtitan runs no pipeline"):
        torchtitan_schedule_name(sequential(1))


def test_torchtitan_export_writes_nothing_when_refused(tmp_path: Path) -> None:
    doc = _plan_document(tmp_path, "vshape")
    with pytest.raises(InputError, match="the partition has no layer 'x'"):
        export_document(doc, "torchtitan", tmp_path / "tt", renames=["x=y"])
    assert not (tmp_path / "tt").exists()
    (tmp_path / "file").write_text("")
    with pytest.raises(InputError, match=r"^output = .*file is a file; format 'torchtitan' writes a folder$"):
        export_document(doc, "torchtitan", tmp_path / "file")
    with pytest.raises(InputError, match=r"^output = .*tt: the folder .*missing does not exist$"):
        export_document(doc, "torchtitan", tmp_path / "missing" / "tt")


def test_torchtitan_export_says_where_the_csv_is_and_what_it_renames(tmp_path: Path) -> None:
    doc, folder = _plan_document(tmp_path, "sequential"), tmp_path / "tt"
    csv_note = (f"pipeline_parallel_schedule_csv = schedule.csv is relative to the export folder {folder}: start "
                "torchtitan in that folder (wherever it is copied), or override it with the CSV's path there")
    rename_note = ("module_fqns_per_model_part: layer 'output' is renamed 'lm_head', torchtitan 0.3.0's name of the "
                   "head (--rename output=output keeps it)")
    job_note = ("torchtitan-args.txt is the job: torchtitan 0.3.0 reads no TOML job file, its ConfigManager takes "
                "--module, --config and these command-line overrides (torchtitan/config/manager.py); the document has "
                "no launch section (zbsolve configure writes one): run torchrun ... -m torchtitan.train --module "
                "<model> --config <function> with the arguments of torchtitan-args.txt")
    # The toy has no setting: a last line says which settings the export could not write.
    setting_note = ("partition.setting is missing (the model has no setting): torchtitan.json has no "
                    "tensor_parallel_degree, context_parallel_degree, expert_parallel_degree, data_parallel_*_degree, "
                    "seq_len, global_batch_size or mixed_precision_param, and pipeline_parallel_microbatch_size is "
                    "--microbatch-size (default 1); add those of the setting the plan's costs are for")
    notes: list[str] = []
    export_document(doc, "torchtitan", folder, note=notes.append)
    assert notes == [csv_note, job_note, rename_note, setting_note]
    notes.clear()
    export_document(doc, "torchtitan", folder, renames=["output=output"], note=notes.append)
    assert notes == [csv_note, job_note, setting_note]
    run = subprocess.run([sys.executable, "-m", "zbsolve", "export", str(doc), "-f", "torchtitan", "-o", str(folder)],
                         capture_output=True, text=True, env={**os.environ, "COLUMNS": "100000"})
    assert run.returncode == 0, run.stderr
    assert run.stderr.splitlines() == [f"note: {csv_note}", f"note: {job_note}", f"note: {rename_note}",
                                       f"note: {setting_note}"]


def test_export_never_overwrites_its_document(tmp_path: Path) -> None:
    doc = _plan_document(tmp_path, "sequential")
    text = doc.read_text()
    with pytest.raises(InputError, match=r"^output = .*sequential.json is the input file: writing it would "):
        export_document(doc, "torch-csv", doc)
    folder = tmp_path / "tt"
    folder.mkdir()
    inside = folder / "torchtitan.json"
    inside.write_text(text)
    with pytest.raises(InputError, match=r"^output = .*tt/torchtitan.json is the input file: writing it would "):
        export_document(inside, "torchtitan", folder)
    assert doc.read_text() == inside.read_text() == text and sorted(folder.iterdir()) == [inside]


def _megatron_args(text: str) -> dict[str, str]:
    """Megatron's arguments in the export's shell line, by flag."""
    args = shlex.split(text)
    return dict(zip(args[::2], args[1::2]))


@pytest.mark.parametrize("placement,layout", [("sequential", "Et*3|t*3L"), ("interleaved", "Et*2|t*2|t|tL")])
def test_megatron_export(tmp_path: Path, placement: str, layout: str) -> None:
    doc = _plan_document(tmp_path, placement)
    text = f"--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout '{layout}'"
    assert export_document(doc, "megatron", None) == ([], text)
    assert MEGATRON_LAYOUT.fullmatch(layout)
    blocks = [sum(n.startswith("layers.") for n in stage) for stage in _stage_names(doc)]
    assert [stage.count("t") for stage in parse_layout(layout)] == blocks
    out = tmp_path / "megatron.txt"
    assert export_document(doc, "megatron", out) == ([out], text) and out.read_text() == text + "\n"


@pytest.mark.parametrize("placement", ["sequential", "interleaved"])
def test_megatron_export_parses_in_megatron(tmp_path: Path, placement: str) -> None:
    """megatron-core's own parser takes the layout, and puts each stage's blocks on the plan's rank."""
    mod = pytest.importorskip("megatron.core.transformer.pipeline_parallel_layer_layout",
                              reason="megatron-core is not installed (the dev extra pins 0.16.1)")
    from megatron.core.transformer.enums import LayerType

    doc = _plan_document(tmp_path, placement)
    args = _megatron_args(export_document(doc, "megatron", None)[1])
    assert args["--pipeline-model-parallel-size"] == "2"
    layout = mod.PipelineParallelLayerLayout(args["--pipeline-model-parallel-layout"], 2)
    assert layout.validate_layer_layout(num_layers=6, mtp_num_layers=None) is False
    blocks = [sum(n.startswith("layers.") for n in stage) for stage in _stage_names(doc)]
    routes = read_document(doc)[0].placement.routes[0]
    for s, count in enumerate(blocks):
        assert layout.layout[routes[s]][s // 2].count(LayerType.decoder) == count


def test_megatron_refuses_vshape_and_two_routes(tmp_path: Path) -> None:
    result = _zbsolve("export", _plan_document(tmp_path, "vshape"), "--format", "megatron")
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.strip() == ("error: placement vshape x2: Megatron (megatron-core 0.16.1) builds sequential "
                                     "x1, interleaved (stages per device), not vshape x2 (runtime table: "
                                     "megatron.placements); plan with --target megatron")
    plan = Plan(make_schedule("dualpipe", UNIT, 2, 4), export_toy(), ((0, 4), (4, 9)))
    with pytest.raises(InputError, match=r"^placement bidirectional x2: .* not bidirectional x2 \(runtime table: "
                                         r"megatron\.placements\); plan with --target megatron$"):
        megatron_export(plan)


def test_blocks_from_the_records_else_from_the_names(tmp_path: Path) -> None:
    """A layer's record says whether it is a block; a record without the flag (an older document) counts a layer
    named as an indexed entry (layers.3) as a block."""
    doc = _plan_document(tmp_path, "sequential")
    data = json.loads(doc.read_text())
    assert [r["block"] for r in data["partition"]["layers"]][:2] == [False, True]
    for i, record in enumerate(data["partition"]["layers"]):
        del record["block"]
        if 1 <= i < 7:
            record["name"] = f"h{i}"
    doc.write_text(json.dumps(data))
    with pytest.raises(InputError, match="model toy has no blocks"):
        export_document(doc, "megatron", None)
    for record in data["partition"]["layers"][1:7]:
        record["block"] = True
    doc.write_text(json.dumps(data))
    assert _megatron_args(export_document(doc, "megatron", None)[1])["--pipeline-model-parallel-layout"] == \
        "Et*3|t*3L"


@pytest.mark.parametrize("fmt", ["torchtitan", "megatron"])
def test_missing_partition(tmp_path: Path, fmt: str) -> None:
    doc = tmp_path / "zbv.json"
    write_document(simulate(make_schedule("zb-v", UNIT, 2, 4)), doc)
    result = _zbsolve("export", doc, "--format", fmt, "-o", tmp_path / "out")
    assert result.exit_code == 2
    assert result.stderr.strip() == (f"error: {doc}: partition is missing; format {fmt!r} needs the model's layers "
                                     "and stages (solve a model description, e.g. problems/models/llama3-8b.yaml)")
    assert not (tmp_path / "out").exists()


def test_export_command_formats(tmp_path: Path) -> None:
    doc = _plan_document(tmp_path, "interleaved")
    folder = tmp_path / "tt"
    result = _zbsolve("export", doc, "-f", "torchtitan", "-o", folder, "--microbatch-size", "2", "--rename",
                      "output=output")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == f"wrote {folder / 'schedule.csv'}, {folder / 'torchtitan.json'}, " \
                                    f"{folder / 'torchtitan-args.txt'}"
    config = json.loads((folder / "torchtitan.json").read_text())
    assert config["training"] == {"local_batch_size": 8, "disable_cuda_graphs": True}
    assert config["parallelism"]["module_fqns_per_model_part"][-1][-1] == "output"
    result = _zbsolve("export", doc, "-f", "megatron")
    assert result.exit_code == 0
    assert result.stdout == "--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout 'Et*2|t*2|t|tL'\n"
    for args, message in ((["-f", "torch-csv"], "output is missing: format 'torch-csv' writes files"),
                          (["-f", "megatron", "--rename", "a=b"],
                           "rename = 'a=b' applies to format 'torchtitan' only, not 'megatron'")):
        result = _zbsolve("export", doc, *args)
        assert result.exit_code == 2 and result.stderr.strip() == f"error: {message}"


def _zbsolve(*args: object):
    """The command line run in-process on a wide terminal (result: exit_code, stdout, stderr)."""
    from typer.testing import CliRunner

    from zbsolve.app.cli import app

    return CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "100000"})
