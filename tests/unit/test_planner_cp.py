"""The planner's model of context parallelism (cp): a rank's share of each sequence, FSDP's shard
group of dp_shard x cp, the key/value exchange of each mode, the search trying cp for long
sequences, and the bad inputs it refuses. One process, no torch."""

from __future__ import annotations

import pytest

from lightning_dist.layout import Layout
from lightning_dist.planner import estimate, plan_layouts
from lightning_dist.planner.labels import batch_line
from lightning_dist.planner.space import CP_MIN_SEQ_LEN
from lightning_dist.planner.stage_shapes import stage_shapes
from lightning_dist.planner.traffic import traffic_by_dim
from lightning_dist.run.plan_table import strategy_overrides
from tests.unit.test_planner import hardware, model

SEQ = 32768


def _estimate(layout: Layout, gbs: int, mode: str = "allgather", nodes: int = 1, **kw):
    return estimate(
        model("llama3_8b"),
        hardware("dgx_h100", nodes),
        layout,
        global_batch_size=gbs,
        seq_len=SEQ,
        cp_mode=mode,
        **kw,
    )


@pytest.mark.parametrize("mode", ["allgather", "ulysses"])
def test_a_cp_rank_keeps_its_share_of_the_activations_and_shards_states_with_dp(mode):
    """dp_shard=8 with one sequence per rank against dp_shard=4 x cp=2 with one sequence per
    pair: the same shard group of 8 for the model states, half the tokens per rank."""
    whole = _estimate(Layout(dp_shard=8), 8, mode)
    halves = _estimate(Layout(dp_shard=4, cp=2), 4, mode)
    assert halves.memory.params == whole.memory.params
    assert halves.memory.optimizer == whole.memory.optimizer
    ratio = halves.memory.activations / whole.memory.activations
    # ulysses adds wo's input; allgather the other half's keys/values and its boolean mask
    assert 0.5 < ratio < (0.55 if mode == "ulysses" else 0.62), ratio
    assert halves.describe() == f"3d dp_shard=4 cp=2 {mode} FULL_SHARD mbs=1"


def test_the_exchange_is_counted_by_mode_over_the_cp_group():
    """Hand counts for llama3_8b (32 blocks, 8 key/value heads of 128, bf16) at 32768 tokens:
    allgather gathers 2 x 32768 x 8 x 128 x 2 B = 128 MiB of keys and values per block, half
    received at cp=2, and all-reduces their gradients (as much again, twice); ulysses moves
    half of each rank's queries, keys, values and output four times each way."""

    def traffic(mode):
        cand = _estimate(Layout(dp_shard=4, cp=2), 4, mode)
        ((_, shape),) = stage_shapes(model("llama3_8b"), cand.layout)
        return cand, traffic_by_dim(model("llama3_8b"), cand.layout, cand.settings, shape)

    cand, allgather = traffic("allgather")
    assert set(allgather) == {"cp", "dp_shard_cp"}
    assert allgather["cp"] == 32 * (0.5 + 1.0) * 134_217_728
    _, ulysses = traffic("ulysses")
    local = 16384 * 2 * (2 * 4096 + 2 * 8 * 128)  # queries + output, keys + values
    assert ulysses["cp"] == 32 * 2 * 0.5 * local
    assert cand.time.cp_comm_seconds > 0
    assert cand.time.comm_compute_ratio > _estimate(Layout(dp_shard=8), 8).time.comm_compute_ratio


def test_bad_cp_layouts_are_refused_in_one_line():
    llama = model("llama3_8b")
    with pytest.raises(ValueError, match=r"seq_len=1004 does not split into 2 x cp = 8 chunks"):
        estimate(
            llama, hardware("dgx_h100"), Layout(dp_shard=2, cp=4), global_batch_size=2, seq_len=1004
        )
    with pytest.raises(ValueError, match="the 4 query heads per tp=8 rank must divide by it"):
        _estimate(Layout(tp=8, cp=8), 1, "ulysses", nodes=8)
    _estimate(Layout(tp=8, cp=8), 1, "allgather", nodes=8)  # the all-gather splits any heads


def test_the_search_tries_cp_only_for_long_sequences_and_picks_it_at_131072():
    """8192 tokens: no family with cp. llama3_8b on 4 DGX H100 nodes at 131072 tokens (the
    issue's acceptance): the chosen layout splits the sequence, fits, and its command sets it."""
    llama, h100 = model("llama3_8b"), hardware("dgx_h100", 4)
    short = plan_layouts(llama, h100, global_batch_size=32, seq_len=CP_MIN_SEQ_LEN // 2)
    assert all(c.layout.cp == 1 for c in short.candidates)
    assert not [r for r in short.rejected if "cp=" in r["family"]]
    long = plan_layouts(llama, h100, global_batch_size=32, seq_len=131072)
    best = long.best()
    assert best.layout.cp > 1 and best.fits, best.describe()
    words = strategy_overrides(best)
    assert "strategy=3d" in words and f"strategy.cp={best.layout.cp}" in words
    assert f"strategy.cp_mode={best.settings.cp_mode}" in words
    assert (
        f"x 131072 tokens, {131072 // best.layout.cp} on each of cp={best.layout.cp} ranks ("
        in (batch_line(best))
    )
