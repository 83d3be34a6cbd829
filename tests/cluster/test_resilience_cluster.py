"""Surviving the cluster, end to end: real runs of train.py on the debug model (gloo ranks). A
NaN stop writes no checkpoint with a NaN in it; SIGTERM or SIGUSR1 on one DDP rank checkpoints,
and auto-resume finishes bitwise like the uninterrupted run (in the same W&B run); torchrun
restarts a killed rank, which resumes and finishes bitwise; a checkpoint folder that turns
unwritable stops every rank with one line, its last save in a fallback folder, equal to
the uninterrupted run's; a bad record that a streamed source reaches mid-run (in a DataLoader worker) stops
every rank with one line naming file:line, the steps trained kept. (A stopped rank is
test_stopped_rank.py; the NaN guard and the checkpoint scan in one process are
tests/unit/test_resilience.py; an asynchronous save against a synchronous one is
tests/dist/test_fsdp_dist.py.)

The jobs are independent, and most of their time is spent waiting (a slowed rank), so they run
at once, started by a module fixture: the NaN, signal, uninterrupted, torchrun and unwritable
jobs, then the two resumes together. Each test checks its own job's outcome.
"""

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
from tests.cluster.jobs import FAST, Job, act_when, child_pid, train_job, wait_all
from tests.repo import REPO_ROOT


def _state(path: Path) -> dict[str, torch.Tensor]:
    """The model's tensors of a checkpoint folder, whole (manifest and hashes checked first)."""
    return read_full_state(path, "state_dict.")


# --- the first wave: NaN, signals, the uninterrupted run, torchrun, a lost checkpoint folder -

DDP12 = [
    "strategy=ddp",
    "hardware.devices=2",
    "trainer.max_steps=12",
    "trainer.checkpoint.every_n_train_steps=5",
    "trainer.checkpoint.save_last=true",
]
SIGNALS = {"sigterm_rank1": (signal.SIGTERM, 1), "sigusr1_rank0": (signal.SIGUSR1, 0)}
# After step 5, rank 1 sleeps 1 s per step (math unchanged): the signal lands well before 12.
SLOW = [
    "+callbacks.slow._target_=tests.slow_rank.SlowRank",
    "+callbacks.slow.seconds=1.0",
    "+callbacks.slow.from_step=5",
]


# The checkpoint folder turns unwritable after step 5 (as a full disk or a lost mount would):
# rank 0 is slowed (math unchanged) so that the run is still going when it does. It saves at
# the uninterrupted run's steps, so its fallback save of step 10 is compared with that run's.
UNWRITABLE = ["strategy=ddp", "hardware.devices=2", "trainer.max_steps=12",
              "trainer.checkpoint.every_n_train_steps=5",
              "+callbacks.slow._target_=tests.slow_rank.SlowRank", "+callbacks.slow.rank=0",
              "+callbacks.slow.seconds=0.5"]  # fmt: skip


def _bad_record_job(root: Path) -> Job:
    """2 ranks stream a JSON Lines file whose line 201 is cut short: with 16 samples a step,
    the stream reaches it after step 3 (its first record is read as the run starts)."""
    lines = [json.dumps({"text": f"doc {k} the quick brown fox jumps"}) for k in range(600)]
    lines[200] = '{"text": "cut short'
    corpus = root / "bad_record.jsonl"
    corpus.write_text("\n".join(lines) + "\n")
    return train_job("strategy=ddp", "hardware.devices=2", "data=mixture",
                     f"data.sources=[{{path: {corpus}, format: jsonl, stream: true}}]",
                     "data.global_batch_size=16", "data.val_fraction=0.5", "data.val_batches=1",
                     "data.num_workers=1", "trainer.max_steps=12",
                     "trainer.checkpoint.every_n_train_steps=2", run_dir=root / "bad_record")  # fmt: skip


def _unwritable(folder: Path, on: bool) -> None:
    """Make `folder` unwritable, or writable again. As root (who ignores permissions) by the
    immutable attribute, otherwise by permissions: either way, creating anything in it fails
    with an OSError, as on a full disk or a read-only mount."""
    if os.geteuid() == 0:
        subprocess.run(["chattr", "+i" if on else "-i", str(folder)], check=True)
    else:
        folder.chmod(0o555 if on else 0o755)


def _logged(name: str) -> list[str]:
    return ["logger=wandb"] if name == "sigterm_rank1" else []  # W&B offline (ENV)


def _send(signum: int, rank: int):
    def act(job: Job) -> None:
        os.kill(job.proc.pid if rank == 0 else child_pid(job.proc), signum)

    return act


