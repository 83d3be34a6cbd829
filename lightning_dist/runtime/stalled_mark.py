"""Ending a stopped rank so that it exits with the hang watchdog's code, not SIGKILL's.

A process stopped by SIGSTOP runs no code, so the only way to end it is SIGKILL, whose status is
137. Under `python train.py` the job's status is rank 0's, so a stopped rank 0 ended the job with
137 where every other stall ends it with the watchdog's `STALLED_EXIT_CODE`. Instead, one rank
that judged it (the first to create the mark: `end_stalled`) writes a mark naming that process
(boot, pid, start time) in this user's private folder of the temporary directory and resumes it
with SIGCONT. The resumed process reads the mark in its SIGCONT handler (the main thread, before
its next Python statement) or in its watchdog threads (their waits overslept), prints one line
and exits with the watchdog's code. What the main thread was in when it stopped may run on for a
few milliseconds (measured 3-11 ms of Python on a 2-core machine when the handler is absent); a
C call in progress (a collective, a write) runs on until it returns. A process that has not ended
`RESUME_GRACE` seconds after the SIGCONT, or one hung but running, is killed as before. Other
judges wait for the acting one; only a mark that is a regular file of this user, in a folder of
this user's that nobody else can write, is read.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lightning_dist.runtime.process_identity import PROCESS_ID, process_ended, stat_fields

RESUME_GRACE = 1.0
"""Seconds a resumed process has to end itself before it is killed (it takes milliseconds)."""
MARK_BYTES = 4096
"""The most of a mark that is read."""


def _mark_folder() -> Path | None:
    """This user's folder for marks (made 0700 if missing), or None when what is there is not
    a folder of this user that only this user can write."""
    folder = Path(tempfile.gettempdir()) / f"lightning_dist-{os.geteuid()}"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        info = os.lstat(folder)
    except OSError:
        return None
    mine = stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid()
    return folder if mine and not info.st_mode & 0o022 else None


def _mark_name(pid: int, start: str | None) -> str:
    return f"stalled-{PROCESS_ID['boot']}-{pid}-{start}.json"


def is_stopped(pid: int) -> bool:
    """Whether process `pid` is stopped (state T: SIGSTOP; t: a debugger, which SIGCONT does
    not resume)."""
    fields = stat_fields(pid)
    return bool(fields) and fields[0] in ("T", "t")


def _claim(mark: Path, verdict: dict) -> str:
    """'mine' when this rank created the mark, 'theirs' when another judge did first, 'failed'
    when it cannot be written (the process is then killed)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    try:
        fd = os.open(mark, flags, 0o600)
    except FileExistsError:
        return "theirs" if _is_own_file(mark) else "failed"
    except OSError:
        return "failed"
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(verdict))
        return "mine"
    except OSError:
        mark.unlink(missing_ok=True)
        return "failed"


def _is_own_file(path: Path) -> bool:
    """A regular file of this user, not a link (what a judge writes)."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid()


def _wait_for_end(beat: dict, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not process_ended(beat):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)
    return True


def end_stalled(beat: dict, verdict: dict) -> None:
    """End the process of a stalled rank's heartbeat `beat` (on this host, checked by the
    caller). A stopped one is marked with `verdict` ({by, problem}) and resumed by the first
    judge to claim it, so that it ends itself (`take_own_mark`); the other judges wait for it. A
    running one, one that has not ended in time, or one whose mark cannot be written is
    killed."""
    pid, start = beat["pid"], beat["process"]["start"]
    if process_ended(beat):
        return
    folder = _mark_folder()
    mark = folder / _mark_name(pid, start) if folder else None
    claim = "failed"
    if mark is not None and os.path.lexists(mark):
        claim = "theirs" if _is_own_file(mark) else "failed"
    elif mark is not None and is_stopped(pid):
        claim = _claim(mark, verdict)
    try:
        if claim == "mine":
            os.kill(pid, signal.SIGCONT)
        if claim == "failed" or not _wait_for_end(beat, RESUME_GRACE + (claim == "theirs")):
            os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    finally:
        if claim == "mine" and mark is not None:
            _wait_for_end(beat, 1.0)  # a late judge must still find the mark and wait
            try:
                mark.unlink(missing_ok=True)
            except OSError:
                pass


def take_own_mark() -> dict | None:
    """The verdict another rank left for this process before resuming it, or None when there
    is none (a user's SIGCONT, a whole replica group thawed), or what is there is not a small
    regular file of this user. Strings are made one line."""
    folder = _mark_folder()
    if folder is None:
        return None
    try:
        fd = os.open(
            folder / _mark_name(os.getpid(), PROCESS_ID["start"]),
            os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK,
        )
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
            return None
        text = os.read(fd, MARK_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        verdict = json.loads(text)
    except ValueError:
        return None
    if not isinstance(verdict, dict):
        return None
    return {k: " ".join(str(v).split())[:300] for k, v in verdict.items()}


def on_resumed(callback: Callable[[dict], Any]) -> Callable[[], None]:
    """Call `callback(verdict)` when this process is resumed with a mark meant for it (SIGCONT;
    Python runs the handler in the main thread before its next statement). Call from the main
    thread (from another, nothing is installed: the watchdog's threads still read the mark);
    returns the function that puts the previous handler back."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = signal.getsignal(signal.SIGCONT)

    def handler(signum, frame) -> None:
        verdict = take_own_mark()
        if verdict is not None:
            callback(verdict)
        elif callable(previous):
            previous(signum, frame)

    signal.signal(signal.SIGCONT, handler)

    def restore() -> None:
        if signal.getsignal(signal.SIGCONT) is handler:
            signal.signal(signal.SIGCONT, previous)

    return restore
