"""The planner against Megatron-LM's published weak-scaling table (docs/PLANNER.md, "Megatron
Table 1"): every published layout fits, is among the planner's five best, and its predicted
percentage of peak (the paper's FLOP count, recomputation included) is within 10 points of the
published one, except the largest model, where a flat matmul efficiency undershoots."""

from __future__ import annotations

import pytest

from lightning_dist.planner.megatron import TABLE1, compare_row

# Planner minus published percentage of peak for the rows the planner gets wrong by more than
# 10 points; docs/PLANNER.md explains the term that is off. Pinned so that a model change that
# closes (or widens) the gap shows here.
# (530B was pinned here too, at -11.3, until the planner cut stages as the code does: -9.3.)
KNOWN_GAPS = {1008.0: (-13.0, -10.0)}


@pytest.fixture(scope="module")
def results():
    return [compare_row(row) for row in TABLE1]


def test_published_layouts_fit_and_rank_in_the_top_five(results):
    for r in results:
        assert r["fits"], r["row"]
        assert r["rank"] is not None and r["rank"] < 5, (r["row"], r["rank"])


def test_predicted_percent_of_peak_is_within_ten_points(results):
    gaps = {r["row"].billions: r["paper_percent"] - r["row"].percent_of_peak for r in results}
    for billions, gap in gaps.items():
        low, high = KNOWN_GAPS.get(billions, (-10.0, 10.0))
        assert low <= gap <= high, (billions, gap)


def test_the_gpt_shape_matches_the_published_parameter_counts():
    from lightning_dist.planner.megatron import gpt_model_args

    for row in TABLE1:
        args = gpt_model_args(row.hidden, row.layers, row.heads)
        # Published counts include position embeddings (2048 x h), which ModelArgs lacks, and round to 2 digits.
        assert args.num_params() / 1e9 == pytest.approx(row.billions, rel=0.04), row
