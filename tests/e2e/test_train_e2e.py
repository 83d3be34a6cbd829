"""End to end: `python train.py` through Hydra in real processes (gloo): the parity command (DDP
on 2 ranks against one process, both through the CSV logger) and Hugging Face models. (The
default run on real text and W&B: test_record_e2e.py and test_bad_inputs_e2e.py; multiruns:
test_sweep_e2e.py; DDP
on 4 ranks:
tests/dist/test_fsdp_dist.py; bad input: tests/unit/test_bad_inputs.py.)"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_dist import parity
from tests.repo import REPO_ROOT

pytestmark = pytest.mark.slow

FAST = [
    "model=llama_debug",
    "data=synthetic",
    "logger=none",
    "trainer.val_check_interval=null",
    "report=false",
]


def train_py(*overrides: str, env: dict | None = None, cwd: Path = REPO_ROOT, timeout=600):
    cmd = [sys.executable, str(REPO_ROOT / "train.py"), *overrides]
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=cwd
    )


def test_parity_command_finds_ddp_on_two_ranks_matches_one_process(tmp_path, capsys):
    """`python -m lightning_dist.parity` (its main): DDP on 2 ranks against a fresh
    single-process run of the same seed and global batch, per step, exit status 0."""
    logged = [o for o in FAST if o != "logger=none"] + ["logger=csv"]  # the CSV logger, too
    overrides = [*logged, "strategy=ddp", "hardware.devices=2", "trainer.max_steps=10"]
    status = parity.main([*overrides, "--tolerance", "1e-5", "--workdir", str(tmp_path)])
    table = capsys.readouterr().out
    print(table)
    assert status == 0 and "candidate world size 2): PASS" in table, table
    assert len(re.findall(r"^ +\d+ +\d+\.\d+ +\d+\.\d+", table, re.MULTILINE)) == 10
    for run in ("reference", "candidate"):
        assert list((tmp_path / run / "csv").rglob("metrics.csv")), f"{run}: no CSV metrics"


def test_hugging_face_llama_trains(tmp_path):
    """It learns on one process and under DDP on 2 ranks (one multirun: one interpreter fewer to
    start), and the console shows none of torch's `... is an Enum subclass` notices, which
    torchao's enums raise on every rank when transformers loads torchao (as strategy.cp=2 once
    made every run do: runtime/quiet.py)."""
    pytest.importorskip("transformers")
    strategies = ["single", "ddp"]
    result = train_py(
        "-m",
        "model=hf_llama",
        "data=synthetic",
        "logger=none",
        f"strategy={','.join(strategies)}",
        "trainer.max_steps=6",
        "trainer.val_check_interval=null",
        "optim.lr=1e-2",
        f"hydra.sweep.dir={tmp_path}",
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "is an Enum subclass" not in output, output[-4000:]
    for job, strategy in enumerate(strategies):
        summary = json.loads((tmp_path / str(job) / "summary.json").read_text())
        assert summary["strategy"] == strategy and summary["steps"] == 6
        assert summary["model"] == "hf_llama"
        assert summary["final_loss"] < summary["losses"][0]


# The one-line errors for bad input are the table in tests/unit/test_bad_inputs.py.