@pytest.fixture(scope="module")
def first_wave(tmp_path_factory):
    root = tmp_path_factory.mktemp("resilience")
    jobs = {
        "nan": train_job("strategy=single", "optim.lr=1e6", "trainer.max_steps=10",
                         "trainer.checkpoint.every_n_train_steps=1", run_dir=root / "nan"),
        "full": train_job(*DDP12, run_dir=root / "full"),
        # Rank 1 SIGKILLs itself after step 7 (first attempt only); torchrun --max-restarts=1
        # restarts both ranks, which resume from step5.ckpt and finish step 12.
        "torchrun": Job([sys.executable, "-m", "torch.distributed.run", "--standalone",
                         "--nproc-per-node=2", "--max-restarts=1",
                         str(REPO_ROOT / "tests" / "toy_train.py"), *FAST, *DDP12,
                         "trainer.resume=auto", "+callbacks.kill._target_=tests.faults.KillAtStep",
                         "+callbacks.kill.step=7", f"hydra.run.dir={root / 'torchrun'}"],
                        root / "torchrun"),
        **{name: train_job(*DDP12, *_logged(name), *SLOW, run_dir=root / name) for name in SIGNALS},
        "unwritable": train_job(*UNWRITABLE, run_dir=root / "unwritable"),
        "bad_record": _bad_record_job(root),
    }  # fmt: skip
    lost = root / "unwritable" / "checkpoints"
    actions = {
        name: (root / name / "checkpoints" / "step5.ckpt", _send(*SIGNALS[name]))
        for name in SIGNALS
    }
    actions["unwritable"] = (lost / "step5.ckpt", lambda job: _unwritable(lost, True))
    try:
        act_when(jobs, actions, timeout=300)
        deadline = time.monotonic() + 600
        wait_all(jobs.values(), lambda job: deadline)
    finally:
        if jobs["unwritable"].acted_at is not None:
            _unwritable(lost, False)
    resumed = {}
    failed = jobs["unwritable"]
    if failed.code == 2 and (failed.run_dir / "summary.json").exists():
        failed.preempted = json.loads((failed.run_dir / "summary.json").read_text())
    for name in SIGNALS:  # both resumes at once
        job = jobs[name]
        if job.code == 75 and (job.run_dir / "summary.json").exists():
            job.preempted = json.loads((job.run_dir / "summary.json").read_text())
            resumed[name] = train_job(
                *DDP12, *_logged(name), "trainer.resume=auto", run_dir=job.run_dir
            )
    deadline = time.monotonic() + 600
    wait_all(resumed.values(), lambda job: deadline)
    return jobs, resumed


def _summary(job: Job) -> dict:
    path = job.run_dir / "summary.json"
    assert job.code == 0 and path.exists(), f"exited {job.code}:\n{job.stderr[-3000:]}"
    return json.loads(path.read_text())


# --- the NaN guard --------------------------------------------------------------------------


def test_nan_stop_through_train_py_writes_no_nan_checkpoint(first_wave):
    job = first_wave[0]["nan"]
    stderr = job.stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert job.code == 3 and len(errors) == 1, stderr[-2000:]
    assert "not finite at step" in errors[0] and "Traceback" not in stderr
    step = int(errors[0].split("at step ")[1].split(";")[0])
    saved = sorted((job.run_dir / "checkpoints").glob("step*.ckpt"))
    assert len(saved) == step - 1  # every step before the bad one, none after
    for path in saved:
        assert all(torch.isfinite(t).all() for t in _state(path).values()), path


# --- preemption and auto-resume -------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SIGNALS))
def test_a_signal_on_one_rank_checkpoints_and_auto_resume_finishes_bitwise(name, first_wave):
    jobs, resumed = first_wave
    full, job = _summary(jobs["full"]), jobs[name]
    assert job.code == 75 and job.preempted, job.stderr[-3000:]
    run_dir, summary = job.run_dir, job.preempted
    stopped = summary["preempted_at_step"]
    assert summary["status"] == "preempted" and 5 < stopped < 12
    assert (run_dir / "checkpoints" / f"step{stopped}.ckpt" / "manifest.json").is_file()
    resumed_summary = _summary(resumed[name])
    assert resumed_summary["status"] == "completed" and resumed_summary["first_step"] == stopped
    if _logged(name):  # the resumed run continues the same (offline) W&B run
        runs = sorted((run_dir / "wandb").glob("offline-run-*"))
        assert len(runs) == 2 and len({r.name.rsplit("-", 1)[1] for r in runs}) == 1, runs
    assert (
        resumed_summary["steps"] == 12 and resumed_summary["losses"] == full["losses"]
    )  # the whole run, from the checkpoint's history
    final, reference = (
        _state(run_dir / "checkpoints" / "last.ckpt"),
        _state(jobs["full"].run_dir / "checkpoints" / "last.ckpt"),
    )
    assert all(torch.equal(final[k], reference[k]) for k in reference)


# --- a checkpoint folder that turns unwritable ----------------------------------------------


