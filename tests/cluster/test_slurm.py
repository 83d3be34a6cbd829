"""train.py on a real one-node Slurm (munged, slurmctld, slurmd; scripts/slurm/start.sh):

- an sbatch job written and submitted by `python -m lightning_dist.launch slurm`, and an srun
  job, each 2 tasks under Lightning's SLURMEnvironment, match the single-process run;
- a job signalled with SIGUSR1 checkpoints, requeues itself and finishes on its second run
  with final parameters bitwise equal to the uninterrupted sbatch job, in the same W&B run;
- `train.py -m hydra/launcher=submitit_slurm` runs a 2-job sweep.

Every job starts at once (the cluster declares more CPUs than the machine has, so they run side
by side) and each test waits for its own. Skipped where Slurm is not installed: .ci/run installs
it with scripts/slurm/install.sh (Debian's slurm-wlm and munge, as root)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

from lightning_dist.checkpoint.format import read_full_state
from lightning_dist.run.parity_runs import max_relative_difference, reference_overrides
from tests.dist import baselines
from tests.repo import REPO_ROOT

SCRIPTS = REPO_ROOT / "scripts" / "slurm"
TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "scancel")
PATH = os.environ.get("PATH", "") + ":/usr/sbin"
MISSING = [tool for tool in TOOLS if not shutil.which(tool, path=PATH)]
TOLERANCE = 1e-4  # relative, as the parity harness
FINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        bool(MISSING),
        reason=f"Slurm is not installed (no {', '.join(MISSING)}); "
        "scripts/slurm/install.sh installs it (apt, root)",
    ),
    pytest.mark.skipif(os.geteuid() != 0, reason="starting munged and slurmd needs root"),
]

RUN = [
    "debug=fast",
    "strategy=ddp",
    "hardware.devices=2",
    "trainer.max_steps=8",
    "trainer.checkpoint.every_n_train_steps=3",
    "trainer.checkpoint.save_last=true",
]
SLOW = [
    "+callbacks.slow._target_=tests.slow_rank.SlowRank",
    "+callbacks.slow.seconds=3.0",
    "+callbacks.slow.from_step=3",
]
"""After step 3, rank 1 sleeps 3 s a step (the math is unchanged), so the signal lands before the
last step."""


@pytest.fixture(scope="module")
def cluster():
    """The one-node cluster, started for this module and stopped after it."""
    started = time.monotonic()
    state = Path(tempfile.mkdtemp(prefix="lightning_dist_slurm_"))
    env = {**os.environ, "PATH": PATH, "SLURM_NODE_CPUS": "16", "OMP_NUM_THREADS": "1",
           "WANDB_MODE": "offline", "PYTHONPATH": os.pathsep.join(
               filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}  # fmt: skip
    start = subprocess.run(
        [SCRIPTS / "start.sh", state], env=env, capture_output=True, text=True, timeout=120
    )
    assert start.returncode == 0, start.stdout + start.stderr
    env["SLURM_CONF"] = str(state / "slurm.conf")
    try:
        yield env
    finally:
        subprocess.run([SCRIPTS / "stop.sh", state], env=env, timeout=120)
        shutil.rmtree(state, ignore_errors=True)
        print(f"\nslurm tests: {time.monotonic() - started:.0f} s with the cluster's start")


def _submit(env: dict, *args: str) -> str:
    """`python -m lightning_dist.launch slurm ARGS`; the job id it prints."""
    out = subprocess.run(
        [sys.executable, "-m", "lightning_dist.launch", "slurm", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    match = re.search(r"submitted Slurm job (\d+)", out.stdout)
    assert out.returncode == 0 and match, out.stdout + out.stderr
    return match.group(1)


@pytest.fixture(scope="module")
def jobs(cluster, tmp_path_factory):
    """Every job of the module, started at once: sbatch, srun, requeue and the submitit sweep
    (the single-process reference is stored: tests/dist/baselines.py)."""
    root = tmp_path_factory.mktemp("slurm_jobs")
    env = cluster
    popen = {
        "cwd": REPO_ROOT,
        "env": env,
        "stdout": subprocess.PIPE,
        "stderr": subprocess.STDOUT,
        "text": True,
    }
    launch = ["--log-dir", str(root), "--time", "15"]
    started = {
        "sbatch": _submit(
            env,
            *RUN,
            f"hydra.run.dir={root}/sbatch",
            "logger=none",
            *launch,
            "--job-name",
            "parity",
        ),
        "requeue": _submit(
            env,
            *RUN,
            *SLOW,
            f"hydra.run.dir={root}/requeue",
            "logger=wandb",
            *launch,
            "--job-name",
            "requeue",
        ),
        "srun": subprocess.Popen(
            [
                "srun",
                "--nodes=1",
                "--ntasks-per-node=2",
                "--job-name=srun-parity",
                "--time=15",
                sys.executable,
                str(REPO_ROOT / "train.py"),
                *RUN,
                "logger=none",
                f"hydra.run.dir={root}/srun",
            ],
            **popen,
        ),
        "sweep": subprocess.Popen(
            [
                sys.executable,
                str(REPO_ROOT / "train.py"),
                "-m",
                "hydra/launcher=submitit_slurm",
                "strategy=ddp,fsdp2",
                "debug=fast",
                "hardware.devices=2",
                "logger=none",
                "hydra.launcher.timeout_min=15",
                f"hydra.sweep.dir={root}/sweep",
            ],
            **popen,
        ),
    }
    yield root, started
    for proc in started.values():
        if isinstance(proc, subprocess.Popen) and proc.poll() is None:
            proc.kill()


def _finished(proc: subprocess.Popen, timeout: float = 600) -> str:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out[-4000:]
    return out


def _job(env: dict, job_id: str) -> dict[str, str]:
    out = subprocess.run(
        ["scontrol", "show", "job", "-o", job_id], env=env, capture_output=True, text=True
    ).stdout
    return dict(re.findall(r"(\w+)=(\S*)", out))


def _wait_job(env: dict, job_id: str, timeout: float = 600) -> dict[str, str]:
    """The job's fields once it has ended (any state Slurm calls final)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = _job(env, job_id)
        if job.get("JobState") in FINAL_STATES:
            return job
        time.sleep(1)
    raise AssertionError(
        f"job {job_id} still {_job(env, job_id).get('JobState')} after {timeout} s"
    )


