"""GPU paths (bf16 autocast, NCCL): run only where CUDA is present; skipped elsewhere."""

import pytest
import torch

from lightning_dist.run.parity_runs import run_train

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
needs_two = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
FAST = [
    "model=llama_debug",
    "data=synthetic",
    "logger=none",
    "trainer.max_steps=5",
    "trainer.val_check_interval=null",
    "hardware=gpu",
]


@pytest.mark.gpu
@needs_cuda
def test_single_gpu_bf16_run(tmp_path):
    summary = run_train([*FAST, "strategy=single", "hardware.devices=1"], tmp_path)
    assert summary["precision"] == "bf16-mixed" and summary["steps"] == 5
    assert summary["peak_memory_bytes"][0] > 0


@pytest.mark.gpu
@needs_two
@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "fsdp2"])
def test_two_gpu_strategies_match_single_gpu(tmp_path, strategy):
    single = run_train([*FAST, "strategy=single", "hardware.devices=1"], tmp_path / "single")
    other = run_train([*FAST, f"strategy={strategy}", "hardware.devices=2"], tmp_path / strategy)
    # bf16 autocast: agreement to bf16 precision, not fp32's.
    assert other["losses"] == pytest.approx(single["losses"], rel=2e-2)
