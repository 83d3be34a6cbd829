"""Layout: validation, resolution and rank arithmetic, without a process group or a mesh."""

import pytest

from lightning_dist.layout import Layout
from lightning_dist.models.args import ModelArgs, MoEArgs

DEBUG = ModelArgs(dim=64, n_layers=4, n_heads=4, n_kv_heads=2, vocab_size=512, ffn_hidden_size=128)


def test_resolve_fills_the_free_degree_and_checks_the_product():
    assert Layout(dp_shard=-1, tp=2, pp=2).resolve(8).degrees() == {
        "pp": 2,
        "dp_replicate": 1,
        "dp_shard": 2,
        "cp": 1,
        "tp": 2,
    }
    with pytest.raises(ValueError, match="multiply to 4, but the world size is 8"):
        Layout(tp=2, pp=2).resolve(8)
    with pytest.raises(ValueError, match="world size 6 is not divisible"):
        Layout(dp_shard=-1, tp=4).resolve(6)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(tp=0), "must be positive or -1"),
        (dict(tp=-1, pp=-1), "at most one degree may be -1"),
        (dict(schedule="Zigzag"), "is not one of"),
        (dict(pp=4, microbatches=2), "1F1B needs at least pp=4 microbatches, got 2"),
        (dict(pp=2, schedule="GPipe", virtual_stages=2), "runs one stage per rank"),
        (dict(pp=2, schedule="ZBVZeroBubble", virtual_stages=3), "needs virtual_stages=2, got 3"),
        (dict(pp=2, schedule="Interleaved1F1B"), "needs virtual_stages >= 2, got 1"),
        (
            dict(pp=2, schedule="Interleaved1F1B", virtual_stages=2, microbatches=5),
            "multiple of microbatches // pp = 2",
        ),
    ],
)
def test_bad_layouts_name_the_numbers(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Layout(**kwargs)


def test_pipeline_defaults():
    layout = Layout(pp=2, schedule="Interleaved1F1B", virtual_stages=2)
    assert layout.num_microbatches == 4 and layout.num_stages == 4


def test_coordinates_follow_mesh_order_tp_innermost():
    layout = Layout(pp=2, dp_shard=2, tp=2)
    assert layout.coordinate(0) == {"pp": 0, "dp_replicate": 0, "dp_shard": 0, "cp": 0, "tp": 0}
    assert layout.coordinate(5) == {"pp": 1, "dp_replicate": 0, "dp_shard": 0, "cp": 0, "tp": 1}
    assert layout.group_ranks("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert layout.group_ranks("pp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert [layout.dp_rank(r) for r in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]


def test_context_parallel_ranks_sit_between_dp_shard_and_tp_and_share_a_batch():
    layout = Layout(dp_shard=2, cp=2, tp=2)
    assert list(layout.degrees()) == ["pp", "dp_replicate", "dp_shard", "cp", "tp"]
    assert layout.group_ranks("cp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    # The cp peers of one dp coordinate read the same batch; FSDP shards over dp_shard x cp.
    assert [layout.dp_rank(r) for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert layout.dp == 2 and layout.shard_size == 4 and layout.world_size == 8
    assert Layout(dp_shard=-1, cp=2).resolve(8).dp_shard == 4


def test_context_parallel_needs_two_chunks_per_rank():
    Layout(cp=2).check_sequence(128)
    Layout().check_sequence(127)
    with pytest.raises(ValueError) as error:
        Layout(cp=4).check_sequence(100)
    assert str(error.value) == (
        "data.seq_len=100 does not split into 2 x strategy.cp = 8 equal chunks; the nearest "
        "valid values are data.seq_len=96 and data.seq_len=104"
    )


def test_two_dgx_nodes_keep_tp_inside_a_node():
    # 2 nodes x 8 GPUs: ranks 0-7 on node 0. TP groups must not straddle nodes; PP crosses them.
    layout = Layout(pp=2, dp_shard=-1, tp=8).resolve(16)
    assert all(len({r // 8 for r in group}) == 1 for group in layout.group_ranks("tp"))
    assert all(len({r // 8 for r in group}) == 2 for group in layout.group_ranks("pp"))
    layout.check_nodes(devices_per_node=8, num_nodes=2)
    with pytest.raises(ValueError, match="tp=16 does not divide the 8 devices of a node"):
        Layout(tp=16).check_nodes(devices_per_node=8, num_nodes=2)


def test_stage_ids_looped_and_v_shaped():
    assert Layout(pp=2).stage_ids(1) == [1]
    assert Layout(pp=2, schedule="Interleaved1F1B", virtual_stages=2).stage_ids(0) == [0, 2]
    assert Layout(pp=2, schedule="ZBVZeroBubble", virtual_stages=2).stage_ids(0) == [0, 3]


@pytest.mark.parametrize(
    "layout, args, message",
    [
        (Layout(tp=8), DEBUG, "n_heads=4 is not divisible by tp=8"),
        (Layout(tp=4), DEBUG, "n_kv_heads=2 is not divisible by tp=4"),
        (
            Layout(tp=2),
            ModelArgs(**{**vars(DEBUG), "ffn_hidden_size": 129}),
            "ffn_hidden_size=129 is not divisible by tp=2",
        ),
        (
            Layout(tp=2),
            ModelArgs(**{**vars(DEBUG), "vocab_size": 257}),
            "vocab_size=257 is not divisible by tp=2",
        ),
        (
            Layout(pp=4, schedule="Interleaved1F1B", virtual_stages=2),
            DEBUG,
            "n_layers=4 is fewer than pp=4 x virtual_stages=2 = 8",
        ),
        (Layout(pp=2), ModelArgs(**{**vars(DEBUG), "tie_embeddings": True}), "tie_embeddings"),
        (
            Layout(tp=2),
            ModelArgs(**{**vars(DEBUG), "tie_embeddings": True}),
            "not supported with tp=2",
        ),
    ],
)
def test_check_model(layout, args, message):
    with pytest.raises(ValueError, match=message):
        layout.check_model(args)


def test_check_model_accepts_the_debug_flavor():
    Layout(pp=2, tp=2, dp_shard=2).check_model(DEBUG)


def test_check_batch_under_pp():
    layout = Layout(pp=2, dp_shard=2)  # 4 microbatches by default
    layout.check_batch(8)
    with pytest.raises(ValueError, match="global_batch_size=12 is not divisible by dp=2 x micro"):
        layout.check_batch(12)
    with pytest.raises(
        ValueError, match=r"per_rank_batch_size=2 \(.*\) is not divisible by microbatches=4"
    ):
        layout.check_batch(8, micro_batch_size=2)
    Layout(tp=2).check_batch(3)  # no pipeline, nothing to split


# --- expert parallelism: ep borrows ranks from dp_shard x cp --------------------------------------

MOE = MoEArgs(
    dim=64,
    n_layers=4,
    n_heads=4,
    n_kv_heads=2,
    vocab_size=512,
    ffn_hidden_size=128,
    num_experts=4,
    top_k=2,
    expert_hidden_size=64,
)


def test_ep_borrows_ranks_from_dp_shard_and_adds_no_mesh_dimension():
    layout = Layout(dp_shard=-1, ep=2, tp=2).resolve(8)
    assert layout.dp_shard == 4 and layout.world_size == 8 and "ep" not in layout.degrees()
    assert layout.expert_shard_size == 2 and layout.describe()["ep"] == 2
    assert "ep" not in Layout(dp_shard=2).describe()  # ep=1 leaves summary.json as it was
    Layout(dp_shard=2, cp=2, ep=4)  # dp_shard x cp = 4 ranks to borrow
    layout.check_model(MOE)
    Layout(pp=2, dp_shard=2, ep=2, tp=2).check_model(MOE)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(ep=0), r"strategy.ep=0 must be a whole number of at least 1 \(it borrows"),
        (dict(ep=-1), "strategy.ep=-1 must be a whole number of at least 1"),
        (
            dict(dp_shard=4, ep=3),
            r"strategy.ep=3 does not divide dp_shard x cp = 4 x 1 = 4, the ranks it borrows",
        ),
        (dict(dp_shard=1, tp=2, ep=2), r"does not divide dp_shard x cp = 1 x 1 = 1"),
    ],
)
def test_bad_ep_names_the_numbers(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Layout(**kwargs)


def test_ep_is_checked_again_once_dp_shard_is_resolved():
    layout = Layout(dp_shard=-1, ep=4)  # unknown until the world size is
    with pytest.raises(ValueError, match=r"strategy.ep=4 does not divide dp_shard x cp = 2 x 1"):
        layout.resolve(2)


@pytest.mark.parametrize(
    "layout, args, message",
    [
        (
            Layout(dp_shard=2, ep=2),
            DEBUG,
            "strategy.ep=2 splits the experts of a mixture of experts, but the model is dense",
        ),
        (Layout(dp_shard=3, ep=3), MOE, "strategy.ep=3 does not divide model.num_experts=4"),
        (Layout(cp=2), MOE, "strategy.cp=2 with a mixture of experts"),
        (
            Layout(dp_shard=8, ep=2),
            MoEArgs(**{**vars(MOE), "expert_hidden_size": 66}),
            r"model.expert_hidden_size=66 is not divisible by dp_shard x cp / ep = 8 / 2 = 4",
        ),
    ],
)
def test_experts_problem(layout, args, message):
    with pytest.raises(ValueError, match=message):
        layout.check_model(args)
