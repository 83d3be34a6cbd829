"""The layouts the planner can express beyond powers of two (issue 50, point 4): uneven pipeline
stages, micro-batches of 3 x 2^k, interleaving with microbatches torch's flex rounds accept,
embedding-only and loss-only chunks, and ZeRO-1; chunks without layers are planner only (never
chosen, no train.py command)."""

from __future__ import annotations

import pytest

from lightning_dist.layout import Layout
from lightning_dist.models.args import ModelArgs
from lightning_dist.planner import estimate, plan_layouts
from lightning_dist.planner.space import micro_batch_values, pp_values
from lightning_dist.planner.stage_shapes import stage_shapes
from lightning_dist.planner.traffic import allreduce_volume, dp_volumes
from tests.unit.test_planner import hardware, model

BLOOM_176B = ModelArgs(
    dim=14336,
    n_layers=70,
    n_heads=112,
    vocab_size=250880,
    ffn_hidden_size=38208,
    max_seq_len=2048,
)
"""BLOOM-176B's shape (BigScience, 2022: 70 layers, hidden 14336, 112 heads, vocabulary
250880, sequence 2048) with its GELU MLP of 4h as a SwiGLU of 8h/3 (the same parameters:
`planner/megatron.gpt_model_args`)."""


def test_a_176b_gpt_on_384_a100_gets_its_published_pp12_layout_with_uneven_stages():
    # BLOOM trained on tp4 x pp12 x dp8: 12 divides neither 70 nor is a power of two.
    assert 12 in pp_values(384 // 4, 70)
    plan = plan_layouts(BLOOM_176B, hardware("dgx_a100", 48), global_batch_size=2048, seq_len=2048)
    assert plan.chosen is not None
    published = [
        c for c in plan.candidates if (c.layout.tp, c.layout.pp, c.layout.dp) == (4, 12, 8)
    ]
    assert published and all(c.fits for c in published)
    sizes = [sum(s.chunks) for _, s in stage_shapes(BLOOM_176B, published[0].layout)]
    assert sum(sizes) == 70 and max(sizes) - min(sizes) <= 2 and len(set(sizes)) > 1
    # ZeRO-1 (what BLOOM ran, DeepSpeed's BF16 optimizer) is among them, runnable beside its
    # pipeline (strategy.shard_optimizer).
    zero1 = [c for c in published if c.settings.sharding == "SHARD_OPTIMIZER"]
    assert zero1 and zero1[0].planner_only is None
    assert plan.candidates[plan.chosen].planner_only is None


def test_micro_batch_6_is_searched():
    assert micro_batch_values(96) == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 96]
    assert micro_batch_values(6) == [1, 2, 3, 6]
    # On one CPU rank the whole batch of 6 runs as one micro-batch of 6.
    plan = plan_layouts(model("llama_debug"), hardware("cpu"), global_batch_size=6, seq_len=64)
    assert 6 in {c.settings.micro_batch_size for c in plan.candidates}


def test_interleaving_takes_microbatches_torch_splits_into_equal_rounds():
    llama, node = model("llama3_8b"), hardware("dgx_h100")
    # m = 10 on pp = 4: two rounds of 5 (torch's ScheduleInterleaved1F1B flex rounds).
    layout = Layout(pp=4, dp_replicate=2, schedule="Interleaved1F1B", virtual_stages=2)
    c = estimate(
        llama,
        node,
        layout,
        global_batch_size=20,
        seq_len=2048,
        micro_batch_size=1,
        sharding="NO_SHARD",
    )
    assert c.layout.num_microbatches == 10 and c.time.bubble_fraction > 0
    with pytest.raises(ValueError, match=r"microbatches=9 to be a multiple of .* = 2"):
        estimate(
            llama,
            node,
            layout,
            global_batch_size=18,
            seq_len=2048,
            micro_batch_size=1,
            sharding="NO_SHARD",
        )


def test_more_chunks_than_layers_hold_an_embedding_only_and_a_loss_only_chunk():
    small = ModelArgs(dim=256, n_layers=6, n_heads=4, vocab_size=32000, ffn_hidden_size=512)
    node = hardware("dgx_h100")
    layout = Layout(pp=2, dp_replicate=4, schedule="Interleaved1F1B", virtual_stages=4)
    c = estimate(
        small,
        node,
        layout,
        global_batch_size=16,
        seq_len=512,
        micro_batch_size=1,
        sharding="NO_SHARD",
    )
    chunks = [s.chunks for _, s in stage_shapes(small, c.layout)]
    assert sum(map(sum, chunks)) == 6 and chunks[0][0] == 0 and chunks[-1][-1] == 0
    assert "no embedding-only" in c.planner_only
    with pytest.raises(ValueError, match=r"exceeds n_layers=6 \+ 2"):
        estimate(
            small,
            node,
            Layout(pp=2, dp_replicate=4, schedule="Interleaved1F1B", virtual_stages=5),
            global_batch_size=16,
            seq_len=512,
            micro_batch_size=1,
        )


