"""Hugging Face architectures other than Llama that share its module names: Qwen2 (q/k/v biases)
and Mistral, built from a config in the test (random init, no download).

In one process: the Llama-family TP plan matches every module (Qwen2's biases included), and the
parameter count is exact. (Their pipeline stages are checked in tests/unit/test_pipeline.py; the
gloo runs of Qwen2 under tp2 and pp2 are tests/dist/test_hf_archs_dist.py.)
"""

from __future__ import annotations

import pytest
import torch

from lightning_dist.models.hf import HFModelSpec
from lightning_dist.parallel.tp import check_tp

pytest.importorskip("transformers", reason="HF architecture tests need the [hf] extra")

TINY = dict(
    hidden_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    vocab_size=512,
    max_position_embeddings=64,
    tie_word_embeddings=False,
)
ARCHS = {"qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM"}


def spec(model_type: str) -> HFModelSpec:
    return HFModelSpec(config={"model_type": model_type, **TINY})


@pytest.mark.parametrize("model_type", ARCHS)
def test_llama_family_plan_matches_every_module(model_type):
    with torch.device("meta"):
        model = spec(model_type).build()
    assert type(model.hf_model).__name__ == ARCHS[model_type]
    matched = check_tp(model, 2)
    assert len(matched) == 4 * 7 + 2  # 7 projections per layer, the embedding and the output
    if model_type == "qwen2":
        q_proj = model.hf_model.model.layers[0].self_attn.q_proj
        assert q_proj.bias is not None  # split with the weight by the column-parallel style


def test_qwen2_parameter_count_includes_the_biases():
    qwen2 = spec("qwen2")
    model = qwen2.build()
    n_params = sum(p.numel() for p in model.parameters())
    biases = 4 * (64 + 2 * 2 * 16)  # q (4 heads) and k, v (2 kv heads) of head_dim 16, 4 layers
    assert qwen2.num_params() == n_params == spec("mistral").num_params() + biases
