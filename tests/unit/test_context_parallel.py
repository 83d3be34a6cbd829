"""Context parallelism in one process: the head-and-tail chunks and the head checks."""

import pytest
import torch

from lightning_dist.parallel.context_parallel import (
    check_ulysses_heads,
    chunk_positions,
    shard_sequence,
)


def test_each_rank_holds_a_head_and_a_tail_chunk_and_together_every_position_once():
    assert chunk_positions(8, 2, 0).tolist() == [0, 1, 6, 7]
    assert chunk_positions(8, 2, 1).tolist() == [2, 3, 4, 5]
    every = torch.cat([chunk_positions(24, 3, r) for r in range(3)])
    assert sorted(every.tolist()) == list(range(24))
    # Causal work (keys at or before each query) is the same on every rank.
    work = [int((chunk_positions(24, 3, r) + 1).sum()) for r in range(3)]
    assert len(set(work)) == 1, work
    x = torch.arange(16).reshape(2, 8)
    assert shard_sequence(x, 2, 1).tolist() == [[2, 3, 4, 5], [10, 11, 12, 13]]


def test_a_sequence_or_heads_that_do_not_split_are_named():
    with pytest.raises(
        ValueError, match=r"data.seq_len=10 does not split into 2 x strategy.cp = 4"
    ):
        chunk_positions(10, 2, 0)
    with pytest.raises(ValueError, match=r"the 6 query heads must divide by it"):
        check_ulysses_heads(6, 2, 4)
    with pytest.raises(ValueError, match=r"the 3 key/value heads"):
        check_ulysses_heads(8, 3, 2)
    check_ulysses_heads(8, 1, 4)  # one key/value head, repeated to 4
    check_ulysses_heads(8, 8, 4)
