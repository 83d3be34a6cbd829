"""Train.py jobs in the background for the cluster tier's fault tests (test_resilience_cluster.py,
test_stopped_rank.py): many at once, each with its output in files, waited for with deadlines,
acted on (a signal to one rank) once a checkpoint file appears."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.repo import REPO_ROOT

TRAIN = [sys.executable, str(REPO_ROOT / "train.py")]
FAST = ["debug=fast", "logger=none"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}


class Job:
    """One train.py (or torchrun) process started in the background; its output goes to files
    in its run directory, so that many jobs can run at once without filling pipes."""

    def __init__(self, cmd: list[str], run_dir: Path) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        self.run_dir = run_dir
        self._out, self._err = (run_dir.with_suffix(".out"), run_dir.with_suffix(".err"))
        with self._out.open("w") as out, self._err.open("w") as err:
            # A session of its own: killing the job kills the ranks rank 0 started too.
            self.proc = subprocess.Popen(
                cmd, cwd=REPO_ROOT, env=ENV, stdout=out, stderr=err, start_new_session=True
            )
        threading.Thread(target=self._stamp_end, daemon=True).start()
        self.acted_at: float | None = None  # when the test's signal was sent
        self.ended_at: float | None = None
        self.code: int | None = None
        self.stopped_pid: int | None = None  # the rank a stopped-rank job stopped
        self.pids: dict[int, int] = {}  # a stopped-rank job's ranks: {rank: pid}
        self.preempted: dict | None = None  # a signalled job's summary, before its resume

    def kill(self) -> None:
        """SIGKILL every process of the job (rank 0 and the ranks it started)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def _stamp_end(self) -> None:
        """When the process ended, seen as it happens (not when a loop next polls it)."""
        self.proc.wait()
        self.ended_at = self.ended_at or time.monotonic()

    @property
    def stdout(self) -> str:
        return self._out.read_text()

    @property
    def stderr(self) -> str:
        return self._err.read_text()


def wait_all(jobs, deadline_of) -> None:
    """Wait for every job, each until `deadline_of(job)` (then it is killed, its code None);
    each job's `ended_at` is when it was seen to end."""
    running = list(jobs)
    while running:
        for job in list(running):
            if job.proc.poll() is not None:
                job.code = job.proc.returncode
                job.ended_at = job.ended_at or time.monotonic()
                running.remove(job)
            elif time.monotonic() > deadline_of(job):
                job.ended_at = time.monotonic()
                job.kill()
                job.proc.wait()
                running.remove(job)
        time.sleep(0.2)


def train_job(*overrides: str, run_dir: Path) -> Job:
    return Job([*TRAIN, *FAST, *overrides, f"hydra.run.dir={run_dir}"], run_dir)


def act_when(jobs: dict[str, Job], actions: dict[str, tuple[Path, object]], timeout: float):
    """For each named job, once its file appears, run its action (a signal to one rank) once;
    fails if a job exits, or the time runs out, before its file appears."""
    deadline = time.monotonic() + timeout
    pending = dict(actions)
    while pending:
        for name, (path, act) in list(pending.items()):
            job = jobs[name]
            if path.exists():
                act(job)
                job.acted_at = time.monotonic()
                del pending[name]
            elif job.proc.poll() is not None:
                for other in jobs.values():  # none left running into the next tests
                    other.kill()
                raise AssertionError(f"{name}: train.py exited early:\n{job.stderr[-3000:]}")
        if time.monotonic() > deadline:
            for job in jobs.values():
                job.kill()
            raise AssertionError(f"{sorted(pending)}: no checkpoint to act on in {timeout} s")
        time.sleep(0.2)


def child_pid(proc: subprocess.Popen) -> int:
    """Rank 1: the process Lightning's launcher started from rank 0."""
    for _ in range(100):
        out = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True)
        # Rank 0 may have other children (W&B's service); rank 1 runs train.py.
        pids = [int(p) for p in out.stdout.split() if b"train.py" in cmdline(int(p))]
        if pids:
            return pids[0]
        time.sleep(0.1)
    raise AssertionError("rank 1 never started")


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie (a killed orphan may wait for a reaper)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
