"""How the hang watchdog ends a stalled rank's process on its host (runtime/stalled_mark.py),
with real processes: a stopped one is resumed to end itself with the watchdog's 4 even when
two judges act at once and its main thread is busy in Python; a running one, or one whose mark
cannot be written, is killed; a mark that is not this user's regular file is never read. The
end-to-end jobs are tests/cluster/test_stopped_rank.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

from lightning_dist.runtime.process_identity import PROCESS_ID, start_time
from lightning_dist.runtime.stalled_mark import (
    _mark_folder,
    _mark_name,
    end_stalled,
    is_stopped,
    take_own_mark,
)
from tests.repo import REPO_ROOT

# The watchdog installs the same handler (on_resumed); the main thread then spins in Python.
BUSY = (
    "import os\n"
    "from lightning_dist.runtime.stalled_mark import on_resumed\n"
    "on_resumed(lambda verdict: os._exit(4 if verdict == {'by': '1', 'problem': 'silent'} "
    "else 3))\n"
    "print('ready', flush=True)\n"
    "while True:\n"
    "    pass\n"
)


def _stopped_child() -> tuple[subprocess.Popen, dict]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    child = subprocess.Popen([sys.executable, "-c", BUSY], env=env, stdout=subprocess.PIPE)
    assert child.stdout is not None and child.stdout.readline() == b"ready\n"
    os.kill(child.pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while not is_stopped(child.pid):
        assert time.monotonic() < deadline, "the child never stopped"
        time.sleep(0.005)
    return child, {"pid": child.pid, "process": {**PROCESS_ID, "start": start_time(child.pid)}}


def test_a_stopped_rank_judged_twice_at_once_is_resumed_to_end_itself_with_4():
    for _ in range(3):
        child, beat = _stopped_child()
        judges = [
            threading.Thread(target=end_stalled, args=(beat, {"by": 1, "problem": "silent"}))
            for _ in range(2)
        ]
        for judge in judges:
            judge.start()
        for judge in judges:
            judge.join(10)
        assert child.wait(5) == 4  # neither judge killed it
        mark = _mark_folder() / _mark_name(child.pid, beat["process"]["start"])
        assert not mark.exists()  # the acting judge removed it once the process had ended


def test_a_running_rank_or_one_whose_mark_cannot_be_written_is_killed():
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    beat = {"pid": running.pid, "process": {**PROCESS_ID, "start": start_time(running.pid)}}
    end_stalled(beat, {"by": 1, "problem": "silent"})
    assert running.wait(5) == -signal.SIGKILL
    child, beat = _stopped_child()
    mark = _mark_folder() / _mark_name(child.pid, beat["process"]["start"])
    os.symlink("/dev/full", mark)  # something else holds the mark's name (a full disk alike)
    try:
        started = time.monotonic()
        end_stalled(beat, {"by": 1, "problem": "silent"})
        assert child.wait(5) == -signal.SIGKILL and time.monotonic() - started < 1
    finally:
        mark.unlink()


def test_a_mark_that_is_not_this_users_regular_file_is_never_read():
    mark = _mark_folder() / _mark_name(os.getpid(), PROCESS_ID["start"])
    try:
        os.mkfifo(mark)  # opening a FIFO to read would block the watchdog
        assert take_own_mark() is None
        mark.unlink()
        target = mark.with_suffix(".target")
        target.write_text('{"by": 1, "problem": "planted"}')
        os.symlink(target, mark)
        assert take_own_mark() is None
        mark.unlink()
        mark.write_text('{"by": 1, "problem": "two\\nlines"}')
        assert take_own_mark() == {"by": "1", "problem": "two lines"}
    finally:
        for path in (mark, mark.with_suffix(".target")):
            if os.path.lexists(path):
                path.unlink()
