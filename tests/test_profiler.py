"""Profiler: a measured Profile that validates and schedules, the B/W split, memory accounting, latency, and the
per-layer model description."""

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the torch extra)")

from torch import nn
from typer.testing import CliRunner

from zbsolve.app.cli import app
from zbsolve.base.errors import InputError
from zbsolve.core.profile import Profile
from zbsolve.core.simulator import simulate
from zbsolve.costmodel.model import Model
from zbsolve.execute.layer_profiler import STATE_COPIES, profile_layers
from zbsolve.execute.memory import SavedBytes
from zbsolve.execute.modules import ModelSpec, StagedModel, load_layers, load_model
from zbsolve.execute.profiler import (
    NOISE_COLUMNS,
    Measurement,
    ProfileOptions,
    ReadBytes,
    chain_inputs,
    latency_line,
    measure,
    measure_latency,
    measure_stage,
    noise_table,
    profile_header,
    relative_iqr,
    run_passes,
    write_profile,
)
from zbsolve.problem.partition import partition, stage_profile
from zbsolve.problem.problem_file import Problem
from zbsolve.schedulers.families import make_schedule

RUNNER = CliRunner()
SPEC = ModelSpec(layers=4, hidden=64, vocab=96, seq_len=32)
"""A GPT of 4 blocks: 7 layers (embed, blocks.0..3, norm, head), 2 stages of 2 blocks; large enough that compute,
not the per-call overhead of the split backward, dominates its times."""
QUICK = {"microbatch_size": 2, "repeats": 3, "warmup": 1, "latency": False}


def test_measured_profile_is_usable(tmp_path):
    path = tmp_path / "profile.yaml"
    options = ProfileOptions(microbatch_size=2, repeats=2, warmup=1)
    measurement = measure(load_model(ModelSpec(), 2), options)
    header = profile_header(ModelSpec(), 2, options)
    assert header.startswith("zbsolve profile of gpt: 2 stages, microbatch size 2, 2 repeats after 1 warm-up, "
                             "device cpu, 1 threads, torch ") and header.endswith(", memory model torch")
    profile = write_profile(measurement, path, header)
    assert profile == measurement.profile
    assert Profile.load(path) == profile
    assert profile.num_stages == 2
    assert profile.t_comm > 0
    for s in range(2):
        assert all(t > 0 for t in profile.durations(s))
        mem_f, mem_b, mem_w = profile.memories(s)
        assert mem_f > 0 and mem_f + mem_b + mem_w == 0
    text = path.read_text()
    assert text.startswith(f"# {header}\n") and "# noise" in text and "#   t_comm:" in text
    table = noise_table(measurement)
    assert [row[0] for row in table] == ["0", "1"] and all(len(row) == len(NOISE_COLUMNS) for row in table)
    assert latency_line(measurement).startswith(f"t_comm (one-way) = {profile.t_comm:,.1f} µs ±")
    problem = Problem(num_devices=2, num_microbatches=4, profile=Profile.load(path))
    timeline = simulate(make_schedule("zb-h1", problem.profile, 2, 4))
    assert timeline.work[0] == pytest.approx(4 * sum(profile.durations(0)))


def test_forward_memory_grows_with_microbatch_size():
    model = load_model(ModelSpec(), 3)
    small, large = (measure(model, ProfileOptions(microbatch_size=b, repeats=1, warmup=0, latency=False)).profile
                    for b in (1, 3))
    for s in range(3):
        assert large.memories(s)[0] > small.memories(s)[0] > 0


class Lookup(nn.Module):
    """A first stage whose only leaf module gives no differentiable output: nothing to cut B and W at."""

    def __init__(self):
        super().__init__()
        self.pre = nn.Identity()
        self.table = nn.Parameter(torch.randn(10, 4))

    def forward(self, ids):
        return self.table[self.pre(ids)].tanh()


