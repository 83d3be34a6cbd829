"""Resuming in real `train.py` processes: under another gradient accumulation (a layout with
fewer ranks, as an elastic job that shrank resumes), and a world that another world has fenced
out of its checkpoint folder (lightning_dist/checkpoint/fence.py). The elastic job itself is
tests/cluster/test_elastic_agents.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from lightning_dist.checkpoint.fence import FENCED_OUT_EXIT_CODE
from lightning_dist.run.parity_runs import max_relative_difference, run_train
from tests.dist import baselines
from tests.repo import REPO_ROOT

pytestmark = pytest.mark.slow

SINGLE = ["debug=fast", "logger=none", "strategy=single", "hardware.devices=1"]


def test_a_resume_under_another_accumulation_reads_whole_global_batches(tmp_path):
    """Epochs of 5 steps (20 samples). Steps 1-5 with accumulation 1 (4 samples per
    micro-batch), saved at the epoch's end; steps 6-8 resumed with accumulation 4 (1 sample per
    micro-batch): every step's loss equals the uninterrupted run's. (Without ResumePosition, a
    resume mid-epoch takes one micro-batch for its first step; see also the elastic job.)"""
    epoch5 = [*SINGLE, "data.num_samples=20"]
    run_train(
        [
            *epoch5,
            "trainer.max_steps=5",
            "data.micro_batch_size=4",
            "trainer.checkpoint.every_n_train_steps=5",
        ],
        tmp_path,
    )
    resumed = run_train(
        [*epoch5, "trainer.max_steps=8", "data.micro_batch_size=1", "trainer.resume=auto"], tmp_path
    )
    reference = baselines.reference([*epoch5, "trainer.max_steps=8"])["losses"]
    assert (
        len(resumed["losses"]) == 8 and resumed["first_step"] == 5
    )  # steps 1-5 from the checkpoint
    assert max_relative_difference(reference, resumed["losses"]) < 1e-6


def test_a_world_fenced_out_of_its_folder_stops_at_its_next_save(tmp_path):
    """After step 3 a newer world claims the folder (tests/faults.py ClaimFolderAtStep): this
    one saves nothing after step 3 and stops with one line naming the world that took over,
    exit status 5 (non-zero: its job did not finish), and leaves the mark that stops a torchrun
    restart of it from claiming the folder back."""
    cmd = [sys.executable, str(REPO_ROOT / "tests" / "toy_train.py"), *SINGLE,
           "trainer.max_steps=6", "trainer.checkpoint.every_n_train_steps=1",
           "+callbacks.claim._target_=tests.faults.ClaimFolderAtStep", "+callbacks.claim.step=3",
           f"hydra.run.dir={tmp_path}"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == FENCED_OUT_EXIT_CODE != 0, result.stderr[-3000:]
    assert len(errors) == 1, result.stderr[-3000:]
    assert (tmp_path / "checkpoints" / ".writers" / "1.fenced").is_file()
    assert "is now written by world 2 (8 ranks on 2 node(s)" in errors[0]
    assert "Traceback" not in result.stderr
    saved = sorted(p.name for p in (tmp_path / "checkpoints").glob("step*.ckpt"))
    assert saved == ["step1.ckpt", "step2.ckpt"], saved  # step 3's save found the new claim
    manifests = [
        json.loads((tmp_path / "checkpoints" / n / "manifest.json").read_text()) for n in saved
    ]
    assert [m["writer"] for m in manifests] == [1, 1]
    assert not (tmp_path / "summary.json").exists()
