"""The planner against Megatron-LM's published weak-scaling table (docs/PLANNER.md, "Megatron
Table 1"): every published layout fits, is among the planner's six best (18.4B's is fifth: the
planner prefers tp 2 x pp 4 interleaved, whose larger matmuls it now times faster), and its predicted
percentage of peak (the paper's FLOP count, recomputation included) is within 5 points of the
published one (the issue's target; the time model's two efficiencies were fitted on these rows
and torchtitan's and llm-foundry's, bench/fit_time_model.py)."""

from __future__ import annotations

import pytest

from lightning_dist.planner.megatron import TABLE1, compare_row


@pytest.fixture(scope="module")
def results():
    from lightning_dist.published.runs import hardware

    node = hardware(["hardware=dgx_a100"])
    return [compare_row(row, node) for row in TABLE1]


def test_published_layouts_fit_and_rank_in_the_top_six(results):
    for r in results:
        assert r["fits"], r["row"]
        assert r["rank"] is not None and r["rank"] < 6, (r["row"], r["rank"])


def test_predicted_percent_of_peak_is_within_five_points(results):
    """Every row, the smallest too: GPT 1.7B's math attention, batched matmuls over head dim
    96, pays the A100's shape penalty (the H100 table's scaled by the A100's matmul rate over
    its bandwidth, device_rates.gemm_half_dim), -2.8 points; under the H100 table's own penalty
    it was -6.3 (docs/PLANNER.md, "llm-foundry, and leave-one-source-out")."""
    gaps = {r["row"].billions: r["paper_percent"] - r["row"].percent_of_peak for r in results}
    assert len(gaps) == 10
    for billions, gap in gaps.items():
        assert -5.0 <= gap <= 5.0, (billions, gap)


def test_the_gpt_shape_matches_the_published_parameter_counts():
    from lightning_dist.planner.megatron import gpt_model_args

    for row in TABLE1:
        args = gpt_model_args(row.hidden, row.layers, row.heads)
        # Published counts include position embeddings (2048 x h), which ModelArgs lacks, and round to 2 digits.
        assert args.num_params() / 1e9 == pytest.approx(row.billions, rel=0.04), row
