"""RMSNorm keeps only its input for backward (besides its weight and 1/rms), SwiGLU its two
projections, attention k and v unrepeated; their outputs and gradients are those of the plain
formulas under autograd. (Activation memory under tp=2 with
sequence parallelism and per checkpointing choice is tests/dist/test_activation_memory_dist.py.)"""

from __future__ import annotations

import copy

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


def _saved_shapes(fn, *inputs):
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out = fn(*inputs)
    return out, saved


def test_swiglu_keeps_its_two_projections_and_w2_its_input_with_autograds_gradients():
    from lightning_dist.models.llama import FeedForward

    torch.manual_seed(0)
    ffn = FeedForward(8, 16)
    x = torch.randn(2, 3, 8, requires_grad=True)
    out, saved = _saved_shapes(ffn, x)
    hidden = {t.untyped_storage().data_ptr() for t in saved if t.numel() == 2 * 3 * 16}
    assert len(hidden) == 3  # w1 x, w3 x and their product (w2's input); not silu(w1 x)
    grad = torch.randn_like(out)
    plain = copy.deepcopy(ffn)
    out.backward(grad)
    x2 = x.detach().requires_grad_()
    ref = plain.w2(torch.nn.functional.silu(plain.w1(x2)) * plain.w3(x2))
    assert torch.equal(out, ref)
    ref.backward(grad)
    assert torch.equal(x.grad, x2.grad)
    for (name, a), b in zip(ffn.named_parameters(), plain.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad), name


def test_grouped_query_attention_keeps_k_and_v_unrepeated_and_matches_the_repeated_form():
    from lightning_dist.models.args import ModelArgs
    from lightning_dist.models.llama import apply_rope

    torch.manual_seed(0)
    shape = ModelArgs(dim=32, n_layers=1, n_heads=4, n_kv_heads=2, vocab_size=64,
                      ffn_hidden_size=64, max_seq_len=16)  # fmt: skip
    model = shape.build()
    attention = model.layers["0"].attention
    x = torch.randn(2, 16, 32, requires_grad=True)
    out, saved = _saved_shapes(attention, x, model.rope_cos, model.rope_sin)
    four_d = sorted(tuple(t.shape) for t in saved if t.dim() == 4 and t.shape[-1] == 8)
    # k and v as [b, kv_heads, s, head_dim]; q and the output over the 4 query heads
    assert four_d == [(2, 2, 16, 8)] * 2 + [(2, 4, 16, 8)] * 2
    q = attention.wq(x).view(2, 16, 4, 8)
    k = attention.wk(x).view(2, 16, 2, 8)
    v = attention.wv(x).view(2, 16, 2, 8)
    cos, sin = model.rope_cos, model.rope_sin
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    ref = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), is_causal=True
    )
    ref = attention.wo(ref.transpose(1, 2).reshape(2, 16, -1))
    assert torch.equal(out, ref)
    # The gradients agree up to the summation order of the grouped k and v gradients.
    grad = torch.randn_like(out)
    params = [x, *attention.parameters()]
    got = torch.autograd.grad(out, params, grad)
    want = torch.autograd.grad(ref, params, grad)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_rmsnorm_returns_the_autocast_dtype_under_autocast_and_the_input_dtype_outside():
    norm = RMSNorm(16)
    x = torch.randn(2, 4, 16)
    assert norm(x).dtype == torch.float32
    with torch.autocast("cpu", torch.bfloat16):
        y = norm(x)
    assert y.dtype == torch.bfloat16
    assert torch.equal(y, norm(x).to(torch.bfloat16))  # one rounding of the same fp32 values
    with torch.device("meta"):  # no autocast on meta: the input's dtype, no error
        assert norm.to("meta")(torch.empty(2, 4, 16)).dtype == torch.float32
