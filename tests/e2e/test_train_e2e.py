"""End to end: `python train.py` through Hydra in real processes (gloo): the parity command (DDP
on 2 ranks against one process), real text with summary.json and the CSV logger, and Hugging Face
models. (W&B and multiruns: test_record_e2e.py and test_bad_inputs_e2e.py; DDP on 4 ranks:
tests/dist/test_fsdp_dist.py; bad input: tests/unit/test_bad_inputs.py.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_dist import parity
from lightning_dist.parity import (
    REPO_ROOT,
    run_train,
)

pytestmark = pytest.mark.slow

FAST = ["model=llama_debug", "data=synthetic", "logger=none", "trainer.val_check_interval=null"]
SUMMARY_KEYS = {
    "losses", "final_loss", "steps", "tokens_per_sec", "world_size", "layout", "strategy",
    "hardware", "peak_memory_bytes", "mfu", "wall_seconds",
}  # fmt: skip


def train_py(*overrides: str, env: dict | None = None, cwd: Path = REPO_ROOT, timeout=600):
    cmd = [sys.executable, str(REPO_ROOT / "train.py"), *overrides]
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env,
                          cwd=cwd)  # fmt: skip


def test_parity_command_finds_ddp_on_two_ranks_matches_one_process(tmp_path, capsys):
    """`python -m lightning_dist.parity` (its main): DDP on 2 ranks against a fresh
    single-process run of the same seed and global batch, per step, exit status 0."""
    overrides = [*FAST, "strategy=ddp", "hardware.devices=2", "trainer.max_steps=10"]
    status = parity.main([*overrides, "--tolerance", "1e-5", "--workdir", str(tmp_path)])
    table = capsys.readouterr().out
    print(table)
    assert status == 0 and "candidate world size 2): PASS" in table, table
    assert len(re.findall(r"^ +\d+ +\d+\.\d+ +\d+\.\d+", table, re.MULTILINE)) == 10


def test_text_run_writes_summary_and_learns(tmp_path):
    """Real text (stdlib sources), 2 DDP ranks, CSV logger: summary contract and learning."""
    summary = run_train(
        ["logger=csv", "trainer.max_steps=25", "trainer.val_check_interval=25",
         "data.seq_len=128", "data.global_batch_size=8"],
        tmp_path,
    )  # fmt: skip
    assert SUMMARY_KEYS <= summary.keys()
    assert summary["steps"] == 25 and len(summary["losses"]) == 25
    assert summary["world_size"] == 2 and summary["layout"]["dp_replicate"] == 2
    assert len(summary["peak_memory_bytes"]) == 2 and min(summary["peak_memory_bytes"]) > 0
    assert summary["mfu"] is None  # no peak FLOP/s is known for a CPU
    assert summary["final_loss"] < 0.75 * summary["losses"][0]
    assert summary["val_losses"] and summary["val_losses"][-1] < summary["losses"][0]
    assert list((tmp_path / "csv").rglob("metrics.csv")), "the CSV logger wrote no metrics"
    # One run directory: no per-rank Hydra output folders, no stray config copies.
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize("strategy", ["single", "ddp"])
def test_hugging_face_llama_trains(tmp_path, strategy):
    pytest.importorskip("transformers")
    summary = run_train(
        ["model=hf_llama", "data=synthetic", "logger=none", f"strategy={strategy}",
         "trainer.max_steps=6", "trainer.val_check_interval=null", "optim.lr=1e-2"],
        tmp_path,
    )  # fmt: skip
    assert summary["steps"] == 6
    assert summary["model"] == "hf_llama"
    assert summary["final_loss"] < summary["losses"][0]


# The one-line errors for bad input are the table in tests/unit/test_bad_inputs.py.
