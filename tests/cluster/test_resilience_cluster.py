"""Surviving the cluster, end to end: real runs of train.py on the debug model (gloo ranks). A
NaN stop writes no checkpoint with a NaN in it; SIGTERM or SIGUSR1 on one DDP rank checkpoints,
and auto-resume finishes bitwise like the uninterrupted run (in the same W&B run); a stopped rank
stops every rank under ddp, fsdp2 and 3d, and is named; torchrun restarts a killed rank, which
resumes and finishes bitwise. (The NaN guard and the checkpoint scan in one process are
tests/unit/test_resilience.py; an asynchronous save against a synchronous one is
tests/dist/test_fsdp_dist.py.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from lightning_dist.checkpoint.format import read_full_state
from lightning_dist.parity import REPO_ROOT, run_train

TRAIN = [sys.executable, str(REPO_ROOT / "train.py")]
FAST = ["debug=fast", "logger=none"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}


def _launch(*overrides: str, run_dir: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [*TRAIN, *FAST, *overrides, f"hydra.run.dir={run_dir}"], cwd=REPO_ROOT, env=ENV,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"train.py exited early:\n{proc.stderr.read()[-3000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"{path} did not appear in {timeout} s")
        time.sleep(0.2)


def _child_pid(proc: subprocess.Popen) -> int:
    """Rank 1: the process Lightning's launcher started from rank 0."""
    for _ in range(100):
        out = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True)
        # Rank 0 may have other children (W&B's service); rank 1 runs train.py.
        pids = [int(p) for p in out.stdout.split() if b"train.py" in _cmdline(int(p))]
        if pids:
            return pids[0]
        time.sleep(0.1)
    raise AssertionError("rank 1 never started")


def _alive(pid: int) -> bool:
    """A process that exists and is not a zombie (a killed orphan may wait for a reaper)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _state(path: Path) -> dict[str, torch.Tensor]:
    """The model's tensors of a checkpoint folder, whole (manifest and hashes checked first)."""
    return read_full_state(path, "state_dict.")


# --- the NaN guard --------------------------------------------------------------------------


