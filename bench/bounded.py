"""Run one benchmark command with a bound: what it did (ok, hang, abort, failed) and whether it left
processes behind, instead of waiting forever or stopping the whole benchmark.

Every process a command starts (torchrun's agent and its ranks, Lightning's children) carries a
marker in its environment, so the bound and the clean-up reach them all. Used by
bench/overhead.py and bench/process_ends.py.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
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
        what = {
            "hang": f"ran past its bound of {self.seconds:.0f} s and was killed",
            "abort": f"aborted (status {self.code})",
            "failed": f"exited with status {self.code}",
        }.get(self.status, "finished")
        extra = f"; {self.left_behind} process(es) left behind, killed" if self.left_behind else ""
        return f"{name}: {what}{extra}" + (f": {self.cause()}" if self.status != "ok" else "")

    def cause(self) -> str:
        """The output's last line naming an error (a rank's exception, not torchrun's frame of
        '=' signs nor its closing ChildFailedError, which names no cause), else its last line."""
        lines = [line.strip() for line in self.output.splitlines() if line.strip()]
        named = [
            line
            for line in lines
            if ("Error" in line or line.startswith("error:")) and "ChildFailedError" not in line
        ]
        return ((named or lines or [""])[-1])[:300]


def timeout_for(steps: int, step_seconds: list[float] | None) -> float:
    """The bound of a run of `steps` steps: startup plus `STEP_FACTOR` x the median step time
    measured in earlier runs of the same command; `FIRST_RUN_TIMEOUT_S` before any is known."""
    if not step_seconds:
        return FIRST_RUN_TIMEOUT_S
    return STARTUP_S + STEP_FACTOR * steps * statistics.median(step_seconds)


MARKER = "LIGHTNING_DIST_BENCH_RUN"
"""Set, to a value of its own, in the environment of each bounded run; its processes inherit it.
torchrun starts each rank in a session of its own, so the run's session alone does not find
them: the marker does."""


def marked_processes(marker: str) -> list[int]:
    """Live (not zombie) processes whose environment holds `MARKER=marker`."""
    needle = f"{MARKER}={marker}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if needle in environ.split(b"\0") and state != "Z":
            found.append(int(entry))
    return found


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_bounded(cmd: list[str], *, timeout_s: float, env: dict, cwd) -> Outcome:
    """Run `cmd` for at most `timeout_s` seconds; every process it started (found by `MARKER`)
    is killed at the bound, and any still alive once it has ended is counted and killed."""
    marker = uuid.uuid4().hex
    with tempfile.TemporaryFile("w+") as log:
        started = time.monotonic()
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env={**env, MARKER: marker},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        hung = False
        try:
            code: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            hung = True
            _kill([proc.pid, *marked_processes(marker)])
            proc.wait()
            code = None
        seconds = time.monotonic() - started
        left: list[int] = []
        for _ in range(10):  # a rank that is exiting on its own has a moment to go
            left = marked_processes(marker)
            if not left:
                break
            time.sleep(0.2)
        _kill(left)
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
    return Outcome(status, code, seconds, output, len(left))


if __name__ == "__main__":
    raise SystemExit("bench/bounded.py is a library of bench/overhead.py and bench/process_ends.py")