@pytest.mark.slow
def test_an_unwritable_checkpoint_folder_stops_every_rank_and_keeps_the_trained_steps(first_wave):
    """After step 5 the checkpoint folder turns unwritable: the save of step 10 goes to
    checkpoints.fallback/, each rank prints one line naming the folder and the OS error, rank 0
    writes summary.json with every step trained, exit 2; the fallback holds the uninterrupted
    run's step-10 checkpoint: every tensor bit for bit (model and optimizer), the optimizer's
    settings, and the loops' and schedulers' state in meta.pt (what a resume reads; the resumes
    of the signal jobs above run that path)."""
    jobs, _ = first_wave
    job, err = jobs["unwritable"], jobs["unwritable"].stderr
    assert job.code == 2 and job.preempted, err[-3000:]
    assert job.ended_at - job.acted_at < 60  # at the first save after, with no timeout
    summary, step = job.preempted, job.preempted["steps"]
    assert summary["status"] == "checkpoint_failed" and len(summary["losses"]) == step == 10
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert sorted(line.split(":")[1] for line in lines) == [" rank 0", " rank 1"], err[-3000:]
    folder = job.run_dir / "checkpoints"
    for line in lines:
        assert f"cannot write the checkpoint {folder / f'step{step}.ckpt'} ([Errno" in line
        assert f"saved it to {folder.with_name('checkpoints.fallback')}" in line
    assert "Traceback" not in err and "Exception raised from" not in err, err[-3000:]
    full = _summary(jobs["full"])
    assert summary["losses"] == full["losses"][:step]
    saved = read_full_state(folder.with_name("checkpoints.fallback") / f"step{step}.ckpt")
    reference = read_full_state(jobs["full"].run_dir / "checkpoints" / f"step{step}.ckpt")
    tensors = sorted(k for k, v in reference.items() if isinstance(v, torch.Tensor))
    assert tensors and sorted(k for k, v in saved.items() if isinstance(v, torch.Tensor)) == tensors
    assert any(k.startswith("optimizer") for k in tensors), tensors
    assert all(torch.equal(saved[k], reference[k]) for k in tensors)
    settings = {k: v for k, v in reference.items() if not isinstance(v, torch.Tensor)}
    assert {k: v for k, v in saved.items() if not isinstance(v, torch.Tensor)} == settings
    # Lightning's meta.pt: the loops' and schedulers' state a resume restores (the callbacks'
    # differ by the folder their paths name).
    meta = [
        torch.load(path / f"step{step}.ckpt" / "meta.pt", weights_only=True)
        for path in (folder.with_name("checkpoints.fallback"), jobs["full"].run_dir / "checkpoints")
    ]
    for key in ("loops", "global_step", "epoch", "lr_schedulers"):
        assert meta[0].get(key) == meta[1].get(key) and key in meta[1], key


# --- a bad record reached mid-run -----------------------------------------------------------


def check_bad_record_stop(job: Job) -> None:
    """Each rank: one line naming file:line, the fix and the last checkpoint; no traceback (of
    the worker either); rank 0's summary.json holds the steps trained; exit status 2."""
    err, corpus = job.stderr, job.run_dir.with_suffix(".jsonl")
    assert job.code == 2, f"exited {job.code}:\n{err[-3000:]}"
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 2 and "Traceback" not in err, err[-3000:]
    summary = json.loads((job.run_dir / "summary.json").read_text())
    step = summary["steps"]
    assert summary["status"] == "bad_record" and len(summary["losses"]) == step > 1
    for line in lines:
        assert line.startswith(f"error: {corpus}:201: not valid JSON"), line
        assert "data.skip_bad_records=true" in line and f"reached after step {step};" in line
        assert f"its last checkpoint is {job.run_dir / 'checkpoints'}/step" in line, line
    assert f"the losses of steps 1-{step} are in {job.run_dir / 'summary.json'}" in err


@pytest.mark.slow
def test_a_bad_record_reached_mid_run_stops_every_rank_in_one_line(first_wave):
    check_bad_record_stop(first_wave[0]["bad_record"])


# --- elastic restart under torchrun ---------------------------------------------------------


@pytest.mark.slow
def test_torchrun_restarts_a_killed_rank_and_finishes_bitwise(first_wave):
    """Rank 1 SIGKILLs itself after step 7 (first attempt only); torchrun --max-restarts=1
    restarts both ranks, which resume from step5.ckpt and finish step 12."""
    jobs, _ = first_wave
    full, job = _summary(jobs["full"]), jobs["torchrun"]
    output = job.stdout + job.stderr
    assert job.code == 0, output[-4000:]
    assert output.count("failed (exitcode: -9)") == 1  # one rank killed, one restart
    assert "resuming from" in output and "step5.ckpt (step 5)" in output
    final = _state(job.run_dir / "checkpoints" / "last.ckpt")
    reference = _state(jobs["full"].run_dir / "checkpoints" / "last.ckpt")
    assert final.keys() == reference.keys()
    assert all(torch.equal(final[k], reference[k]) for k in reference)
    summary = json.loads((job.run_dir / "summary.json").read_text())
    assert summary["steps"] == 12 and summary["losses"] == full["losses"]
