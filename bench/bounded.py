"""Run one benchmark command with a bound: what it did (ok, hang, abort, failed) and whether it left
processes behind, instead of waiting forever or stopping the whole benchmark.

Each command runs in its own session, so the bound and the clean-up reach every process it
started (torchrun's agent and its ranks, Lightning's children). Used by bench/overhead.py and
bench/process_ends.py.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import tempfile
import time
from typing import NamedTuple

FIRST_RUN_TIMEOUT_S = 600.0
"""The bound of a command's first run, before any step time of it is known."""
STARTUP_S = 90.0
"""What a bounded run may spend outside its steps (imports, rendezvous, the end) on 2 busy cores."""
STEP_FACTOR = 10.0
"""How much slower than the measured median a step may get before the run counts as hung."""


class Outcome(NamedTuple):
    status: str
    """ok, hang (killed at the bound), abort (SIGABRT / "terminate called"), failed (other)."""
    code: int | None
    seconds: float
    output: str
    left_behind: int
    """Processes of the command still alive after it ended (killed then)."""

    def line(self, name: str) -> str:
        what = {"hang": f"ran past its bound of {self.seconds:.0f} s and was killed",
                "abort": f"aborted (status {self.code})",
                "failed": f"exited with status {self.code}"}.get(self.status, "finished")  # fmt: skip
        extra = f"; {self.left_behind} process(es) left behind, killed" if self.left_behind else ""
        tail = self.output.strip().splitlines()[-1:] if self.status != "ok" else []
        return f"{name}: {what}{extra}" + (f": {tail[0][:200]}" if tail else "")


def timeout_for(steps: int, step_seconds: list[float] | None) -> float:
    """The bound of a run of `steps` steps: startup plus `STEP_FACTOR` x the median step time
    measured in earlier runs of the same command; `FIRST_RUN_TIMEOUT_S` before any is known."""
    if not step_seconds:
        return FIRST_RUN_TIMEOUT_S
    return STARTUP_S + STEP_FACTOR * steps * statistics.median(step_seconds)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _group_members(pgid: int) -> int:
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getpgid(int(entry)) == pgid:
                    count += 1
            except (ProcessLookupError, PermissionError):
                continue
    return count


def run_bounded(cmd: list[str], *, timeout_s: float, env: dict, cwd) -> Outcome:
    """Run `cmd` (its own session) for at most `timeout_s` seconds; see `Outcome`."""
    with tempfile.TemporaryFile("w+") as log:
        started = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        hung = False
        try:
            code: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            hung = True
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = None
        seconds = time.monotonic() - started
        time.sleep(0.2)  # a rank that is exiting on its own has a moment to go
        left = _group_members(proc.pid) if _group_alive(proc.pid) else 0
        if left:
            os.killpg(proc.pid, signal.SIGKILL)
        log.seek(0)
        output = log.read()
    if hung:
        status = "hang"
    elif code in (-signal.SIGABRT, 128 + signal.SIGABRT) or "terminate called" in output:
        status = "abort"
    elif code != 0:
        status = "failed"
    else:
        status = "ok"
    return Outcome(status, code, seconds, output, left)


if __name__ == "__main__":
    raise SystemExit("bench/bounded.py is a library of bench/overhead.py and bench/process_ends.py")
