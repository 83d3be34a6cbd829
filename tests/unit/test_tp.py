"""Tensor-parallel plans, on meta models and without a process group: ours and HF Llama's match
every pattern (and every linear layer of ours), and errors name the problem: a pattern that
matches nothing, an unknown style, a dimension not divisible by tp, sequence parallelism without
norm entries, a model without a plan. A fused projection's style `"colwise_fused(n)"` is parsed
and checked (n, each part divisible by tp, not under FSDP sharding), and plain `"colwise"` on a
layer named like a fused one warns in one line. (The collectives of a block under tp=2 are
tests/dist/test_tp_dist.py; a fused GPT's losses and checkpoints under tp and pp,
tests/dist/test_fused_projection_dist.py.)"""

import pytest
import torch

from lightning_dist.models.args import ModelArgs
from lightning_dist.models.hf import HFModelSpec
from lightning_dist.parallel.tp import check_tp, match_plan, plan_for

DEBUG = ModelArgs(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=512, ffn_hidden_size=128)
HF_CONFIG = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    vocab_size=512,
    max_position_embeddings=64,
)


def meta(build):
    with torch.device("meta"):
        return build()


def test_our_plan_matches_every_pattern_and_module():
    model = meta(DEBUG.build)
    matched = match_plan(model, plan_for(model))
    assert matched["layers.1.attention.wq"] == "colwise"
    assert matched["layers.0.feed_forward.w2"] == "rowwise"
    assert matched["tok_embeddings"] == "embedding" and matched["output"] == "output"
    linears = {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    assert linears <= matched.keys(), "every linear layer is in the plan"


def test_hf_llama_plan_matches_every_pattern():
    model = meta(HFModelSpec(config=HF_CONFIG).build)
    matched = check_tp(model, 2)
    assert matched["hf_model.model.layers.1.self_attn.k_proj"] == "colwise"
    assert matched["hf_model.lm_head"] == "output"


def test_pattern_matching_nothing_is_named():
    model = meta(DEBUG.build)
    with pytest.raises(ValueError, match=r"pattern 'layers.\*.attn.wq' matches no module"):
        check_tp(model, 2, plan={"layers.*.attn.wq": "colwise"})
    with pytest.raises(ValueError, match="style 'diagonal'"):
        check_tp(model, 2, plan={"output": "diagonal"})


def test_split_dimension_not_divisible():
    model = meta(ModelArgs(**{**vars(DEBUG), "ffn_hidden_size": 100}).build)
    with pytest.raises(
        ValueError, match="w1.weight dimension 0 has size 100, not divisible by tp=8"
    ):
        check_tp(model, 8)


def test_sequence_parallel_needs_norm_entries():
    model = meta(HFModelSpec(config=HF_CONFIG).build)
    with pytest.raises(ValueError, match="cannot run sequence parallelism"):
        check_tp(model, 2, sequence_parallel=True)
    check_tp(meta(DEBUG.build), 2, sequence_parallel=True)


def test_model_without_plan():
    with pytest.raises(ValueError, match="Sequential has no tp_plan"):
        plan_for(torch.nn.Sequential(torch.nn.Linear(2, 2)))


# --- fused projections: "colwise_fused(n)" ------------------------------------------------------


def gpt(width: int = 32):
    from tests.fused_gpt import FusedGPT

    return meta(lambda: FusedGPT(width=width))


def test_a_fused_style_is_parsed_and_checked():
    from lightning_dist.models.protocol import TP_STYLES
    from lightning_dist.parallel.tp import fused_parts

    assert "colwise_fused(n)" in TP_STYLES
    assert [fused_parts(s) for s in ("colwise_fused(3)", "colwise_fused( 2 )", "colwise")] == [
        3,
        2,
        None,
    ]
    matched = check_tp(gpt(), 2)
    assert matched["blocks.3.attn.qkv"] == "colwise_fused(3)"
    for style, message in [
        ("colwise_fused(1)", r"'colwise_fused\(1\)' of 'blocks.\*.attn.qkv': .* n >= 2 parts"),
        ("colwise_fused(n)", r"'colwise_fused\(n\)' of 'blocks.\*.attn.qkv' is not one of"),
        ("colwise_fused", r"'colwise_fused' of 'blocks.\*.attn.qkv' is not one of"),
    ]:
        with pytest.raises(ValueError, match=message):
            check_tp(gpt(), 2, plan={"blocks.*.attn.qkv": style})


def test_a_fused_split_must_divide_each_part_by_tp():
    # width 36: 108 output features, 3 parts of 36; 36 is divisible by tp=2, not by tp=8.
    check_tp(gpt(36), 2, plan={"blocks.*.attn.qkv": "colwise_fused(3)"})
    message = (
        r"^blocks.0.attn.qkv is 'colwise_fused\(3\)' but its 108 output features do not split "
        r"into 3 equal parts each divisible by tp=8$"
    )
    with pytest.raises(ValueError, match=message):
        check_tp(gpt(36), 8, plan={"blocks.*.attn.qkv": "colwise_fused(3)"})
    with pytest.raises(ValueError, match=r"output features do not split into 5 equal parts"):
        check_tp(gpt(36), 2, plan={"blocks.*.attn.qkv": "colwise_fused(5)"})
    with pytest.raises(ValueError, match=r"of blocks.0.ln_1 needs an nn.Linear, got LayerNorm"):
        check_tp(gpt(), 2, plan={"blocks.*.ln_1": "colwise_fused(2)"})


def test_a_fused_split_under_fsdp_must_divide_each_tp_slice_by_the_shard_size():
    # width 36: 3 parts of 36 rows, 18 per rank at tp=2; FSDP2 shards those rows evenly only.
    check_tp(gpt(36), 2, shard_size=2)
    check_tp(gpt(36), 2, shard_size=6)
    message = (
        r"^blocks.0.attn.qkv is 'colwise_fused\(3\)': each part holds 18 rows per tp rank, "
        r"which FSDP cannot split evenly over its 4 ranks \(dp_shard x cp\); choose a dp_shard "
        r"that divides 18, or put the other ranks in dp_replicate$"
    )
    with pytest.raises(ValueError, match=message):
        check_tp(gpt(36), 2, shard_size=4)


def test_the_3d_strategy_checks_fsdp_sharding_of_a_fused_layer_before_launch():
    from lightning_dist import Parallel3DStrategy

    run = dict(num_nodes=1, precision="32-true", accelerator="cpu", model=gpt(36))
    Parallel3DStrategy(tp=2).check_run(devices=4, **run)  # dp_shard: the remaining 2 ranks
    Parallel3DStrategy(tp=2, dp_replicate=2, dp_shard=2).check_run(devices=8, **run)
    with pytest.raises(ValueError, match=r"colwise_fused\(3\)': .* evenly over its 4 ranks"):
        Parallel3DStrategy(tp=2).check_run(devices=8, **run)


def test_placements_of_a_fused_tensor_held_by_parts_seen_as_one():
    from torch.distributed.tensor import Partial, Replicate, Shard

    from lightning_dist._compat import strided_shard_class
    from lightning_dist.parallel.fused import _merged

    strided = strided_shard_class()
    # [3, O, in] -> [3 * O, in]: tp's Shard(1) cuts each part, FSDP's strided shard each tp slice.
    assert _merged(Shard(1), 3) == strided(0, split_factor=3)
    assert _merged(strided(1, split_factor=2), 3) == strided(0, split_factor=6)
    assert _merged(Shard(2), 3) == Shard(1) and _merged(Replicate(), 3) == Replicate()
    assert _merged(Partial(), 3) == Partial()
    with pytest.raises(ValueError, match="not split over its parts"):
        _merged(Shard(0), 3)


def test_the_files_see_a_fused_parameter_and_its_moments_as_the_single_device_tensor():
    from lightning_dist.checkpoint.canonical import single_device_state

    weight, moment = torch.randn(3, 4, 2), torch.randn(3, 4, 2)
    state = {
        "state_dict": {"model.qkv.weight": weight, "model.proj.weight": torch.randn(2, 4)},
        "optimizer_0": {
            "state.model.qkv.weight.exp_avg": moment,
            "state.model.qkv.weight.step": torch.tensor(3.0),
            "param_groups.model.qkv.weight.lr": 0.1,
        },
    }
    files = single_device_state(state, {"model.qkv.weight"})
    assert files["state_dict"]["model.qkv.weight"].shape == (12, 2)
    assert files["optimizer_0"]["state.model.qkv.weight.exp_avg"].shape == (12, 2)
    assert (
        files["optimizer_0"]["state.model.qkv.weight.step"]
        is state["optimizer_0"]["state.model.qkv.weight.step"]
    )
    assert files["state_dict"]["model.proj.weight"] is state["state_dict"]["model.proj.weight"]
    files["state_dict"]["model.qkv.weight"].zero_()  # a view: a load lands in the parameter
    assert not weight.any() and state["state_dict"]["model.qkv.weight"] is weight
    assert single_device_state(state, set()) is state


def test_plain_colwise_on_a_fused_name_warns_once(caplog):
    from lightning_dist.parallel import tp
    from tests.fused_gpt import UNFUSED_PLAN

    tp._warned.clear()
    with caplog.at_level("WARNING", logger="lightning_dist.parallel.tp"):
        check_tp(gpt(), 2, plan=UNFUSED_PLAN)
        check_tp(gpt(), 2, plan=UNFUSED_PLAN)  # the strategy checks twice: one line
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert lines[0].startswith("TP plan: blocks.0.attn.qkv (and 3 more like it) is 'colwise'")
    assert "use 'colwise_fused(3)'" in lines[0]
    caplog.clear()
    with caplog.at_level("WARNING", logger="lightning_dist.parallel.tp"):
        check_tp(gpt(), 2)  # fused: nothing to say
        check_tp(meta(DEBUG.build), 2)  # wq, wk, wv, w1...: not fused names
    assert not caplog.records
    # Other fused names and the part counts suggested for them.
    for leaf, parts in [("c_attn", "3"), ("gate_up_proj", "2"), ("Wqkv", "3"), ("fused_in", "n")]:
        model = torch.nn.Module()
        model.add_module(leaf, torch.nn.Linear(4, 12))
        tp._warned.clear()
        caplog.clear()
        with caplog.at_level("WARNING", logger="lightning_dist.parallel.tp"):
            check_tp(model, 2, plan={leaf: "colwise"})
        assert f"TP plan: {leaf} is 'colwise'" in caplog.text, leaf
        assert f"use 'colwise_fused({parts})'" in caplog.text, leaf


def test_runs_of_a_local_index():
    from lightning_dist.checkpoint.pieces import _runs

    # tp=2 rank 1 of a fused (3 parts of 4 rows) weight: rows 2-3, 6-7, 10-11.
    assert _runs([2, 3, 6, 7, 10, 11]) == [(0, 2, 2), (2, 6, 2), (4, 10, 2)]
    assert _runs([4, 5, 6]) == [(0, 4, 3)] and _runs([]) == []
