"""Selective (op-level) activation checkpointing and per-block compilation, in one process.

The distributed parity of both knobs (fsdp2, and tp2 x pp2) is in test_parallel3d_dist.py.
Compilation here uses backend="aot_eager": it traces forward and backward as inductor does but
generates no C++, which would take tens of seconds per block on this 2-core machine.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode

from lightning_dist.checkpoint.canonical import WRAPPER_SEGMENTS
from lightning_dist.models.args import ModelArgs
from lightning_dist.models.materialize import materialize
from lightning_dist.parallel.activation_checkpoint import (
    CheckpointChoice,
    apply_activation_checkpointing,
    parse_activation_checkpointing,
)
from lightning_dist.parallel.compile import apply_compile, block_slots
from lightning_dist.parallel.fsdp import find_block_types

ARGS = ModelArgs(
    dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=128, ffn_hidden_size=64, max_seq_len=32
)


def _model():
    with torch.device("meta"):
        model = ARGS.build()
    return materialize(model, torch.device("cpu"), seed=0)


def _backward_ops(model, tokens) -> tuple[dict[str, int], float, list[torch.Tensor]]:
    """Calls of each aten op during backward (recomputation runs there; ops that op-level
    checkpointing answers from its cache are listed too), the matmul FLOPs actually run in
    backward (the cache hides those from FlopCounterMode), and the gradients."""
    model.zero_grad()
    loss = model(tokens).float().pow(2).mean()
    with profile(activities=[ProfilerActivity.CPU]) as prof, FlopCounterMode(display=False) as f:
        loss.backward()
    counts = {e.key: e.count for e in prof.key_averages()}
    return counts, f.get_total_flops(), [p.grad.clone() for p in model.parameters()]


def _grads(model, tokens) -> list[torch.Tensor]:
    # No profiler here: under it, a compiled full checkpoint's recomputed CPU attention kernel
    # (run_with_rng_state) returns NotImplemented in torch 2.13.
    model.zero_grad()
    model(tokens).float().pow(2).mean().backward()
    return [p.grad.clone() for p in model.parameters()]


def test_settings_parse_to_choices_and_bad_ones_name_the_fix():
    assert parse_activation_checkpointing(0) == CheckpointChoice("none", 0)
    assert parse_activation_checkpointing(2) == CheckpointChoice("full", 2)
    assert parse_activation_checkpointing(2).label == "every_2"
    assert parse_activation_checkpointing("full") == CheckpointChoice("full", 1)
    assert parse_activation_checkpointing("selective") == CheckpointChoice("op", 1)
    assert parse_activation_checkpointing("OP").label == "op"
    assert not parse_activation_checkpointing("none").enabled
    for bad in (-1, "sometimes", True, 1.5):
        with pytest.raises(ValueError, match=r"activation_checkpointing=.*'op' / 'selective'"):
            parse_activation_checkpointing(bad)


def test_op_level_recomputes_pointwise_ops_but_no_matmul():
    """Full checkpointing replays the block's matmuls in backward; op-level replays only the
    cheap ops (RMSNorm's rsqrt here: without checkpointing backward reads the saved 1/rms) and
    saves the matmul outputs. Gradients are identical."""
    tokens = torch.randint(0, ARGS.vocab_size, (2, 16))
    base = _model()
    runs = {}
    for setting in (0, "full", "op"):
        model = copy.deepcopy(base)
        apply_activation_checkpointing(model, find_block_types(model), every_n=setting)
        runs[setting] = _backward_ops(model, tokens)
    flops = {k: f for k, (_, f, _) in runs.items()}
    rsqrt = {k: c.get("aten::rsqrt", 0) for k, (c, _, _) in runs.items()}
    assert flops["full"] > 1.2 * flops[0] and flops["op"] == flops[0], flops
    blocks_norms = 2 * ARGS.n_layers
    assert rsqrt[0] == 0 and rsqrt["op"] >= blocks_norms and rsqrt["full"] >= blocks_norms, rsqrt
    for setting in ("full", "op"):
        for a, b in zip(runs[0][2], runs[setting][2], strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("setting", [0, "op", 2])
def test_compiled_blocks_match_eager_and_keep_names(setting):
    tokens = torch.randint(0, ARGS.vocab_size, (2, 16))
    eager = _model()
    expected = _grads(eager, tokens)
    model = copy.deepcopy(eager)
    blocks = find_block_types(model)
    apply_activation_checkpointing(model, blocks, every_n=setting)
    apply_compile(model, blocks, backend="aot_eager")
    slots = block_slots(model, blocks)
    assert len(slots) == ARGS.n_layers
    wrapped = [hasattr(s, "_checkpoint_wrapped_module") for s in slots]
    choice = parse_activation_checkpointing(setting)
    assert wrapped == [choice.enabled and i % choice.every_n == 0 for i in range(ARGS.n_layers)]
    assert all(s._compiled_call_impl is not None for s in slots)
    grads = _grads(model, tokens)
    for a, b in zip(expected, grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    names = {WRAPPER_SEGMENTS.sub("", n) for n, _ in model.named_parameters()}
    assert names == {n for n, _ in eager.named_parameters()}


def test_strategies_take_the_knobs_from_config_and_reject_bad_ones(compose):
    from lightning_dist.config import hardware_spec
    from lightning_dist.run.plan import build_strategy

    for name in ("single", "ddp", "fsdp", "fsdp2", "3d"):
        extra = [] if name in ("single", "ddp") else ["strategy.activation_checkpointing=op"]
        cfg = compose(
            f"strategy={name}",
            "strategy.compile=true",
            "strategy.compile_backend=aot_eager",
            *extra,
        )
        strategy = build_strategy(cfg.strategy, hardware_spec(cfg))
        assert strategy.compile_backend == "aot_eager", name
    cfg = compose("strategy=fsdp2", "strategy.compile=true", "strategy.compile_backend=tvm")
    # Hydra wraps the strategy's ValueError; train() prints its one line and exits 2.
    with pytest.raises(Exception, match="strategy.compile_backend='tvm' is not one of"):
        build_strategy(cfg.strategy, hardware_spec(cfg))


def test_compile_with_tensor_parallelism_is_accepted():
    """Every backend runs under tp > 1 (the eager outputs around the compiled blocks are settled,
    parallel/compile.py; parity: tests/dist/test_parallel3d_dist.py), so the strategy no longer
    refuses it (nor does the planner, whose search skipped such layouts)."""
    from lightning_dist.strategies.parallel3d import Parallel3DStrategy

    for backend in ("aot_eager", "inductor", "eager"):
        layout = Parallel3DStrategy(tp=2, compile=True, compile_backend=backend).layout_for(2, 1)
        assert layout.tp == 2


def test_under_tp_the_settle_hook_goes_only_on_modules_that_can_feed_a_block():
    """Every module outside the compiled blocks gets `settle_async_output`, except the model
    and its output projection (their outputs go to the loss); inside the blocks, none."""
    from lightning_dist.config import compose_config, model_spec
    from lightning_dist.parallel.compile import apply_compile, settle_async_output
    from lightning_dist.parallel.fsdp import find_block_types

    model = model_spec(compose_config(["debug=fast"])).build()
    apply_compile(model, find_block_types(model), backend="eager", tensor_parallel=True)
    hooked = {
        name
        for name, m in model.named_modules()
        if settle_async_output in m._forward_hooks.values()
    }
    assert "tok_embeddings" in hooked and "norm" in hooked
    assert "" not in hooked and "output" not in hooked
    assert not any(name.startswith("layers.") for name in hooked), hooked
