"""Ending a stopped rank so that it exits with the hang watchdog's code, not SIGKILL's.

A process stopped by SIGSTOP (or a suspended container) runs no code, so the only way to end it
is SIGKILL, whose status is 137. Under `python train.py` the job's status is rank 0's, so a
stopped rank 0 ended the job with 137 where every other stall ends it with the watchdog's
`STALLED_EXIT_CODE`. Instead, the rank that judged it writes a mark naming that process (its pid
and start time) in the temporary folder and resumes it with SIGCONT; the stopped rank's own
watchdog threads wake first (each wait of theirs is long overdue) and, finding the mark, print
one line and exit with the watchdog's code. What the main thread was doing in C when it stopped
(a collective, a write) may run on for the few milliseconds that takes; it reaches no new
Python statement first if it holds the interpreter, and within the interpreter's switch
interval otherwise. A process that has not ended `RESUME_GRACE` seconds after the SIGCONT is
killed as before.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time
from pathlib import Path

from lightning_dist.runtime.process_identity import PROCESS_ID, process_ended, stat_fields

RESUME_GRACE = 5.0
"""Seconds a resumed process has to end itself before it is killed."""


def _mark_path(pid: int, start: str | None) -> Path:
    return Path(tempfile.gettempdir()) / f"lightning_dist-stalled-{pid}-{start}.json"


def is_stopped(pid: int) -> bool:
    """Whether process `pid` is stopped (state T: SIGSTOP, or t: a debugger)."""
    fields = stat_fields(pid)
    return bool(fields) and fields[0] in ("T", "t")


def end_stalled(beat: dict, verdict: dict) -> None:
    """End the process of a stalled rank's heartbeat `beat` (on this host, checked by the
    caller): a stopped one is marked with `verdict` ({by, problem}) and resumed, so that it
    ends itself (`take_own_mark`); a running one, or one that has not ended within
    `RESUME_GRACE` seconds, is killed."""
    pid, start = beat["pid"], beat["process"]["start"]
    mark = _mark_path(pid, start)
    try:
        if is_stopped(pid):
            mark.write_text(json.dumps(verdict))
            os.kill(pid, signal.SIGCONT)
            deadline = time.monotonic() + RESUME_GRACE
            while time.monotonic() < deadline and not process_ended(beat):
                time.sleep(0.02)
        if not process_ended(beat):
            os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        pass
    finally:
        mark.unlink(missing_ok=True)


def take_own_mark() -> dict | None:
    """The verdict another rank left for this process before resuming it (removed as it is
    read), or None when it was resumed by anyone else (a user's SIGCONT, a whole replica group
    thawed) or not stopped at all."""
    mark = _mark_path(os.getpid(), PROCESS_ID["start"])
    try:
        verdict = json.loads(mark.read_text())
    except (OSError, ValueError):
        return None
    mark.unlink(missing_ok=True)
    return verdict if isinstance(verdict, dict) else None
