"""The chunked loss (lightning_dist.lm.chunked_loss) on two gloo ranks (tests/dist/loss_ranks.py):
the same 10-step losses as the plain cross-entropy on one process, under tp=2 (sequence and loss
parallelism) and on the last stage of pp=2. The tp=2 run also checks the vocabulary-parallel
embedding: each rank holds half of the single-process embedding gradient, chunked or not. (The
one-process loss, gradients and step peak are tests/unit/test_chunked_loss.py.)"""

from __future__ import annotations

import pytest

from tests.dist.rank_scripts import run_in_world


@pytest.fixture(scope="module")
def ranks(tmp_path_factory, worlds) -> dict:
    return run_in_world(worlds, "loss_ranks.py", tmp_path_factory.mktemp("ranks") / "result.json")


def _relative(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) / abs(x) for x, y in zip(a, b, strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["single", "tp2", "pp2"])
def test_ten_steps_match_the_plain_loss(ranks, layout):
    plain, chunked = ranks[f"{layout} plain"], ranks[f"{layout} chunked"]
    print(
        f"{layout}: chunked vs plain loss, largest relative difference over 10 steps "
        f"{_relative(plain, chunked):.2e}"
    )
    assert len(plain) == 10
    assert _relative(plain, chunked) <= 1e-6


@pytest.mark.slow
def test_tp2_embedding_gradient_is_half_of_single(ranks):
    single, tp2 = ranks["single plain emb grad"], ranks["tp2 plain emb grad"]
    print(f"embedding gradient bytes: single {single}, per tp2 rank {tp2}")
    assert tp2 * 2 == single
    assert ranks["tp2 chunked emb grad"] == tp2
