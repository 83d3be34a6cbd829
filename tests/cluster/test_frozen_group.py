"""A replica group frozen while the others finish (issue 48 case 8): two groups of one rank
under `python -m lightning_dist.launch replicas` (`strategy=ft_hsdp`); once group 1 saved step 6,
its torchrun and rank are SIGSTOPped until group 0 has ended, and at least
`strategy.ft_timeout_s` + 2 s. Group 0 drops it, trains to the last step and ends. On SIGCONT, group 1 is alone at step 6: before this test's fix it
trained a lineage of its own to the last step, writing checkpoints with the same step numbers
as group 0's (three within 3 s). Now its rank prints one line saying it was left behind, its
summary.json keeps steps 1-6 (status `left_behind`), it writes no checkpoint after step 6, and
no traceback is printed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cluster.test_live_healing import ENV, _job_processes
from tests.repo import REPO_ROOT

FT_TIMEOUT_S = 5
STEPS = 14


def _group_processes(marker: str, group: int) -> list[int]:
    """The job's processes (torchrun agent and ranks) of replica group `group`."""
    mine = []
    for pid in _job_processes(marker):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"REPLICA_GROUP_ID={group}".encode() in environ:
            mine.append(pid)
    return mine


@pytest.mark.slow
def test_a_group_frozen_while_the_others_finish_stops_instead_of_training_alone(tmp_path):
    job_dir = tmp_path / "job"
    launch = [sys.executable, "-m", "lightning_dist.launch", "replicas", "--groups", "2",
              "--nproc-per-group", "1", "--max-restarts", "1", "--script", "tests/toy_train.py",
              "debug=fast", "model=tiny", "data.global_batch_size=8",
              f"trainer.max_steps={STEPS}", f"strategy.ft_timeout_s={FT_TIMEOUT_S}",
              "trainer.collective_timeout_s=20", "trainer.checkpoint.every_n_train_steps=3",
              "+callbacks.slow._target_=tests.slow_rank.SlowRank", "+callbacks.slow.rank=0",
              "+callbacks.slow.seconds=0.3", f"hydra.run.dir={job_dir}"]  # fmt: skip
    saved = job_dir / "group1" / "checkpoints" / "step6.ckpt" / "manifest.json"
    with (tmp_path / "out").open("w") as out:
        job = subprocess.Popen(
            launch, cwd=REPO_ROOT, env=ENV, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    marker = str(job_dir)
    try:
        deadline = time.monotonic() + 180
        while not saved.is_file():
            assert job.poll() is None and time.monotonic() < deadline, (
                tmp_path / "out"
            ).read_text()[-4000:]
            time.sleep(0.1)
        frozen = _group_processes(marker, 1)
        assert frozen, "group 1 has no processes"
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        stopped = time.monotonic()
        # Group 1 wakes once group 0 has ended and the freeze has outlasted ft_timeout_s (a
        # fixed sleep raced group 0's last steps on a loaded machine).
        while _group_processes(marker, 0) or time.monotonic() - stopped < FT_TIMEOUT_S + 2:
            assert time.monotonic() - stopped < 120, (tmp_path / "out").read_text()[-4000:]
            time.sleep(0.1)
        finished = json.loads((job_dir / "group0" / "summary.json").read_text())
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
        job.wait(timeout=FT_TIMEOUT_S + 60)
    finally:
        for pid in _job_processes(marker):
            os.kill(pid, signal.SIGKILL)
    output = (tmp_path / "out").read_text()

    # Group 0 trained every step without group 1 and ended before group 1 woke.
    assert finished["status"] == "completed" and finished["steps"] == STEPS, finished["status"]
    # Group 1: one line, its steps kept, its last step saved, nothing after it.
    left = json.loads((job_dir / "group1" / "summary.json").read_text())
    lines = [line for line in output.splitlines() if "was away" in line]
    assert len(lines) == 1 and lines[0].startswith("error: rank 0: replica group 1 "), output[
        -4000:
    ]
    assert "trained on without it" in lines[0], lines[0]
    assert left["status"] == "left_behind" and left["steps"] < STEPS, left["status"]
    assert len(left["losses"]) == left["steps"], left
    steps = sorted(int(p.name[4:-5]) for p in (job_dir / "group1" / "checkpoints").glob("step*"))
    assert steps and steps[-1] == left["steps"] and f"step{steps[-1]}.ckpt" in lines[0], steps
    assert "Traceback" not in output and "ChildFailedError" not in output, output[-4000:]
    assert job.returncode == 128 + signal.SIGKILL  # group 1's agent, ended by its rank's line
