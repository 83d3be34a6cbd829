"""RMSNorm keeps only its input for backward (besides its weight and 1/rms), SwiGLU its two
projections, attention k and v unrepeated; their outputs and gradients are those of the plain
formulas under autograd. (Activation memory under tp=2 with
sequence parallelism and per checkpointing choice is tests/dist/test_activation_memory_dist.py.)"""

from __future__ import annotations

import copy

import pytest
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
    shape = ModelArgs(
        dim=32,
        n_layers=1,
        n_heads=4,
        n_kv_heads=2,
        vocab_size=64,
        ffn_hidden_size=64,
        max_seq_len=16,
    )
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


def _settings(seq_len: int = 256, **knobs):
    from lightning_dist.planner.settings import TrainSettings

    return TrainSettings.of(
        global_batch_size=4, seq_len=seq_len, precision="32-true", accelerator="cpu", **knobs
    )


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
def test_the_cross_entropy_peaks_in_backward_at_the_planners_bytes_per_logit(autocast):
    """The planner's `loss_bytes_per_logit` (12 without TP): backward holds the loss's gradient,
    the saved log-softmax and its gradient, three fp32 tensors of tokens x vocabulary, more
    than forward's logits, copy and log-softmax (8, or 10 with bf16 logits)."""
    import torch.nn.functional as F

    from lightning_dist.measure.step_memory import measure_step
    from lightning_dist.planner.activations import loss_bytes_per_logit

    torch.manual_seed(0)
    tokens, dim, vocab = 512, 16, 4096
    head = torch.nn.Linear(dim, vocab, bias=False)
    hidden, targets = torch.randn(tokens, dim), torch.randint(0, vocab, (tokens,))
    opt = torch.optim.SGD(head.parameters(), lr=0.1)

    def step():
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = head(hidden)
        loss = F.cross_entropy(logits.float(), targets)  # as lm/module.py computes it
        del logits
        loss.backward()
        opt.step()

    step()
    mem = measure_step(step, head, [opt])
    forward = mem["activations"] / (tokens * vocab)
    peak = (mem["total"] - mem["params"] - mem["grads"]) / (tokens * vocab)
    assert forward == pytest.approx(10 if autocast else 8, rel=0.02)
    assert peak == pytest.approx(loss_bytes_per_logit(tp=1), rel=0.02)


DENSE = dict(dim=64, n_heads=4, n_kv_heads=2, vocab_size=128, ffn_hidden_size=256, max_seq_len=256)


def kept_per_block_token(every_n, shape=None) -> float:
    """MemTracker's forward high-water of a model under `every_n` checkpointing, per block and
    token: the difference between 4 and 2 blocks (the embedding, the logits and the last
    block's recomputation cancel). `shape(n_layers)` gives the model's args (default: a dense
    ModelArgs of `DENSE`); tests/unit/test_planner_experts.py measures MoE blocks with it."""
    from lightning_dist.measure.step_memory import measure_step
    from lightning_dist.models.args import ModelArgs
    from lightning_dist.models.llama import TransformerBlock
    from lightning_dist.parallel.activation_checkpoint import apply_activation_checkpointing

    shape = shape or (lambda layers: ModelArgs(n_layers=layers, **DENSE))
    tokens = torch.randint(0, 128, (4, 256), generator=torch.Generator().manual_seed(0))
    kept = []
    for layers in (2, 4):
        torch.manual_seed(0)
        model = shape(layers).build()
        apply_activation_checkpointing(model, [TransformerBlock], every_n=every_n)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def step(model=model, opt=opt):
            opt.zero_grad()
            model(tokens).float().pow(2).mean().backward()
            opt.step()

        step()
        kept.append(measure_step(step, model, [opt])["activations"])
    return (kept[1] - kept[0]) / 2 / tokens.numel()


