"""Hugging Face architectures other than Llama that share its module names: Qwen2 (q/k/v biases)
and Mistral, built from a config in the test (random init, no download).

(The one-process checks are tests/unit/test_hf_archs.py.) In gloo
processes (slow): a tiny Qwen2 under tp2 and pp2 through `train(cfg)` and Parallel3DStrategy,
on a world of 2 ranks started once, matches its stored single-process reference
(tests/dist/baselines.py) within 1e-4 relative on every step's loss.
"""

from __future__ import annotations

import baselines
import pytest

from lightning_dist.run.parity_runs import max_relative_difference

pytest.importorskip("transformers", reason="HF architecture tests need the [hf] extra")


# --- gloo processes: Qwen2 through train.py and Parallel3DStrategy ---------------------------

QWEN2 = [
    "model=hf_llama", "model.config.model_type=qwen2", "data=synthetic", "logger=none",
    "trainer.max_steps=10", "trainer.val_check_interval=null", *baselines.QUIET,
]  # fmt: skip
LAYOUTS = {
    "tp2": ["strategy=tp", "hardware.devices=2"],
    "pp2": ["strategy=pp", "hardware.devices=2"],
}


@pytest.fixture(scope="module")
def qwen2_reference():
    return baselines.reference([*QWEN2, "strategy=single", "hardware.devices=1"])


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS)
def test_qwen2_matches_one_process(layout, qwen2_reference, train_in, tmp_path_factory):
    candidate = train_in([*QWEN2, *LAYOUTS[layout]], tmp_path_factory.mktemp("q"))
    diff = max_relative_difference(qwen2_reference["losses"], candidate["losses"])
    print(f"PARITY hf qwen2 {layout}: train {diff:.3e} ({candidate['world_size']} ranks)")
    assert len(candidate["losses"]) == 10
    assert diff <= 1e-4, (qwen2_reference["losses"], candidate["losses"])
