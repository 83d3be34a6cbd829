"""The planner speaks train.py: its assumptions, a legend, a table that fits 120 columns, a host
memory column for offload, and for every row the `python train.py ...` command that runs it."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest

from lightning_dist.parity import REPO_ROOT

PLAN_70B = ["model=llama3_70b", "hardware=dgx_h100", "hardware.num_nodes=4"]


def _run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}
    return subprocess.run([sys.executable, *args], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env)  # fmt: skip


def _command_args(command: str) -> list[str]:
    words = shlex.split(command)
    assert words[:2] == ["python", "train.py"], command
    return words[2:]


@pytest.mark.slow
def test_the_70b_command_is_what_train_py_plans():
    """`--command` for 70B on four DGX H100 nodes, run by train.py with plan.only=true: the
    pre-flight predicts the same layout, and it fits."""
    plan = _run("-m", "lightning_dist.plan", *PLAN_70B, "--command")
    assert plan.returncode == 0, plan.stderr
    chosen = _run("-m", "lightning_dist.plan", *PLAN_70B, "--top", "1").stdout
    label = re.search(r"^chosen: (.+)$", chosen, re.MULTILINE).group(1)
    result = _run("train.py", *_command_args(plan.stdout.strip()), "plan.only=true")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"layout: {label}" in result.stdout and "fits: yes" in result.stdout


@pytest.mark.slow
def test_a_planned_command_trains_with_hardware_cpu_and_a_tiny_model(tmp_path):
    """The planner's command for a 1B model on a 4-GPU workstation, with `hardware=cpu` (4 gloo
    ranks) and the debug model substituted, trains."""
    plan = _run("-m", "lightning_dist.plan", "model=llama3_1b", "hardware=rtx4090_x4",
                "data.global_batch_size=16", "data.seq_len=256", "--command")  # fmt: skip
    assert plan.returncode == 0, plan.stderr
    swap = {"model=llama3_1b": "model=llama_debug", "hardware=rtx4090_x4": "hardware=cpu"}
    args = [swap.get(a, a) for a in _command_args(plan.stdout.strip())]
    assert "model=llama_debug" in args and "hardware=cpu" in args
    # dp_shard=2 x tp=2 with sequence parallelism and SHARD_GRAD_OP, when this test was written
    assert "strategy=3d" in args and "strategy.tp=2" in args, args
    # (a shorter sequence for speed: the layout's overrides do not depend on it)
    result = _run("train.py", *args, "hardware.devices=4", "data=synthetic", "data.seq_len=32",
                  "logger=none",
                  "trainer.max_steps=2", "trainer.val_check_interval=null",
                  f"hydra.run.dir={tmp_path}")  # fmt: skip
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert "run finished: 2 steps" in result.stdout