@pytest.mark.parametrize("choice", ["op", "op_alternate"])
def test_an_op_checkpointed_block_keeps_the_planners_bytes(choice):
    """Measured per block and token against `checkpointed_layer_bytes` (op keeps every
    matmul's output, op_alternate the 1st, 3rd, 5th and 7th: 3600 and 2192 bytes here)."""
    from lightning_dist.models.args import ModelArgs
    from lightning_dist.planner.activations import checkpointed_layer_bytes

    shape = ModelArgs(n_layers=2, **DENSE)
    planner = checkpointed_layer_bytes(shape, 1, _settings(activation_checkpointing=choice))
    assert kept_per_block_token(choice) == pytest.approx(planner, rel=1e-3)


def _compiled_block_saves(choice) -> list[tuple[tuple[int, ...], int]]:
    """(shape, bytes) of each activation a compiled op-checkpointed block saves for backward:
    the forward graph's outputs beyond the block's output, as AOTAutograd partitions it."""
    from torch._dynamo.backends.common import aot_autograd

    from lightning_dist.models.args import ModelArgs
    from lightning_dist.parallel.activation_checkpoint import apply_activation_checkpointing
    from lightning_dist.parallel.compile import block_slots
    from lightning_dist.parallel.fsdp import find_block_types

    saved = []

    def forward_compiler(graph, example_inputs):
        outputs = next(n for n in graph.graph.nodes if n.op == "output").args[0]
        for node in outputs[1:]:  # the first is the block's output
            value = node.meta.get("val")
            if isinstance(value, torch.Tensor) and value.shape[0] in (2, 128):  # batch, tokens
                saved.append((tuple(value.shape), value.numel() * value.element_size()))
        return graph.forward

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = ModelArgs(
        dim=64,
        n_layers=1,
        n_heads=4,
        n_kv_heads=2,
        vocab_size=128,
        ffn_hidden_size=192,
        max_seq_len=64,
    ).build()
    blocks = find_block_types(model)
    apply_activation_checkpointing(model, blocks, every_n=choice)
    for slot in block_slots(model, blocks):
        slot.compile(
            backend=aot_autograd(
                fw_compiler=forward_compiler, bw_compiler=lambda graph, _: graph.forward
            )
        )
    tokens = torch.randint(0, 128, (2, 64), generator=torch.Generator().manual_seed(0))
    model(tokens).float().pow(2).mean().backward()
    torch._dynamo.reset()
    return saved


@pytest.mark.parametrize("choice", ["op", "op_alternate"])
def test_a_compiled_op_block_saves_the_planners_bytes_and_no_w2_output(choice):
    """Compiled, a block keeps only what backward reads: the policy's kept outputs less w2's
    (nothing reads it: the block ends in a residual add), as `selective_layer_bytes` counts
    under `strategy.compile` (2832 and 1680 bytes per token here, 256 less than eager)."""
    from lightning_dist.models.args import ModelArgs
    from lightning_dist.planner.activations import selective_layer_bytes

    shape = ModelArgs(
        dim=64,
        n_layers=1,
        n_heads=4,
        n_kv_heads=2,
        vocab_size=128,
        ffn_hidden_size=192,
        max_seq_len=64,
    )
    saved = _compiled_block_saves(choice)
    w2_output = (128, 64)  # [tokens, dim]: a matmul output of the block's width
    kept = sum(b for _, b in saved) / 128
    settings = _settings(
        activation_checkpointing=choice, compile=True, compile_backend="aot_eager", seq_len=64
    )
    assert kept == selective_layer_bytes(shape, 1, settings)
    eager = selective_layer_bytes(shape, 1, _settings(activation_checkpointing=choice, seq_len=64))
    assert eager - kept == 64 * 4  # one [tokens, dim] fp32 tensor less than eager keeps
    # wq's and (op only) wo's outputs are [tokens, dim] matmul outputs that stay
    assert sum(s == w2_output for s, _ in saved) == (2 if choice == "op" else 1)
