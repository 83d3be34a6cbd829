"""The planner's mixture of experts (`lightning_dist/planner/experts.py`): an MoE block's
activations as MemTracker measures them, its parameters on a rank, and its active compute."""

from __future__ import annotations

import pytest
import torch

from lightning_dist.models.args import MoEArgs

SHAPE = dict(
    dim=64,
    n_heads=4,
    n_kv_heads=2,
    vocab_size=128,
    ffn_hidden_size=128,
    max_seq_len=256,
    num_experts=4,
    top_k=2,
    expert_hidden_size=64,
    n_shared_experts=1,
    first_k_dense=0,
)


def _settings(choice):
    from lightning_dist.planner.settings import TrainSettings

    return TrainSettings.of(
        global_batch_size=4,
        seq_len=256,
        precision="32-true",
        accelerator="cpu",
        activation_checkpointing=choice,
    )


@pytest.mark.parametrize(("choice", "tolerance"), [(0, 0.01), ("full", 1e-3), ("op", 1e-3)])
def test_an_moe_block_keeps_the_planners_bytes(choice, tolerance):
    """Without checkpointing the count is within 1% (5220 against 5244 bytes per token here:
    24 bytes the count does not name); in full and op it is exact (256 and 2080)."""
    from lightning_dist.planner.activations import checkpointed_layer_bytes
    from tests.unit.test_activation_memory import kept_per_block_token

    planner = checkpointed_layer_bytes(MoEArgs(n_layers=2, **SHAPE), 1, _settings(choice), True)
    measured = kept_per_block_token(choice, lambda layers: MoEArgs(n_layers=layers, **SHAPE))
    assert measured == pytest.approx(planner, rel=tolerance)


def test_a_rank_holds_its_share_of_the_experts_and_the_planner_counts_every_parameter():
    from lightning_dist.config import compose_config, model_spec
    from lightning_dist.layout import Layout
    from lightning_dist.planner.stage_shapes import stage_shapes

    for name in ("mixtral_8x7b", "deepseek_v3"):
        model = model_spec(compose_config([f"model={name}", "paths.output_dir=."]))
        [(_, whole)] = stage_shapes(model, Layout())
        assert whole.params == model.num_params()
        assert whole.moe_layers == len(model.moe_layers)
        routed = model.num_experts * model.expert_params() * len(model.moe_layers)
        assert whole.experts == routed
        stages = [shape for _, shape in stage_shapes(model, Layout(pp=4))]
        assert sum(s.params for s in stages) == pytest.approx(model.num_params())
        assert sum(s.moe_layers for s in stages) == len(model.moe_layers)
    # DeepSeek-V3's first 3 blocks are dense: the first of 4 stages holds them
    assert [s.moe_layers for s in stages] == [s.layers - 3 * (i == 0) for i, s in enumerate(stages)]


def test_mfu_counts_the_active_parameters():
    """6 x active N per token (the routed experts a token skips cost it nothing)."""
    from lightning_dist.config import compose_config, model_spec

    model = model_spec(compose_config(["model=mixtral_8x7b", "paths.output_dir=."]))
    flops = model.train_flops_per_token(4096)
    dense = 6 * (model.num_params() - model.vocab_size * model.dim)
    assert flops < 0.35 * dense  # 12.9B of 46.7B act on a token
    assert flops > 6 * (model.active_params() - 2 * model.vocab_size * model.dim)


def _estimate(name, nodes, layout, **knobs):
    from lightning_dist.planner.estimate import estimate
    from lightning_dist.published.runs import hardware

    model = model_spec_of(name)
    hw = hardware(["hardware=dgx_h100", f"hardware.num_nodes={nodes}"])
    return model, estimate(
        model, hw, layout, global_batch_size=8 * nodes, seq_len=4096, micro_batch_size=1, **knobs
    )


def model_spec_of(name):
    from lightning_dist.config import compose_config, model_spec

    return model_spec(compose_config([f"model={name}", "paths.output_dir=."]))


def test_ep_halves_the_gathered_experts_and_keeps_the_shards_and_moves_all_to_alls():
    """At the same dp_shard, ep=2 gathers half of each layer's experts (the measured 196,608
    against 98,304 bytes of tests/dist/test_expert_parallel_dist.py), the shards at rest are
    the same (FSDP shards every expert over all of dp_shard either way), and ep adds the
    all-to-alls: four per MoE block and microbatch of (ep - 1) / ep of k x tokens x dim."""
    from lightning_dist.layout import Layout
    from lightning_dist.planner.stage_shapes import stage_shapes
    from lightning_dist.planner.traffic import traffic_by_dim

    model = model_spec_of("mixtral_8x7b")
    [(_, one)] = stage_shapes(model, Layout(dp_shard=16))
    [(_, two)] = stage_shapes(model, Layout(dp_shard=16, ep=2))
    assert two.experts == one.experts / 2
    assert two.block - (one.block - one.experts / 32) == pytest.approx(one.experts / 64)
    _, c1 = _estimate("mixtral_8x7b", 2, Layout(dp_shard=16))
    _, c2 = _estimate("mixtral_8x7b", 2, Layout(dp_shard=16, ep=2))
    assert c2.memory.params == pytest.approx(c1.memory.params)  # the shards
    assert c2.memory.buffers < c1.memory.buffers  # the gathered experts
    traffic = traffic_by_dim(model, c2.layout, c2.settings, two)
    routed = 4 * 32 * 4096 * model.top_k * model.dim * 2 / 2  # bf16, (ep - 1) / ep = 1/2
    assert traffic["ep"] == pytest.approx(routed)
    assert c2.time.ep_comm_seconds > 0 and c1.time.ep_comm_seconds == 0


