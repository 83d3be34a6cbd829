"""The planner's command trains: its `python train.py ...` for a 1B model on a 4-GPU workstation,
run by train.py on 4 CPU ranks with the debug model. (The table, the legend and the 70B command
that train.py's pre-flight plans the same are tests/unit/test_plan_command.py, in-process.)"""

from __future__ import annotations

import os
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
def test_a_planned_command_trains_with_hardware_cpu_and_a_tiny_model(tmp_path, capsys):
    """The planner's command for a 1B model on a 4-GPU workstation, with `hardware=cpu` (4 gloo
    ranks) and the debug model substituted, trains."""
    from lightning_dist.plan import main

    assert main(["model=llama3_1b", "hardware=rtx4090_x4", "data.global_batch_size=16",
                 "data.seq_len=256", "--command"]) == 0  # fmt: skip
    swap = {"model=llama3_1b": "model=llama_debug", "hardware=rtx4090_x4": "hardware=cpu"}
    args = [swap.get(a, a) for a in _command_args(capsys.readouterr().out.strip())]
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