def assert_split_matches_full_backward(stage, x, tail, loss_fn, split):
    run_passes(stage, x, tail, loss_fn, lambda: None, split=split)
    split = [p.grad.clone() for p in stage.parameters()]
    stage.zero_grad(set_to_none=True)
    out = stage(x)
    torch.autograd.backward(loss_fn(out, tail) if loss_fn else out, None if loss_fn else tail)
    assert all(torch.allclose(a, p.grad, rtol=1e-5, atol=1e-7) for a, p in zip(split, stage.parameters()))


def test_split_backward_gives_the_full_backward_gradients():
    model = load_model(ModelSpec(), 2)
    xs, tails = chain_inputs(model.stages, model.make_batch, 2, torch.device("cpu"))
    assert len(xs) == 3 and xs[2].shape == (2, 16, 64) and tails[1].shape == (2, 16)
    assert_split_matches_full_backward(model.stages[0], xs[0], tails[0], None, split=False)
    assert_split_matches_full_backward(model.stages[1], xs[1], tails[1], model.loss_fn, split=True)
    ids = torch.tensor([[1, 2, 2], [9, 0, 1]])
    assert_split_matches_full_backward(Lookup(), ids, torch.randn(2, 3, 4), None, split=False)


def saved_reads(stage, x, tail, loss_fn, split):
    """Bytes of saved activations F, B and W read; asserts that every weight gradient is there after W only."""
    saved = ReadBytes(stage.parameters())
    grads = []

    def mark():
        grads.append(all(p.grad is not None for p in stage.parameters()))
        saved.next_pass()

    run_passes(stage, x, tail, loss_fn, mark, saved, split=split)
    assert grads == [False, False, True]
    stage.zero_grad(set_to_none=True)
    return [sum(r.values()) for r in saved.reads[:3]]


def test_first_stage_b_is_a_no_op_and_w_runs_the_whole_backward():
    model = load_model(SPEC, 2)
    xs, tails = chain_inputs(model.stages, model.make_batch, 2, torch.device("cpu"))
    f0, b0, w0 = saved_reads(model.stages[0], xs[0], tails[0], None, split=False)
    f1, b1, w1 = saved_reads(model.stages[1], xs[1], tails[1], model.loss_fn, split=True)
    assert f0 == b0 == 0 < w0 and f1 == 0 < w1 < b1
    profile = measure(model, ProfileOptions(**QUICK)).profile
    assert profile.t_b[0] < 0.1 * profile.t_w[0] and profile.t_b[1] > 0.1 * profile.t_w[1]
    assert profile.mem_b[0] == 0 and profile.mem_w[0] == -profile.mem_f[0] < 0
    # a first stage on floating-point inputs too: under "paper", split, it would free its Tanh output at B
    floats = StagedModel([nn.Sequential(nn.Linear(8, 8), nn.Tanh()), nn.Linear(8, 8)],
                         lambda out, target: ((out - target) ** 2).mean(),
                         lambda batch_size, seed: (torch.randn(batch_size, 8), torch.randn(batch_size, 8)))
    paper = measure(floats, ProfileOptions(**QUICK, memory_model="paper")).profile
    assert paper.mem_b[0] == 0 > paper.mem_b[1]


def test_memory_models_on_a_known_graph():
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(7, 3), nn.GELU(), nn.Linear(3, 2))
    x, tail = torch.randn(5, 7), torch.randn(5, 2)
    # saved: x (140 B, W reads it), the GELU input (60 B, only B reads it), the GELU output (60 B, W reads it)
    expected = {("torch", True): (260, 0, -260), ("paper", True): (260, -60, -200),
                ("torch", False): (260, 0, -260), ("paper", False): (260, 0, -260)}
    for (memory_model, split), deltas in expected.items():
        samples = measure_stage(mlp, x, tail, None, split=split, repeats=1, warmup=0, memory_model=memory_model)
        assert (samples["mem_f"], samples["mem_b"], samples["mem_w"]) == tuple([d] for d in deltas)
        assert all(t > 0 for name in ("t_f", "t_b", "t_w") for t in samples[name])


