"""The end of a process (lightning_dist/runtime/process_end.py). After a finished run, a rank that
torchrun (or Slurm, or Lightning's launcher) started keeps its process group for the rest of the
process; it ends through `end_process`, without the interpreter's teardown, where gloo can abort
a finished process ("terminate called without an active exception": a finished two-task sbatch
job in CI, and this module's own rank script once its plain exit met it). The end barrier is
bounded and says which rank did not come; `end_process` runs Python's exit work (atexit,
flushed output) and exits with the work's status."""

import json
import signal
import subprocess
import sys

import pytest
from world import World

from tests.dist.rank_scripts import REPO_ROOT, run_two_ranks


def test_a_started_rank_keeps_its_group_after_the_job_and_ends_without_teardown(tmp_path):
    """A rank torchrun started keeps a working group after `end_job` (a later job of the process
    could use it); at `end_process` the exit hook that destroys it in a script Python ends (a
    user's) stands aside: the group goes with `os._exit`, and both ranks exit 0. (That hook's
    destroy still leaves Python's teardown, where gloo has aborted such a script now and then
    with "terminate called without an active exception": train.py and our scripts end through
    `end_process` for that reason.)"""
    out = tmp_path / "result.json"
    result = run_two_ranks("end_job_ranks.py", out)  # both ranks exit 0
    assert result == {"alive_after_end_job": True, "sum": 2.0}
    for rank in (0, 1):
        at_exit = json.loads((tmp_path / f"result.json.rank{rank}").read_text())
        assert at_exit == {"group_alive": True}, rank


def test_the_end_barrier_is_bounded_and_names_the_rank_that_did_not_come():
    world = World(2)
    try:
        assert world.run("process_end_cases:end_barrier_with_every_rank") == [True, True]
        (came, took, printed), _ = world.run("process_end_cases:end_barrier_without_rank_one", 3.0)
    finally:
        world.close()
    assert came is False and 3.0 <= took < 15, (came, took)
    lines = [line for line in printed.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("warning: rank 0:"), printed
    assert "within 3 s" in lines[0] and "Rank 1 failed to pass monitoredBarrier" in lines[0]


ENDING = """
import atexit, sys, threading, time
from lightning_dist.runtime.process_end import run_then_end
atexit.register(lambda: print("atexit ran", flush=True))
worker = threading.Thread(target=lambda: (time.sleep(0.5), print("thread finished")))
worker.start()
def main():
    print("partial line, no newline", end="")
    {body}
run_then_end(main)
print("never printed")
"""


@pytest.mark.parametrize(
    "body, status",
    [
        ("pass", 0),
        ("sys.exit(3)", 3),
        ("sys.exit(75)", 75),
        ("raise ValueError('boom')", 1),
        ("raise KeyboardInterrupt", -signal.SIGINT),
    ],
    ids=["returns", "exit_3", "exit_75", "raises", "interrupted"],
)
def test_end_process_keeps_the_status_and_runs_the_exit_work(body, status):
    code = ENDING.format(body=body)
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == status, result.stderr[-2000:]
    out = result.stdout
    assert "partial line, no newline" in out and "thread finished" in out and "atexit ran" in out
    assert "never printed" not in out
    assert out.index("thread finished") < out.index("atexit ran")  # as Python orders them
    if status == 1:
        assert "ValueError: boom" in result.stderr
    if status == -signal.SIGINT:  # as Python ends: the traceback, then SIGINT's default action
        assert "KeyboardInterrupt" in result.stderr
