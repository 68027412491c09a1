"""Post-validated optimizer step: equal to a synchronous clipped step, exact rollback on inf/NaN."""

import math

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from zbsolve.base.errors import InputError
from zbsolve.runtime.post_validation import GlobalState, PostValidatedOptimizer, step_stages

OPTIMIZERS = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=0.01),
    "adamw": lambda params: torch.optim.AdamW(params, lr=0.01, weight_decay=0.1),
}
STAGES = 3
MAX_NORM = 50.0


def make_stages(num_stages=STAGES):
    torch.manual_seed(0)
    return [nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 4)) for _ in range(num_stages)]


def set_grads(stages, seed, scale=None, poison=None):
    """Random gradients; ``scale[s]`` multiplies stage s's; ``poison = (s, value)`` puts value in stage s's."""
    gen = torch.Generator().manual_seed(seed)
    for s, stage in enumerate(stages):
        for p in stage.parameters():
            p.grad = torch.randn(p.shape, generator=gen) * (scale or {}).get(s, 1.0)
        if poison is not None and poison[0] == s:
            next(stage.parameters()).grad[0, 0] = poison[1]


def synchronous_step(stages, optimizers, max_norm):
    """The barrier version: clip over every stage's parameters, skip on inf/NaN, then step every stage."""
    norm = torch.nn.utils.clip_grad_norm_([p for s in stages for p in s.parameters()], max_norm)
    if math.isfinite(norm):
        for opt in optimizers:
            opt.step()
    return float(norm)


def snapshot(stages, optimizers):
    params = [p.detach().clone() for s in stages for p in s.parameters()]
    states = [{i: {k: v.clone() for k, v in st.items()} for i, st in opt.state_dict()["state"].items()}
              for opt in optimizers]
    return params, states


def assert_same(a, b, exact=True):
    (pa, sa), (pb, sb) = a, b
    close = torch.equal if exact else (lambda x, y: torch.allclose(x, y, rtol=1e-6, atol=1e-6))
    assert all(close(x, y) for x, y in zip(pa, pb, strict=True))
    assert [sorted(s) for s in sa] == [sorted(s) for s in sb]
    for x, y in zip(sa, sb, strict=True):
        for i in x:
            assert sorted(x[i]) == sorted(y[i])
            assert all(close(x[i][k], y[i][k]) for k in x[i])


def pair(kind, max_norm):
    """Reference stages and optimizers, and an identical copy wrapped for the post-validated step."""
    ref, test = make_stages(), make_stages()
    ref_opts = [OPTIMIZERS[kind](s.parameters()) for s in ref]
    wrapped = [PostValidatedOptimizer(OPTIMIZERS[kind](s.parameters()), max_norm) for s in test]
    return ref, ref_opts, test, wrapped


@pytest.mark.parametrize("kind", OPTIMIZERS)
def test_normal_gradients_step_early_and_equal_synchronous(kind):
    ref, ref_opts, test, wrapped = pair(kind, max_norm=MAX_NORM)
    for seed in range(3):
        set_grads(ref, seed)
        set_grads(test, seed)
        assert synchronous_step(ref, ref_opts, MAX_NORM) < MAX_NORM
        outcomes = step_stages(wrapped)
        assert all(o.speculative and not o.rolled_back and o.stepped and o.clip_coef == 1.0 for o in outcomes)
        assert_same(snapshot(test, [w.optimizer for w in wrapped]), snapshot(ref, ref_opts))


@pytest.mark.parametrize("kind", OPTIMIZERS)
@pytest.mark.parametrize("poison", [(STAGES - 1, math.inf), (0, math.nan), (1, -math.inf)])
def test_inf_or_nan_restores_parameters_and_state_exactly(kind, poison):
    _, _, test, wrapped = pair(kind, max_norm=None)
    opts = [w.optimizer for w in wrapped]
    for seed in range(2):
        before = snapshot(test, opts)
        set_grads(test, seed, poison=poison)
        outcomes = step_stages(wrapped)
        assert [o.speculative for o in outcomes] == [s < poison[0] for s in range(STAGES)]
        assert [o.rolled_back for o in outcomes] == [s < poison[0] for s in range(STAGES)]
        assert not any(o.stepped for o in outcomes)
        assert_same(snapshot(test, opts), before)
        set_grads(test, 10 + seed)
        assert all(o.stepped for o in step_stages(wrapped))
        assert all(state for state in snapshot(test, opts)[1])


@pytest.mark.parametrize("kind", OPTIMIZERS)
@pytest.mark.parametrize("big", [0, STAGES - 1])
def test_clipping_redoes_the_step_as_synchronous(kind, big):
    ref, ref_opts, test, wrapped = pair(kind, max_norm=MAX_NORM)
    for seed in range(3):
        set_grads(ref, seed, scale={big: 100.0})
        set_grads(test, seed, scale={big: 100.0})
        assert synchronous_step(ref, ref_opts, MAX_NORM) > MAX_NORM
        outcomes = step_stages(wrapped)
        assert [o.speculative for o in outcomes] == [s < big for s in range(STAGES)]
        assert [o.rolled_back for o in outcomes] == [s < big for s in range(STAGES)]
        assert all(o.stepped and o.clip_coef < 1.0 for o in outcomes)
        assert_same(snapshot(test, [w.optimizer for w in wrapped]), snapshot(ref, ref_opts), exact=False)


def test_single_stage_without_group_is_a_clipped_step():
    (ref,), (test,) = make_stages(1), make_stages(1)
    ref_opt = OPTIMIZERS["adamw"](ref.parameters())
    wrapped = PostValidatedOptimizer(OPTIMIZERS["adamw"](test.parameters()), max_norm=0.5)
    set_grads([ref], 0)
    set_grads([test], 0)
    synchronous_step([ref], [ref_opt], 0.5)
    outcome = wrapped.step()
    assert not outcome.speculative and outcome.stepped
    assert_same(snapshot([test], [wrapped.optimizer]), snapshot([ref], [ref_opt]), exact=False)


def test_global_state_round_trip_and_bad_max_norm():
    state = GlobalState(True, 2.5).combine(GlobalState(False, 1.0))
    assert GlobalState.from_tensor(state.to_tensor()) == GlobalState(True, 3.5)
    with pytest.raises(InputError, match="max_norm = -1"):
        PostValidatedOptimizer(OPTIMIZERS["sgd"](make_stages(1)[0].parameters()), -1.0)


def _rank(rank, init_file, kind):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        ref, ref_opts, test, wrapped = pair(kind, max_norm=MAX_NORM)
        mine = PostValidatedOptimizer(wrapped[rank].optimizer, MAX_NORM, group=dist.group.WORLD)
        for seed, scale, poison in [(0, None, None), (1, {1: 100.0}, None), (2, None, (1, math.inf))]:
            set_grads(ref[:2], seed, scale, poison)
            set_grads(test[:2], seed, scale, poison)
            assert (synchronous_step(ref[:2], ref_opts[:2], MAX_NORM) > MAX_NORM) == (seed > 0)
            outcome = mine.step()
            assert outcome.speculative == (rank == 0 or seed == 0)
            assert outcome.rolled_back == (rank == 0 and seed > 0)
            assert_same(snapshot([test[rank]], [mine.optimizer]), snapshot([ref[rank]], [ref_opts[rank]]),
                        exact=False)
        dist.barrier()  # neither rank tears gloo down while the other still talks to it (an abort under load)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("kind", ["adamw"])
def test_two_gloo_ranks_match_synchronous(kind, tmp_path):
    mp.spawn(_rank, args=(str(tmp_path / "rendezvous"), kind), nprocs=2, join=True)