def test_nan_stop_through_train_py_writes_no_nan_checkpoint(tmp_path):
    result = subprocess.run(
        [*TRAIN, *FAST, "strategy=single", "optim.lr=1e6", "trainer.max_steps=10",
         "trainer.checkpoint.every_n_train_steps=1", f"hydra.run.dir={tmp_path}"],
        cwd=REPO_ROOT, env=ENV, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 3 and len(errors) == 1, result.stderr[-2000:]
    assert "not finite at step" in errors[0] and "Traceback" not in result.stderr
    step = int(errors[0].split("at step ")[1].split(";")[0])
    saved = sorted((tmp_path / "checkpoints").glob("step*.ckpt"))
    assert len(saved) == step - 1  # every step before the bad one, none after
    for path in saved:
        assert all(torch.isfinite(t).all() for t in _state(path).values()), path


# --- preemption and auto-resume -------------------------------------------------------------

DDP12 = ["strategy=ddp", "hardware.devices=2", "trainer.max_steps=12",
         "trainer.checkpoint.every_n_train_steps=5", "trainer.checkpoint.save_last=true"]  # fmt: skip


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("full")
    return run_train([*FAST, *DDP12], run_dir), run_dir


@pytest.mark.slow
@pytest.mark.parametrize(
    "signum, rank",
    [(signal.SIGTERM, 1), (signal.SIGUSR1, 0)],
    ids=["sigterm_rank1", "sigusr1_rank0"],
)
def test_a_signal_on_one_rank_checkpoints_and_auto_resume_finishes_bitwise(
    signum, rank, uninterrupted, tmp_path
):
    full, full_dir = uninterrupted
    logged = ["logger=wandb"] if signum == signal.SIGTERM else []  # W&B offline (ENV)
    # After step 5, rank 1 sleeps 1 s per step (math unchanged): the signal lands well before 12.
    slow = ["+callbacks.slow._target_=tests.slow_rank.SlowRank", "+callbacks.slow.seconds=1.0",
            "+callbacks.slow.from_step=5"]  # fmt: skip
    proc = _launch(*DDP12, *logged, *slow, run_dir=tmp_path)
    _wait_for(tmp_path / "checkpoints" / "step5.ckpt", proc)
    os.kill(proc.pid if rank == 0 else _child_pid(proc), signum)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 75, err[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    stopped = summary["preempted_at_step"]
    assert summary["status"] == "preempted" and 5 < stopped < 12
    assert (tmp_path / "checkpoints" / f"step{stopped}.ckpt" / "manifest.json").is_file()
    resumed = run_train([*FAST, *DDP12, *logged, "trainer.resume=auto"], tmp_path)
    assert resumed["status"] == "completed" and resumed["first_step"] == stopped
    if logged:  # the resumed run continues the same (offline) W&B run
        runs = sorted((tmp_path / "wandb").glob("offline-run-*"))
        assert len(runs) == 2 and len({r.name.rsplit("-", 1)[1] for r in runs}) == 1, runs
    assert resumed["steps"] == 12 and resumed["losses"] == full["losses"][stopped:]
    final, reference = (
        _state(tmp_path / "checkpoints" / "last.ckpt"),
        _state(full_dir / "checkpoints" / "last.ckpt"),
    )
    assert all(torch.equal(final[k], reference[k]) for k in reference)


# --- the hang watchdog ----------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "layout, timeout",
    [
        (["strategy=ddp", "hardware.devices=2"], 20),
        (["strategy=fsdp2", "hardware.devices=2"], 20),
        # The timeout also bounds the start-up rendezvous: 4 ranks on 2 busy cores need more.
        (["strategy=3d", "strategy.tp=2", "strategy.pp=2", "strategy.dp_shard=1",
          "hardware.devices=4"], 40),
    ],
    ids=["ddp", "fsdp2", "3d_tp2_pp2"],
)  # fmt: skip
def test_a_stopped_rank_stops_every_rank_and_is_named(layout, timeout, tmp_path):
    proc = _launch(*layout, "trainer.max_steps=400", "trainer.checkpoint.every_n_train_steps=3",
                   f"trainer.collective_timeout_s={timeout}", run_dir=tmp_path)  # fmt: skip
    _wait_for(tmp_path / "checkpoints" / "step3.ckpt", proc)
    stopped = _child_pid(proc)  # one rank that rank 0 started: rank 1
    os.kill(stopped, signal.SIGSTOP)
    started = time.monotonic()
    try:
        _, err = proc.communicate(timeout=timeout + 30)
    finally:
        proc.kill()
    took = time.monotonic() - started
    assert proc.returncode not in (0, None), err[-3000:]
    assert "stopped making progress" in err and "rank 1 " in err, err[-3000:]
    assert took < timeout + 30
    for _ in range(50):  # the stopped rank was killed, not left behind
        if not _alive(stopped):
            break
        time.sleep(0.2)
    assert not _alive(stopped), "the stopped rank is still there"


# --- elastic restart under torchrun ---------------------------------------------------------


@pytest.mark.slow
def test_torchrun_restarts_a_killed_rank_and_finishes_bitwise(uninterrupted, tmp_path):
    """Rank 1 SIGKILLs itself after step 7 (first attempt only); torchrun --max-restarts=1
    restarts both ranks, which resume from step5.ckpt and finish step 12."""
    full, full_dir = uninterrupted
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         "--max-restarts=1", str(REPO_ROOT / "tests" / "toy_train.py"), *FAST, *DDP12,
         "trainer.resume=auto", "+callbacks.kill._target_=tests.faults.KillAtStep",
         "+callbacks.kill.step=7", f"hydra.run.dir={tmp_path}"],
        cwd=REPO_ROOT, env=ENV, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert output.count("failed (exitcode: -9)") == 1  # one rank killed, one restart
    assert "resuming from" in output and "step5.ckpt (step 5)" in output
    final = _state(tmp_path / "checkpoints" / "last.ckpt")
    reference = _state(full_dir / "checkpoints" / "last.ckpt")
    assert final.keys() == reference.keys()
    assert all(torch.equal(final[k], reference[k]) for k in reference)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps"] == 12 and summary["losses"] == full["losses"][5:]