def _reference() -> dict:
    """The one-process run of RUN, stored (tests/dist/baselines.py); checkpointing, which the
    jobs do and the reference need not, leaves the losses alone."""
    overrides = [o for o in reference_overrides(RUN) if not o.startswith("trainer.checkpoint.")]
    return baselines.reference([*overrides, "logger=none"])


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def _final_state(run_dir: Path) -> dict[str, torch.Tensor]:
    """The model's parameters in the run's last checkpoint (a folder, read whole)."""
    return read_full_state(run_dir / "checkpoints" / "last.ckpt", "state_dict.")


def test_sbatch_job_of_two_tasks_matches_single(jobs, cluster):
    root, started = jobs
    job = _wait_job(cluster, started["sbatch"])
    log = (root / f"parity-{started['sbatch']}.out").read_text()
    assert job["JobState"] == "COMPLETED", log[-4000:]
    assert job["NumTasks"] == "2" and "MEMBER: 2/2" in log  # two Slurm tasks, two ranks
    reference, candidate = _reference(), _summary(root / "sbatch")
    diff = max_relative_difference(reference["losses"], candidate["losses"])
    print(
        f"\nsbatch (2 tasks) vs single: {len(reference['losses'])} steps, max rel diff {diff:.2e}"
    )
    assert candidate["world_size"] == 2 and diff <= TOLERANCE


def test_srun_job_of_two_tasks_matches_single(jobs):
    root, started = jobs
    _finished(started["srun"])
    reference, candidate = _reference(), _summary(root / "srun")
    diff = max_relative_difference(reference["losses"], candidate["losses"])
    print(f"\nsrun (2 tasks) vs single: {len(reference['losses'])} steps, max rel diff {diff:.2e}")
    assert candidate["world_size"] == 2 and diff <= TOLERANCE


