"""Ranks of unequal speed and slow links (docs/SLOW_LINKS.md), in one process: the sampler's
speed-weighted shares, the knobs' parsing and the strategy's refusals, the simulation tool's
pacing (a lower bound only: a sleep never ends early) and DiLoCo's outer step. The gradient
hooks (on a gloo group of one) and the multi-rank runs against stored references are
tests/dist/test_slow_links_dist.py."""

from __future__ import annotations

import time

import pytest
import torch

from lightning_dist.lm.sampling import GlobalBatchSampler
from lightning_dist.options.speed import DataShareOptions, GradientSyncOptions, SimulationOptions


def _steps(sampler: GlobalBatchSampler) -> list[list[int]]:
    stream, per_step = list(sampler), sampler.grad_accumulation * sampler.micro_batch_size
    return [stream[k * per_step : (k + 1) * per_step] for k in range(sampler.steps_per_epoch)]


def test_uneven_shares_read_the_same_global_batches_as_equal_ones():
    equal = [_steps(GlobalBatchSampler(50, 12, 3, r, 2, seed=3)) for r in range(2)]
    shares = [4, 2]  # micro-batches of rank 0 and rank 1, 2 samples each
    uneven = [_steps(GlobalBatchSampler(50, 12, 2, r, 2, seed=3, shares=shares)) for r in range(2)]
    for k in range(50 // 12):
        assert set(equal[0][k] + equal[1][k]) == set(uneven[0][k] + uneven[1][k])
        assert len(uneven[0][k]) == 8 and len(uneven[1][k]) == 4  # 4 x 2 and 2 x 2 samples
        assert not set(uneven[0][k]) & set(uneven[1][k])
    with pytest.raises(ValueError, match=r"\[3, 2\] x 2 samples do not make"):
        GlobalBatchSampler(50, 12, 2, 0, 2, shares=[3, 2])


def test_the_knobs_parse_and_name_their_bad_values():
    assert SimulationOptions(simulate_slowdown=[1, 3]).factor(1) == 3.0
    sim = SimulationOptions(simulate_slowdown={1: 2})
    assert (sim.factor(0), sim.factor(1), sim.enabled) == (1.0, 2.0, True)
    assert not SimulationOptions().enabled and SimulationOptions().factor(0) is None
    with pytest.raises(ValueError, match=r"simulate_slowdown=\[1, 0\]: rank 1 has factor 0"):
        SimulationOptions(simulate_slowdown=[1, 0])
    with pytest.raises(ValueError, match=r"strategy.dp_shares=\[2, 0\] must be whole numbers"):
        DataShareOptions(dp_shares=[2, 0])
    with pytest.raises(ValueError, match="grad_compression='int8' is not one of"):
        GradientSyncOptions(grad_compression="int8")
    with pytest.raises(ValueError, match="all-reduces no gradients to compress"):
        GradientSyncOptions(diloco_inner_steps=8, grad_compression="bf16")
    with pytest.raises(ValueError, match="diloco_outer_momentum=1.0 must be below 1"):
        GradientSyncOptions(diloco_outer_momentum=1.0)
    with pytest.raises(ValueError, match="diloco_outer_lr=nan must be a number above 0"):
        GradientSyncOptions(diloco_outer_lr=float("nan"))
    with pytest.raises(ValueError, match="simulate_flops=inf must be a number above 0"):
        SimulationOptions(simulate_flops=float("inf"))


def _check(strategy, **run):
    run = {"devices": 2, "num_nodes": 1, "precision": "32-true", "accelerator": "cpu", **run}
    strategy.check_run(**run)


def test_the_strategies_refuse_what_they_cannot_run():
    from lightning_dist.strategies.ddp import DataParallelStrategy
    from lightning_dist.strategies.parallel3d import Parallel3DStrategy

    _check(DataParallelStrategy(dp_shares=[2, 1]), global_batch_size=12, micro_batch_size=2)
    with pytest.raises(ValueError, match=r"global_batch_size=8 is not divisible by sum\("):
        _check(DataParallelStrategy(dp_shares=[2, 1]), global_batch_size=8)
    with pytest.raises(ValueError, match=r"dp_shares=\[2, 1, 1\] has 3 entries for 2"):
        _check(DataParallelStrategy(dp_shares=[2, 1, 1]), global_batch_size=8)
    with pytest.raises(ValueError, match="with strategy.diloco_inner_steps=8 is not supported"):
        _check(DataParallelStrategy(dp_shares=[1, 1], diloco_inner_steps=8))
    with pytest.raises(ValueError, match="are a CPU test tool .* does not slow cuda kernels"):
        _check(DataParallelStrategy(simulate_slowdown=[1, 2]), accelerator="cuda")
    with pytest.raises(ValueError, match=r"names rank\(s\) \[2\], but the run has 2 ranks"):
        _check(DataParallelStrategy(simulate_slowdown={2: 2}))
    with pytest.raises(ValueError, match="Parallel3DStrategy has no hook for it: use strategy=ddp"):
        _check(Parallel3DStrategy(pp=2, dp_shard=1, simulate_delay_ms=5), global_batch_size=8)


def _debug_model():
    from lightning_dist.models.args import ModelArgs

    args = ModelArgs(
        dim=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        vocab_size=128,
        ffn_hidden_size=128,
        max_seq_len=64,
    )
    torch.manual_seed(0)
    model = args.build()
    model.init_weights()
    return model


def test_a_simulated_rank_takes_at_least_its_simulated_time():
    from lightning_dist.cluster.simulate import apply_simulated_speed
    from lightning_dist.parallel.fsdp import find_block_types

    model = _debug_model()
    tokens = torch.randint(0, 128, (2, 32))
    params = sum(p.numel() for p in model.layers.parameters()) + model.output.weight.numel()
    flops, factor = 2e9, 3.0
    forward = factor * 2 * params * tokens.numel() / flops  # seconds, all paced modules
    assert apply_simulated_speed(model, find_block_types(model), factor=factor, flops=flops) == 3
    started = time.perf_counter()
    out = model(tokens)
    after_forward = time.perf_counter()
    out.float().pow(2).mean().backward()
    done = time.perf_counter()
    assert after_forward - started >= forward * 0.999
    assert done - after_forward >= 2 * forward * 0.999  # backward: twice the forward


def test_diloco_applies_the_outer_nesterov_step_to_the_pseudo_gradient():
    from lightning_dist.cluster.diloco import DiLoCo

    param = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    outer = DiLoCo([param], inner_steps=2, outer_lr=0.7, outer_momentum=0.9)
    change = torch.tensor([0.1, -0.2])
    with torch.no_grad():
        param -= change  # an inner step
    assert not outer.after_inner_step(1) and torch.allclose(param, torch.tensor([0.9, 2.2]))
    assert outer.after_inner_step(2)  # the second: sync
    # Nesterov's first step: buffer = g, update = g + 0.9 g; anchor - 0.7 x 1.9 g
    assert torch.allclose(param, torch.tensor([1.0, 2.0]) - 0.7 * 1.9 * change)
    assert outer.syncs == 1 and outer.after_inner_step(3, last=True)  # the run's last step
    # Syncs follow the run's step number: resumed after step 5, the next is at step 6.
    assert [outer.after_inner_step(s) for s in (6, 7)] == [True, False] and outer.syncs == 3
    averaging = DiLoCo([param], inner_steps=1, outer_lr=1.0, outer_momentum=0.0)
    with torch.no_grad():
        param += 1.0
    moved = param.detach().clone()
    averaging.after_inner_step(1)  # LocalSGD over one replica: the parameters as they are
    assert torch.allclose(param, moved)


def test_a_checkpointed_block_pays_its_recomputation():
    """Under checkpointing a block's forward runs again in its backward; the pace adds it:
    backward takes twice the forward plus the forward once more (torch stops the recomputed
    forward before the forward hook, so the pre-hook paces it)."""
    from torch.utils.checkpoint import checkpoint

    from lightning_dist.cluster.simulate import apply_simulated_speed

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(64, 64)

        def forward(self, x):
            return torch.relu(self.linear(x))

    class Checkpointed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block = Block()

        def forward(self, x):
            return checkpoint(self.block, x, use_reentrant=False)

    model, x = Checkpointed(), torch.randn(100, 64, requires_grad=True)
    forward = 0.05  # seconds for the 100 tokens
    flops = 2 * sum(p.numel() for p in model.parameters()) * 100 / forward
    assert apply_simulated_speed(model, (Block,), factor=1.0, flops=flops) == 1
    model(x).sum().backward()  # warm-up
    started = time.perf_counter()
    out = model(x)
    after_forward = time.perf_counter()
    out.sum().backward()
    done = time.perf_counter()
    assert after_forward - started >= forward * 0.999
    assert done - after_forward >= 3 * forward * 0.999  # 2 x forward + the recomputation
