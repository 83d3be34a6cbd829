"""RMSNorm keeps only its input for backward (besides its weight and 1/rms), and its output and
gradients are those of the plain formula under autograd. (Activation memory under tp=2 with
sequence parallelism and per checkpointing choice is tests/dist/test_activation_memory_dist.py.)"""

from __future__ import annotations

import torch

from lightning_dist.models.llama import RMSNorm


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