def test_the_search_takes_ep_for_a_mixture_of_experts_and_reports_active_mfu():
    from lightning_dist.planner import plan_layouts
    from lightning_dist.published.runs import hardware

    model = model_spec_of("mixtral_8x7b")
    hw = hardware(["hardware=dgx_h100", "hardware.num_nodes=2"])
    result = plan_layouts(model, hw, global_batch_size=64, seq_len=4096)
    best = result.best()
    assert best.layout.ep > 1 and best.fits, best.describe()
    assert f"ep={best.layout.ep}" in best.describe()
    active = model.train_flops_per_token(4096) * best.time.tokens_per_sec
    assert best.time.mfu == pytest.approx(active / (16 * hw.peak_flops("bf16-mixed")))


@pytest.mark.parametrize(
    "overrides",
    [
        [
            "model=mixtral_8x7b",
            "hardware=dgx_h100",
            "hardware.num_nodes=2",
            "data.global_batch_size=64",
            "data.seq_len=4096",
        ],  # ep
        [
            "model=llama3_70b",
            "hardware=mixed_h100_a100",
            "data.global_batch_size=256",
            "data.seq_len=4096",
        ],  # split points by speed
        [
            "model=llama3_8b",
            "hardware=dgx_h100",
            "hardware.num_nodes=4",
            "data.seq_len=131072",
            "data.global_batch_size=32",
        ],  # cp
    ],
)
def test_strategy_auto_runs_the_layout_the_planner_chose(overrides):
    """strategy=auto's keyword arguments build the planner's layout, ep, cp and the speed
    split included (they were dropped, so auto ran another layout than it printed)."""
    from lightning_dist.config import compose_config, hardware_spec
    from lightning_dist.contract import contract_of
    from lightning_dist.run.preflight import planned_strategy
    from lightning_dist.run.spec import Batch
    from lightning_dist.strategies.parallel3d import Parallel3DStrategy

    cfg = compose_config([*overrides, "strategy=auto", "paths.output_dir=."])
    hw = hardware_spec(cfg)
    kwargs, _, description = planned_strategy(
        Batch.of_config(cfg.data), model_spec_of(overrides[0].split("=")[1]), hw, None
    )
    strategy = Parallel3DStrategy(**kwargs)
    layout = contract_of(strategy).layout_for(hw.resolved_devices(), hw.num_nodes)
    for name, value in layout.degrees().items():
        assert (name == "dp_shard" or value == 1) or f"{name}={value}" in description
    assert f"ep={layout.ep}" in description if layout.ep > 1 else "ep=" not in description
    if "mixed" in overrides[1]:
        assert strategy.options.pipeline.split_points


def test_the_planners_pipeline_cut_of_a_mixture_of_experts_is_the_codes():
    """DeepSeek-V3's first 3 blocks are dense and smaller: the code balances the stages by each
    block's parameters (`parallel/pipeline.split_blocks`), and so does the planner."""
    from lightning_dist.layout import Layout
    from lightning_dist.parallel.pipeline import split_blocks
    from lightning_dist.planner.stage_shapes import stage_shapes

    model = model_spec_of("deepseek_v3")
    with torch.device("meta"):
        built = model.build()
    for pp in (4, 8):
        code = [len(names) for names in split_blocks(built, pp)]
        assert [s.layers for _, s in stage_shapes(model, Layout(pp=pp))] == code, pp
    assert code[0] > code[-1]  # (10, 7, ..., 7) at pp = 8


def test_a_hugging_face_mixture_of_experts_is_planned_without_ep():
    """Its MoE layers have none of our seams (strategy.ep refuses it): the search keeps ep=1."""
    from lightning_dist.config import compose_config, hardware_spec, model_spec
    from lightning_dist.planner import plan_layouts

    cfg = compose_config(
        [
            "model=hf_llama",
            "model.config.model_type=mixtral",
            "+model.config.num_local_experts=8",
            "+model.config.num_experts_per_tok=2",
            "hardware=dgx_h100",
            "hardware.num_nodes=2",
            "paths.output_dir=.",
        ]
    )
    result = plan_layouts(model_spec(cfg), hardware_spec(cfg), global_batch_size=64, seq_len=256)
    assert result.candidates and all(c.layout.ep == 1 for c in result.candidates)
