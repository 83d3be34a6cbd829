"""Activation memory under tp=2 with sequence parallelism, measured with MemTracker in real gloo
processes (tests/actmem_ranks.py): per token and block, within 1.25x of the analytic minimum
(Korthikanti-style count, docs/PLANNER.md) and within 5% of the planner, while the step still
computes what one process computes. RMSNorm keeps only its input for backward."""

from __future__ import annotations

import sys

import pytest
import torch

from lightning_dist.models.llama import RMSNorm
from lightning_dist.parity import REPO_ROOT
from lightning_dist.planner.activations import (
    analytic_layer_activation_bytes,
    layer_activation_bytes,
)
from lightning_dist.planner.settings import TrainSettings
from tests.rank_scripts import run_two_ranks


def test_rmsnorm_keeps_only_its_input_and_matches_autograd():
    torch.manual_seed(0)
    norm = RMSNorm(64)
    torch.nn.init.normal_(norm.weight)
    x = torch.randn(2, 8, 64, requires_grad=True)
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = norm(x)
    assert [tuple(t.shape) for t in saved] == [(2, 8, 64), (64,), (2, 8, 1)]  # x, weight, 1/rms
    assert saved[0] is x
    grad = torch.randn_like(y)
    y.backward(grad)
    x2, w2 = x.detach().requires_grad_(), norm.weight.detach().clone().requires_grad_()
    ref = x2 * torch.rsqrt(x2.pow(2).mean(-1, keepdim=True) + norm.eps) * w2
    ref.backward(grad)
    assert torch.equal(y, ref)
    torch.testing.assert_close(x.grad, x2.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(norm.weight.grad, w2.grad, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> dict:
    return run_two_ranks("actmem_ranks.py", tmp_path_factory.mktemp("actmem") / "result.json")


@pytest.mark.slow
def test_per_layer_activations_near_the_analytic_count(measured):
    sys.path.insert(0, str(REPO_ROOT / "tests"))
    from actmem_ranks import BATCH, SEQ, args

    per_layer = (measured["activations 4"] - measured["activations 2"]) / 2 / measured["tokens"]
    settings = TrainSettings(
        global_batch_size=BATCH, seq_len=SEQ, micro_batch_size=BATCH, precision="32-true",
        sequence_parallel=True,
    )  # fmt: skip
    analytic = analytic_layer_activation_bytes(args(4), 2, settings)
    planner = layer_activation_bytes(args(4), 2, settings)
    print(
        f"tp=2 + SP, bytes per token and block: measured {per_layer:.0f}, analytic {analytic:.0f} "
        f"(ratio {per_layer / analytic:.3f}), planner {planner:.0f} "
        f"(error {planner / per_layer - 1:+.1%})"
    )
    assert per_layer <= 1.25 * analytic
    assert abs(planner / per_layer - 1) <= 0.05


@pytest.mark.slow
def test_sequence_parallel_step_matches_one_process(measured):
    tp2, single = measured["tp2 losses 4"], measured["single losses 4"]
    assert max(abs(a - b) / a for a, b in zip(tp2, single, strict=True)) <= 1e-5