def test_sigusr1_requeues_the_job_and_it_finishes_bitwise(jobs, cluster):
    root, started = jobs
    job_id, run_dir = started["requeue"], root / "requeue"
    deadline = time.monotonic() + 600
    while not (run_dir / "checkpoints" / "step3.ckpt").exists():
        assert time.monotonic() < deadline, f"no step3.ckpt in 600 s: {_job(cluster, job_id)}"
        time.sleep(0.2)
    subprocess.run(["scancel", "--signal=USR1", job_id], env=cluster, check=True)
    # Slurm holds a requeued job back (BeginTime about 2 minutes on); start it at once instead.
    while _job(cluster, job_id).get("Restarts", "0") == "0":
        assert time.monotonic() < deadline, "the job was not requeued"
        time.sleep(0.5)
    # The requeue revokes the job's credential, and slurmd compares times in whole seconds: a
    # start within the same second is killed as "Job credential revoked". Slurm's own hold
    # avoids that; ours must wait out the second.
    time.sleep(2)
    while (state := _job(cluster, job_id).get("JobState")) not in ("RUNNING", *FINAL_STATES):
        if state == "PENDING":  # not while the first run is still being ended
            subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], env=cluster)
        assert time.monotonic() < deadline, f"the requeued job did not start: {state}"
        time.sleep(1)
    job = _wait_job(cluster, job_id)
    log = (root / f"requeue-{job_id}.out").read_text()
    assert job["JobState"] == "COMPLETED" and job["Restarts"] == "1", log[-4000:]
    stopped = int(re.search(r"preempted \(SIGUSR1\): saving .* at step (\d+)", log).group(1))
    assert f"requeueing SLURM job {job_id}" in log and 3 <= stopped < 8
    assert "srun: error" not in log, log[-4000:]  # the ranks exit 0; the script requeues
    resumed, full = _summary(run_dir), _summary(root / "sbatch")
    assert resumed["status"] == "completed" and resumed["first_step"] == stopped
    assert resumed["steps"] == 8 and resumed["losses"] == full["losses"]
    final, reference = _final_state(run_dir), _final_state(root / "sbatch")
    bitwise = final.keys() == reference.keys() and all(
        torch.equal(final[k], reference[k]) for k in reference
    )
    print(
        f"\nrequeue: stopped at step {stopped}, resumed to 8; final parameters bitwise "
        f"equal to the uninterrupted job: {'yes' if bitwise else 'no'}"
    )
    assert bitwise
    runs = sorted((run_dir / "wandb").glob("offline-run-*"))  # both runs, one W&B run id
    assert len(runs) == 2 and len({r.name.rsplit("-", 1)[1] for r in runs}) == 1, runs


@pytest.mark.skipif(
    importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") is None,
    reason="hydra-submitit-launcher is not installed (pip install -e '.[slurm]')",
)
def test_submitit_launcher_runs_a_two_job_sweep(jobs):
    root, started = jobs
    out = _finished(started["sweep"], timeout=900)
    summaries = [_summary(root / "sweep" / str(n)) for n in (0, 1)]
    assert [s["strategy"] for s in summaries] == ["ddp", "fsdp2"], out[-4000:]
    assert all(s["world_size"] == 2 and s["status"] == "completed" for s in summaries)
    diff = max_relative_difference(summaries[0]["losses"], summaries[1]["losses"])
    assert diff <= TOLERANCE and (root / "sweep" / "comparison.md").is_file()
    folders = (root / "sweep" / ".submitit").iterdir()
    array_jobs = sorted(p.name for p in folders if re.fullmatch(r"\d+_\d+", p.name))
    assert len(array_jobs) == 2, array_jobs  # one Slurm array job, two tasks of it


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs a CUDA GPU: the job asks Slurm for --gpus-per-node and runs NCCL",
)
def test_gpu_job_gets_its_gpus_and_the_hardware_nccl_settings(cluster, tmp_path):
    """Written for a GPU machine (start.sh declares its GPUs as a GRES); not yet run on one."""
    gpus = min(torch.cuda.device_count(), 2)
    job_id = _submit(
        cluster,
        "debug=fast",
        "strategy=ddp",
        "hardware=gpu",
        f"hardware.devices={gpus}",
        "logger=none",
        f"hydra.run.dir={tmp_path}/run",
        "--log-dir",
        str(tmp_path),
        "--job-name",
        "gpu",
        "--time",
        "15",
    )
    job = _wait_job(cluster, job_id)
    log = (tmp_path / f"gpu-{job_id}.out").read_text()
    assert job["JobState"] == "COMPLETED", log[-4000:]
    (script,) = tmp_path.glob("gpu-*.sbatch")
    assert f"#SBATCH --gpus-per-node={gpus}" in script.read_text()
    assert "export NCCL_DEBUG=WARN" in script.read_text()
    summary = _summary(tmp_path / "run")
    assert summary["world_size"] == gpus and summary["hardware"] == "gpu"