def test_memory_models_balance_and_paper_frees_at_b():
    model = load_model(SPEC, 2)
    torch_profile, paper = (measure(model, ProfileOptions(**QUICK, memory_model=m)).profile for m in ("torch", "paper"))
    for p in (torch_profile, paper):
        assert all(sum(p.memories(s)) == 0 for s in range(2))
    assert paper.mem_f == torch_profile.mem_f
    assert paper.mem_b[0] == 0 and paper.mem_b[1] < torch_profile.mem_b[1] <= 0
    assert -paper.mem_b[1] > 0.2 * paper.mem_f[1]


def test_per_layer_profile_sums_to_the_stage_profile(tmp_path):
    totals = [[0.0, 0.0], [0.0, 0.0]]
    """F, then B + W: summed over the layers, measured per stage."""
    for memory_model in ("torch", "paper"):
        options = ProfileOptions(**QUICK, memory_model=memory_model)
        described = profile_layers(load_layers(SPEC), options, name="gpt", source="test", seq_len=SPEC.seq_len)
        path = tmp_path / f"{memory_model}.yaml"
        described.save(path)
        assert Model.load(path) == described
        assert [layer.name for layer in described.layers] == ["embed", "blocks.0", "blocks.1", "blocks.2",
                                                              "blocks.3", "norm", "head"]
        assert [layer.block for layer in described.layers] == [False, True, True, True, True, False, False]
        assert described.setting.seq_len == 32 and described.setting.microbatch_size == 2
        assert described.setting.dtype == "fp32" and described.t_comm is None
        embed, block, head = described.layers[0], described.layers[1], described.layers[-1]
        assert embed.t_b < 0.1 * embed.t_w and embed.mem_b == 0
        assert (block.mem_b < 0) == (memory_model == "paper")
        assert embed.static_bytes == STATE_COPIES * 4 * (96 + 32) * 64
        assert head.static_bytes == STATE_COPIES * 4 * 64 * 96
        assert block.out_bytes == 2 * 32 * 64 * 4 and head.out_bytes == 2 * 32 * 96 * 4
        ranges = partition(described, 2)
        assert ranges == [(0, 3), (3, 7)]
        summed = stage_profile(described, ranges)
        measured = measure(load_model(SPEC, 2), options).profile
        assert summed.mem_f == measured.mem_f
        assert summed.mem_b[1] == measured.mem_b[1] and summed.mem_w[1] == measured.mem_w[1]
        assert all(sum(summed.memories(s)) == 0 for s in range(2))
        for total, fields in zip(totals, (("t_f",), ("t_b", "t_w"))):
            total[0] += sum(sum(getattr(summed, name)) for name in fields)
            total[1] += 1e-6 * sum(sum(getattr(measured, name)) for name in fields)
    # CPU times are noisy (more so beside other work), and each layer pays the split backward's per-call overhead:
    # the totals agree within a factor 4, which still catches a lost layer's unit (s vs µs) or a pass timed twice.
    for layers_total, stages_total in totals:
        assert 0.25 < layers_total / stages_total < 4


USER_MODEL = "zbsolve_profiler_user_model"
USER_SOURCE = """
import torch
from torch import nn


def make_batch(batch_size, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch_size, 8, generator=gen), torch.randn(batch_size, 8, generator=gen)


def loss_fn(output, target):
    return ((output - target) ** 2).mean()


def sequential(n):
    return [nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8))]


def linear(n):
    return [nn.Linear(8, 8) for _ in range(n)]
"""


