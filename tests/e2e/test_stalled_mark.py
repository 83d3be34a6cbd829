"""How the hang watchdog ends a stalled rank's process on its host (runtime/stalled_mark.py),
with real processes: the end-to-end jobs are tests/cluster/test_stopped_rank.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from lightning_dist.runtime.process_identity import PROCESS_ID, start_time
from lightning_dist.runtime.stalled_mark import end_stalled, is_stopped
from tests.repo import REPO_ROOT


def test_a_stopped_rank_is_resumed_to_end_itself_and_a_running_one_is_killed():
    """The watchdog ends a stalled rank's process on its host: a stopped one is marked and
    resumed (SIGCONT), finds the verdict meant for it and ends itself (the watchdog then
    exits 4, so a stopped rank 0 no longer ends a job with SIGKILL's 137); a running one is
    killed."""
    stops_itself = (
        "import os, signal, sys\n"
        "from lightning_dist.runtime.stalled_mark import take_own_mark\n"
        "assert take_own_mark() is None\n"  # no verdict for a process nobody judged
        "os.kill(os.getpid(), signal.SIGSTOP)\n"
        "verdict = take_own_mark()\n"
        "sys.exit(4 if verdict == {'by': 1, 'problem': 'silent'} and take_own_mark() is None "
        "else 3)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    stopped = subprocess.Popen([sys.executable, "-c", stops_itself], env=env)
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    deadline = time.monotonic() + 30
    while not is_stopped(stopped.pid) and stopped.poll() is None:
        assert time.monotonic() < deadline, "the child never stopped itself"
        time.sleep(0.02)
    for proc in (stopped, running):
        beat = {"pid": proc.pid, "process": {**PROCESS_ID, "start": start_time(proc.pid)}}
        end_stalled(beat, {"by": 1, "problem": "silent"})
    assert stopped.wait(5) == 4
    assert running.wait(5) == -signal.SIGKILL
