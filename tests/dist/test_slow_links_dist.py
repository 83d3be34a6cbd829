"""Ranks of unequal speed and slow links (docs/SLOW_LINKS.md) in real gloo processes: every run
trains through `train(cfg)` on a world of 2 ranks started once per session, with the
simulation tool on (its sleeps kept negligible here by a fast simulated device: what is tested
is that the pacing hooks change no loss; the speed-ups are bench/slow_devices.py's).

- speed-weighted shares: DDP with rank 1 simulated 2x slower and shares [2, 1] (rank 0 runs
  two micro-batches per step, rank 1 one) equals one device's stored reference within 1e-4 at
  every step, at a learning rate and Adam epsilon at which a wrong weighting shows;
- a 2-stage pipeline with stage 1 simulated 3x slower, cut uniformly (2/2) and speed-balanced
  (3/1), equals one device within 1e-4, train and validation losses;
- compressed gradients (bf16, PowerSGD) stay near the reference, and DiLoCo's replicas differ
  between syncs and agree after each (`tests/replica_check.py`);
- the gradient hooks themselves on a gloo group of one: bf16 rounds, the DiLoCo hook keeps the
  gradient local, the delay waits.
"""

from __future__ import annotations

import time

import baselines
import pytest
import torch

from lightning_dist.run.parity_runs import max_relative_difference

pytestmark = pytest.mark.slow

TOLERANCE = 1e-4
LLAMA = ["model=llama_debug", "data=synthetic", "logger=none", "trainer.max_steps=10"]
SHARP = [
    "trainer.val_check_interval=5",
    "optim.eps=1e-3",
    "optim.warmup_steps=1",
    "optim.lr=3e-2",
    "trainer.gradient_clip_val=null",
]
SINGLE = ["strategy=single", "hardware.devices=1"]
FAST_SIMULATION = ["strategy.simulate_flops=1e12"]  # the hooks run, their sleeps are ~0
DDP2 = ["strategy=ddp", "hardware.devices=2", *baselines.QUIET]


def _run(train_in, tmp_path, reference: list[str], candidate: list[str]) -> tuple[dict, dict]:
    ref = baselines.reference([*reference, *SINGLE])
    return ref, train_in([*reference, *candidate], tmp_path)


def test_speed_weighted_shares_equal_one_device(train_in, tmp_path):
    base = [*LLAMA, *SHARP, "data.global_batch_size=6"]
    shares = ["strategy.dp_shares=[2,1]", "strategy.simulate_slowdown={1:2}", *FAST_SIMULATION]
    ref, run = _run(train_in, tmp_path, base, [*DDP2, *shares])
    assert run["dp_shares"] == [2, 1]
    assert max_relative_difference(ref["losses"], run["losses"]) <= TOLERANCE
    assert max_relative_difference(ref["val_losses"], run["val_losses"]) <= TOLERANCE


@pytest.mark.parametrize("split", [2, 3])
def test_a_pipeline_with_a_slow_stage_equals_one_device_at_either_split(train_in, tmp_path, split):
    base = [*LLAMA, "trainer.val_check_interval=5"]
    pp = [
        "strategy=pp",
        "hardware.devices=2",
        f"strategy.split_points=[{split}]",
        "strategy.simulate_slowdown=[1,3]",
        *FAST_SIMULATION,
        *baselines.QUIET,
    ]
    ref, run = _run(train_in, tmp_path, base, pp)
    assert max_relative_difference(ref["losses"], run["losses"]) <= TOLERANCE
    assert max_relative_difference(ref["val_losses"], run["val_losses"]) <= TOLERANCE


def test_compressed_gradients_stay_near_one_device(train_in, tmp_path):
    base = [*LLAMA, *SHARP]
    for compression in ("bf16", "powersgd"):
        extra = [f"strategy.grad_compression={compression}", "strategy.powersgd_start_step=2"]
        ref, run = _run(train_in, tmp_path / compression, base, [*DDP2, *extra])
        assert run["grad_compression"] == compression
        assert max_relative_difference(ref["losses"], run["losses"]) <= 1e-2, compression


def test_diloco_replicas_step_alone_and_agree_after_each_sync(train_in, tmp_path):
    check = [
        "+callbacks.replicas._target_=tests.replica_check.ReplicaParameters",
        "+callbacks.replicas.agree_at=[4,8,10]",
        "+callbacks.replicas.differ_at=[2,6,9]",
    ]
    run = train_in([*LLAMA, *SHARP, *DDP2, "strategy.diloco_inner_steps=4", *check], tmp_path)
    assert run["diloco"]["syncs"] == 3  # after steps 4 and 8, and the last, 10
    assert len(run["losses"]) == 10


@pytest.fixture
def group_of_one():
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


class _Bucket:
    def __init__(self, values: torch.Tensor) -> None:
        self.values = values

    def buffer(self) -> torch.Tensor:
        return self.values


def test_gradient_hooks_compress_keep_local_and_delay(group_of_one):
    from lightning_dist.cluster.grad_sync import gradient_hook

    grads = torch.tensor([1.0 + 2**-12, -3.0, 0.1])
    state, hook = gradient_hook("bf16")
    reduced = hook(state, _Bucket(grads.clone())).wait()
    assert torch.equal(reduced, grads.to(torch.bfloat16).float())  # rounded once, mean of one
    assert not torch.equal(reduced, grads)
    state, hook = gradient_hook("none", local=True, delay_s=5.0)  # local: nothing to delay
    assert torch.equal(hook(state, _Bucket(grads.clone())).wait(), grads)
    assert gradient_hook("none") is None  # DDP's own all-reduce
    state, hook = gradient_hook("none", delay_s=0.05)
    started = time.perf_counter()
    assert torch.equal(hook(state, _Bucket(grads.clone())).wait(), grads)
    assert time.perf_counter() - started >= 0.05