def test_user_sequential_model_per_layer(tmp_path, monkeypatch):
    (tmp_path / f"{USER_MODEL}.py").write_text(USER_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    layered = load_layers(ModelSpec(f"{USER_MODEL}:sequential"))
    assert [(layer.name, layer.block) for layer in layered.layers] == [
        ("0", True), ("1", True), ("2", True), ("3", True), ("4", True)]
    described = profile_layers(layered, ProfileOptions(repeats=1, warmup=0, latency=False))
    assert described.setting is None and len(described.layers) == 5
    assert all(layer.t_b > 0 and layer.mem_f + layer.mem_b + layer.mem_w == 0 for layer in described.layers)
    with pytest.raises(InputError, match="one non-empty torch.nn.Sequential for 1 stage"):
        load_layers(ModelSpec(f"{USER_MODEL}:linear"))


def test_profile_command_per_layer(tmp_path):
    path = tmp_path / "gpt.yaml"
    run = RUNNER.invoke(app, ["profile", "--model", "gpt", "--per-layer", "--layers", "2", "--repeats", "1",
                              "--warmup", "0", "--no-latency", "--memory-model", "paper", "-o", str(path)])
    assert run.exit_code == 0, run.output
    described = Model.load(path)
    assert [layer.name for layer in described.layers] == ["embed", "blocks.0", "blocks.1", "norm", "head"]
    assert described.source.startswith("zbsolve profile --model gpt --per-layer --microbatch-size 1 ")
    assert "--memory-model paper" in described.source and described.layers[1].mem_b < 0
    assert "per layer" in run.output and "blocks.1" in run.output and "memory model paper" in run.output
    for args, message in ((["--per-layer", "-p", "2"], "--stages 2 with --per-layer"),
                          ([], "--stages is missing"),
                          (["-p", "2", "--memory-model", "tf"], "memory_model = 'tf' must be one of torch, paper")):
        bad = RUNNER.invoke(app, ["profile", "--model", "gpt", "-o", str(tmp_path / "bad.yaml"), *args])
        assert bad.exit_code == 2 and message in bad.output, bad.output
    assert not (tmp_path / "bad.yaml").exists()


def test_saved_bytes_counts_activations_until_backward_frees_them():
    linear = nn.Linear(7, 3)
    x = torch.randn(5, 7, requires_grad=True)
    saved = SavedBytes(linear.parameters())
    with saved.hooks():
        y = torch.tanh(linear(x))
        z = y * y
    assert saved.current == saved.peak == x.nbytes + y.nbytes
    del z
    y.sum().backward()
    assert saved.current == 0 and saved.peak == x.nbytes + y.nbytes
    saved.reset_peak()
    assert saved.peak == 0


def test_medians_noise_and_exact_memory_balance():
    samples = {"t_f": [[1.0, 2.0, 3.0, 4.0, 100.0]], "t_b": [[2.0]], "t_w": [[1.0, 1.0]],
               "mem_f": [[10.0, 30.0, 20.0]], "mem_b": [[-4.0]], "mem_w": [[-99.0]]}
    m = Measurement(samples, [5.0, 7.0])
    assert m.profile == Profile(t_f=[3.0], t_b=[2.0], t_w=[1.0], t_comm=6.0, mem_f=[20.0], mem_b=[-4.0],
                                mem_w=[-16.0])
    assert m.noise()["t_f"] == [pytest.approx(2 / 3)]
    assert m.noise()["t_b"] == [0.0] and m.noise()["t_comm"] == [pytest.approx(1 / 6)]
    assert relative_iqr([0.0, 0.0]) == 0.0


def test_bad_input():
    model = load_model(ModelSpec(), 1)
    with pytest.raises(InputError, match="microbatch_size = 0"):
        ProfileOptions(microbatch_size=0)
    with pytest.raises(InputError, match="threads = 0"):
        ProfileOptions(threads=0)
    with pytest.raises(InputError, match="device = 'tpu'"):
        ProfileOptions(device="tpu")
    with pytest.raises(InputError, match="memory_model = 'zb'"):
        ProfileOptions(memory_model="zb")
    if not torch.cuda.is_available():
        with pytest.raises(InputError, match="device = 'cuda' but CUDA is not available"):
            measure(model, ProfileOptions(device="cuda"))
    with pytest.raises(InputError, match="layers = 2"):
        load_model(ModelSpec(layers=2), 3)
    with pytest.raises(InputError, match="no_such_module"):
        load_model(ModelSpec("no_such_module:stages"), 2)
    with pytest.raises(InputError, match="numel = 0"):
        measure_latency(0)
