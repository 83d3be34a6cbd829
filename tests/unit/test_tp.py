"""Tensor-parallel plans, on meta models and without a process group: ours and HF Llama's match
every pattern (and every linear layer of ours), and errors name the problem: a pattern that
matches nothing, an unknown style, a dimension not divisible by tp, sequence parallelism without
norm entries, a model without a plan. (The collectives of a block under tp=2 are
tests/dist/test_tp_dist.py.)"""

import pytest
import torch

from lightning_dist.models.args import ModelArgs
from lightning_dist.models.hf import HFModelSpec
from lightning_dist.parallel.tp import check_tp, match_plan, plan_for

DEBUG = ModelArgs(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=512, ffn_hidden_size=128)
HF_CONFIG = dict(
    hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    intermediate_size=128, vocab_size=512, max_position_embeddings=64,
)  # fmt: skip


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