def test_zero1_shards_the_optimizer_over_dp_and_moves_the_bytes_of_ddps_all_reduce():
    llama, node = model("llama3_8b"), hardware("dgx_h100", 2)
    kw = dict(
        global_batch_size=64, seq_len=2048, micro_batch_size=1, activation_checkpointing="full"
    )
    ddp = estimate(llama, node, Layout(dp_replicate=16), sharding="NO_SHARD", **kw)
    zero1 = estimate(llama, node, Layout(dp_replicate=16), sharding="SHARD_OPTIMIZER", **kw)
    # 1/16 of the states, and the flat slice of the fp32 parameters the optimizer steps.
    assert zero1.memory.optimizer == (ddp.memory.optimizer + ddp.memory.params) / 16
    assert (zero1.memory.params, zero1.memory.grads) == (ddp.memory.params, ddp.memory.grads)
    assert zero1.memory.activations == ddp.memory.activations
    assert ddp.planner_only is None and zero1.planner_only is None  # strategy.shard_optimizer
    # The plan's band: the prediction over 1 + the 90th and 10th leave-one-source-out errors.
    from lightning_dist.published.holdout import prediction_band
    from lightning_dist.run.plan_table import prediction_line

    low, high = prediction_band(ddp.time.tokens_per_sec)
    assert f"tokens/s {ddp.time.tokens_per_sec:,.0f}, likely {float(f'{low:.3g}'):,.0f}-" in (
        prediction_line(ddp)
    )
    # As parallel/sharded_optimizer.py runs it: a reduce-scatter of the fp32 gradients, then an
    # all-gather of the fp32 parameters, after the step: together DDP's all-reduce's bytes.
    _, shape = stage_shapes(llama, zero1.layout)[0]
    volumes = dp_volumes(zero1.layout, zero1.settings, shape)
    ddp_all_reduce = dp_volumes(ddp.layout, ddp.settings, shape).all_reduce
    assert ddp_all_reduce == pytest.approx(allreduce_volume(4 * shape.params, 16))
    assert volumes.reduce_scatter == pytest.approx(ddp_all_reduce / 2)
    assert volumes.gather == pytest.approx(ddp_all_reduce / 2)
    assert volumes.all_reduce == 0
    # Both run outside backward, with nothing to hide under: ZeRO-1 sends DDP's bytes but is
    # slower than DDP, whose all-reduce overlaps backward, and the search offers it only where
    # DDP does not fit (search.ZERO1_GAIN).
    assert zero1.time.dp_comm_seconds == pytest.approx(ddp.time.dp_comm_seconds, rel=0.1)
    assert zero1.time.step_seconds > ddp.time.step_seconds
    # The planner counts the code's pieces (it imports no torch code to read them).
    from lightning_dist.parallel.gradient_reduction import REDUCE_ELEMENTS
    from lightning_dist.parallel.sharded_optimizer import GATHER_ELEMENTS
    from lightning_dist.planner.dp_time import ZERO1_GATHER_ELEMENTS

    assert ZERO1_GATHER_ELEMENTS == GATHER_ELEMENTS == REDUCE_ELEMENTS
    with pytest.raises(ValueError, match="dp_shard x cp = 2 must be 1"):
        estimate(llama, node, Layout(dp_replicate=8, dp_shard=2), sharding="SHARD_OPTIMIZER", **kw)


def test_the_cli_gives_zero1_rows_a_command_and_planner_only_rows_none(capsys):
    from lightning_dist import plan

    overrides = [
        "model=llama3_8b",
        "hardware=dgx_a100",
        "hardware.num_nodes=2",
        "data.global_batch_size=64",
        "data.seq_len=2048",
    ]
    # 8B on 16 A100s: DDP does not fit, ZeRO-1 does, and runs (strategy.shard_optimizer).
    plan.main([*overrides, "--command", "all", "--top", "40"])
    out = capsys.readouterr().out
    assert "SHARD_OPTIMIZER" in out and "planner only" not in out
    commands = [x for x in out.splitlines() if x.startswith("python")]
    assert "SHARD_OPTIMIZER" not in "".join(commands)
    assert any("strategy.shard_optimizer=true" in x for x in commands)
    # Six layers: interleaved chunks beyond the layers are planner only, without a command.
    overrides.append("model.n_layers=6")
    plan.main([*overrides, "--command", "all", "--top", "40"])
    out = capsys.readouterr().out
    assert "planner only, no command" in out
    row = next(int(x.split(":")[0][2:]) for x in out.splitlines() if "planner only" in x)
    with pytest.raises(SystemExit) as exit_info:
        plan.main([*overrides, "--command", str(row), "--top", "40"])
    assert exit_info.value.code == 2
    assert f"row {row} is planner only" in capsys.readouterr().err


def test_the_compiled_loss_holds_4_bytes_a_bf16_logit_and_leaves_no_gap():
    """`loss="compiled"` (torchtitan's compiled cross-entropy, one held-out row): 2 w bytes a
    logit at its peak against the eager 12, and no logits' gap in the allocator's slack
    (bench/compiled_loss_memory.py measures both); refused under TP or PP and for a name that
    is not a loss."""
    from lightning_dist.planner.settings import TrainSettings

    llama, node = model("llama3_8b"), hardware("dgx_h100", 4)
    kw = dict(global_batch_size=64, seq_len=8192, micro_batch_size=2, activation_checkpointing="op")
    eager = estimate(llama, node, Layout(dp_shard=32), **kw)
    compiled = estimate(llama, node, Layout(dp_shard=32), loss="compiled", **kw)
    logits = 2 * 8192 * llama.vocab_size  # this rank's micro-batch of 2 sequences
    assert eager.memory.activations - compiled.memory.activations == pytest.approx(8 * logits)
    assert eager.memory.allocator - compiled.memory.allocator == pytest.approx(2 * logits)
    with pytest.raises(ValueError, match="loss='compiled' is modelled"):
        estimate(llama, node, Layout(dp_shard=16, tp=2), loss="compiled", **kw)
    with pytest.raises(ValueError, match="loss='fused' is not one of eager, compiled"):
        TrainSettings(global_batch_size=8, seq_len=8, micro_batch_size=1, loss="fused")
