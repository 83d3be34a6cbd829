"""HangWatchdog: a rank that stops making progress stops the whole job, with its name.

Every rank runs a heartbeat thread that writes `(step, phase, time, host, pid)` into a small
key-value store (a `torch.distributed.TCPStore` hosted by rank 0, separate from the process
group's) as it enters each step and phase (so the line names where a rank really stopped, not
where it was at its last round), reads rank 0's every `TICK` seconds (that store dies with rank
0, and rank 0's newer heartbeats with it) and everyone else's every `interval` seconds. The
thread keeps beating while the main thread waits inside a collective, so a rank is stalled when:

- its heartbeat is older than `stall_seconds` (the process is frozen: SIGSTOP, a dead host), or
- it is behind this rank's step while this rank has not advanced for `stall_seconds` (it is
  stuck, and this rank is waiting for it in a collective).

No rank is a blind spot, rank 0 included, though it hosts the store: a store call that does not
return is watched by a second thread, and after `stall_seconds` without an answer rank 0 is the
stalled rank (a frozen process keeps its sockets open, so the call neither fails nor times out).
A rank on this host whose process has ended is lost at once.

The first rank that sees a stall records its verdict in the store; the others adopt it, so every
survivor names the same lost rank, and all wait until each has read it before any of them ends
(rank 0's store must outlive their reading, and Lightning's launcher in rank 0 kills every rank
once one has ended). Each
survivor prints one line naming the lost rank, its host, step and phase (forward, backward,
optimizer, checkpoint, data), ends it when it is on the same host (a stopped one is resumed
to end itself with the same code, `runtime/stalled_mark.py`, its SIGCONT handler installed
here; a running one is killed), and exits with `STALLED_EXIT_CODE` without touching a
collective. A
collective that fails because a peer is gone waits for that line instead of a traceback. Keep
`stall_seconds` below the process group's collective timeout so the watchdog speaks before a
collective times out.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from lightning.pytorch.callbacks import Callback

from lightning_dist.callbacks.heartbeat_store import heartbeat_store, lost_peer
from lightning_dist.runtime.console import print_line
from lightning_dist.runtime.process_identity import (
    PROCESS_ID,
    process_ended,
    same_host,
    start_time,
)
from lightning_dist.runtime.stalled_mark import end_stalled, on_resumed, take_own_mark

STALLED_EXIT_CODE = 4
TICK = 0.25
"""Seconds between two reads of rank 0's heartbeat by each other rank (see the module doc)."""
COALESCE = 0.02
"""Seconds a heartbeat waits after a change, so that changes close together go as one write."""
HOST = socket.gethostname()
VERDICT = "verdict"
"""The store key of the first stall seen: {rank, problem, beat, by}."""


class HangWatchdog(Callback):
    """Heartbeats and stall detection across ranks (see the module docstring)."""

    def __init__(self, stall_seconds: float = 300.0, interval: float | None = None) -> None:
        if stall_seconds <= 0:
            raise ValueError(f"HangWatchdog(stall_seconds={stall_seconds}) must be positive")
        self.stall_seconds = float(stall_seconds)
        self.interval = interval or max(0.5, min(10.0, self.stall_seconds / 10))
        self.step, self.phase = 0, "start"
        self._progress_time = time.monotonic()
        self._stop = threading.Event()
        self._changed = threading.Event()
        """Set on every step and phase: a rank's last heartbeat names where it really stopped
        (a round every `interval` would name a step several steps old)."""
        self._thread: threading.Thread | None = None
        self._store: Any = None
        self._rank, self._world = 0, 1
        self._started = time.time()
        self._answered = time.monotonic()
        """When the store last answered a whole round of this rank's heartbeat thread."""
        self._thawed = False
        """Set when this process itself was frozen (`_was_frozen`)."""
        self._beats: dict[int, dict] = {}
        """The other ranks' heartbeats as last read."""
        self._exiting = threading.Lock()
        """Held by the thread that ends the process (the heartbeat thread or its guard)."""
        self._restore_sigcont: Callable[[], None] = lambda: None
        """Puts back the SIGCONT handler `on_train_start` replaced (`stalled_mark.on_resumed`)."""

    # --- phases, from the training hooks -------------------------------------------------------

    def _enter(self, phase: str, step: int | None = None) -> None:
        self.phase = phase
        if step is not None and step != self.step:
            self.step, self._progress_time = step, time.monotonic()
        self._changed.set()  # the heartbeat thread sends it now, not at its next round

    # `step` is the optimizer step a rank works on, from 1: the next one once a step has ended.
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._enter("forward", trainer.global_step + 1)

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        self._enter("backward")

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self._enter("optimizer")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._enter("data", trainer.global_step + 1)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        self._enter("checkpoint")  # after step N, while the next is N + 1 (no step backwards)

    def on_validation_start(self, trainer, pl_module) -> None:
        self._enter("validation")

    # --- the heartbeat thread ------------------------------------------------------------------

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
            return
        self._rank, self._world = dist.get_rank(), dist.get_world_size()
        self._store = heartbeat_store(self._rank, self.interval, self.stall_seconds)
        self._progress_time = time.monotonic()
        self._started = time.time()
        # The first beat before step 1: a rank that freezes early, even before its thread's
        # first beat, has a heartbeat (with its pid) that ages, and is named and killed.
        self._store.set(f"hb/{self._rank}", json.dumps(self._heartbeat(time.time())))
        self._answered = time.monotonic()
        self._restore_sigcont = on_resumed(self._end_judged)
        self._thread = threading.Thread(
            target=self._beat, name="lightning_dist-watchdog", daemon=True
        )
        self._thread.start()
        threading.Thread(
            target=self._guard, name="lightning_dist-watchdog-guard", daemon=True
        ).start()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._stop.set()
        self._restore_sigcont()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        """A collective that failed because a peer is gone: the heartbeat thread names the lost
        rank and ends this process within `stall_seconds`; wait for it rather than print a
        traceback. Any other exception stops the watchdog."""
        if self._thread is not None and self._thread.is_alive() and lost_peer(exception):
            self._thread.join(self.stall_seconds + 4 * self.interval)
        self._stop.set()
        self._restore_sigcont()

    def _heartbeat(self, now: float) -> dict[str, Any]:
        return {"step": self.step, "phase": self.phase, "time": now,
                "host": HOST, "pid": os.getpid(),
                "process": PROCESS_ID}  # fmt: skip

    def _send_changes_until(self, deadline: float) -> bool:
        """Until `deadline` (monotonic): send this rank's heartbeat as it enters a step or phase
        (the latest of the changes within `COALESCE` seconds), and read rank 0's every `TICK`
        seconds (its store dies with it, and so would its newer heartbeats); False once the
        watchdog is stopped."""
        read_at = time.monotonic()
        while (now := time.monotonic()) < deadline:
            wait = max(0.0, min(deadline, read_at) - now)
            changed = self._changed.wait(wait)
            if self._was_frozen(time.monotonic() - now - wait):
                self._thawed = True
                return not self._stop.is_set()
            if changed:
                # Phases that follow within COALESCE (optimizer, data, the next forward) go
                # out as one write, the latest: half the store calls of a step, at most
                # COALESCE behind for a process frozen in that window.
                time.sleep(COALESCE)
                if self._stop.is_set() or self._rank0_ended():
                    return False
                self._changed.clear()
                self._store.set(f"hb/{self._rank}", json.dumps(self._heartbeat(time.time())))
            if self._stop.is_set() or self._rank0_ended():
                return False
            if time.monotonic() >= read_at:
                if self._rank != 0 and 0 in self._beats:  # the key exists: get cannot wait
                    self._beats[0] = json.loads(self._store.get("hb/0"))
                read_at = time.monotonic() + TICK
        return True

    def _was_frozen(self, overslept: float) -> bool:
        """Whether a wait lasted `stall_seconds` / 2 longer than asked: this process itself was
        frozen (its whole group stopped, a suspended machine), not only the ranks it watches.
        The others' heartbeats are then old by its own clock: it judges none of them until
        they have had a round to beat again."""
        if overslept <= self.stall_seconds / 2:
            return False
        verdict = take_own_mark()
        if verdict is not None:  # stopped, judged by another rank, and resumed to end itself
            self._end_judged(verdict)
        self._progress_time = self._answered = time.monotonic()
        return True

    def _end_judged(self, verdict: dict) -> None:
        """This process was stopped, named stalled by rank `verdict['by']` and resumed (or
        reads that verdict about itself): one line, and the watchdog's exit code. The main
        thread (the SIGCONT handler) waits for a watchdog thread already ending the process."""
        main = threading.current_thread() is threading.main_thread()
        if not self._exiting.acquire(blocking=main):
            return
        self._stop.set()
        print_line(
            f"error: rank {self._rank} was stopped in step {self.step} (phase: {self.phase}) "
            f"and resumed by rank {verdict.get('by')}, which named it stalled "
            f"({verdict.get('problem')}); it stops the job"
        )
        os._exit(STALLED_EXIT_CODE)

    def _rank0_ended(self) -> bool:
        """Rank 0's process (on this host) has ended: its store is gone, and a call to it would
        only print C++ stack dumps as it fails."""
        beat = self._beats.get(0)
        if self._rank == 0 or not beat or not process_ended(beat):
            return False
        self._stalled(0, beat, f"its process (pid {beat['pid']}) has ended", store_answers=False)
        return True

    def _beat(self) -> None:
        self._read_first_beats()
        while True:
            try:
                if not self._send_changes_until(time.monotonic() + self.interval):
                    return
                if self._rank0_ended():
                    return
                now = time.time()
                self._store.set(f"hb/{self._rank}", json.dumps(self._heartbeat(now)))
                others, verdict = self._read_others()
                if self._thawed:  # frozen itself: the others' beats are old by its clock
                    self._thawed, self._answered = False, time.monotonic()
                    continue
            except Exception as e:  # the store lives in rank 0: it is gone
                if not self._stop.is_set() and not self._rank0_ended():
                    self._stalled(
                        0,
                        self._beats.get(0),
                        f"its heartbeat store closed ({e})",
                        store_answers=False,
                    )
                return
            self._answered, self._beats = time.monotonic(), {**self._beats, **others}
            if self._stop.is_set():
                return
            if verdict is not None and verdict["rank"] == self._rank:  # this one, resumed
                self._end_judged(verdict)
                return
            if verdict is not None:  # another rank saw the stall first
                self._stalled(verdict["rank"], verdict["beat"], verdict["problem"], verdict["by"])
                return
            for rank in range(self._world):
                if rank == self._rank:
                    continue
                beat = others.get(rank)
                problem = self._problem(beat, now) if beat else self._never_beat(now)
                if problem:
                    self._stalled(rank, beat, problem)
                    return

    def _read_first_beats(self) -> None:
        """Read every rank's first beat as soon as it is there, not one interval later: a rank
        frozen within the first interval (a small model's steps are fast) is then known by its
        pid, and killed. Waits one interval at most, so that this rank's own beats go on and a
        rank that never beats is named by the loop (`_never_beat`); on a frozen store the guard
        thread sees to it."""
        try:
            self._store.wait(
                [f"hb/{r}" for r in range(self._world)], timedelta(seconds=self.interval)
            )
            self._beats = self._read_others()[0]
            self._answered = time.monotonic()
        except Exception:  # a rank that never beats is named by the loop (_never_beat)
            pass

    def _guard(self) -> None:
        """Rank 0 frozen: the heartbeat thread waits in a store call that never returns (also
        while it ends the process: a verdict it records can block the same way)."""
        while True:
            asked = time.monotonic()
            if self._stop.wait(self.interval) and not self._exiting.locked():
                return
            if self._was_frozen(time.monotonic() - asked - self.interval):
                continue
            silent = time.monotonic() - self._answered
            problem = f"the heartbeat store it hosts has not answered for {silent:.0f} s"
            if self._exiting.locked():
                if silent > self.stall_seconds + 4 * self.interval + 5:
                    print_line(
                        f"error: rank 0 stopped making progress: {problem}; rank "
                        f"{self._rank} stops the job"
                    )
                    os._exit(STALLED_EXIT_CODE)
                time.sleep(self.interval)
            elif silent > self.stall_seconds and self._rank != 0:
                self._stalled(0, self._beats.get(0), problem, store_answers=False)

    def _read_others(self) -> tuple[dict[int, dict], dict | None]:
        """The other ranks' heartbeats, and the verdict of a rank that saw a stall (or None)."""
        ranks = [r for r in range(self._world) if r != self._rank]
        present = [r for r in ranks if self._store.check([f"hb/{r}"])]
        values = self._store.multi_get([f"hb/{r}" for r in present]) if present else []
        verdict = json.loads(self._store.get(VERDICT)) if self._store.check([VERDICT]) else None
        return {r: json.loads(v) for r, v in zip(present, values, strict=True)}, verdict

    def _never_beat(self, now: float) -> str | None:
        """A rank with no heartbeat at all: stalled once this rank has watched for
        `stall_seconds` (every rank writes its first beat before step 1)."""
        waited = now - self._started
        if waited > self.stall_seconds:
            return f"it has sent no heartbeat in the {waited:.0f} s since training started"
        return None

    def _problem(self, beat: dict, now: float) -> str | None:
        if process_ended(beat):
            return f"its process (pid {beat['pid']}) has ended"
        age = now - beat["time"]
        if age > self.stall_seconds:
            return f"its last heartbeat was {age:.0f} s ago"
        waited = time.monotonic() - self._progress_time
        if beat["step"] < self.step and waited > self.stall_seconds:
            return (
                f"it is behind step {self.step}, where the other ranks have waited {waited:.0f} s"
            )
        return None

    def _stalled(
        self,
        rank: int,
        beat: dict | None,
        problem: str,
        seen_by: int | None = None,
        *,
        store_answers: bool = True,
    ) -> None:
        """Name the lost rank in one line, kill it if it is on this host, end this process.
        The first to see it records the verdict (`seen_by` None); every survivor waits for the
        others to read it before the lost rank is killed (`_acknowledge`)."""
        if not self._exiting.acquire(blocking=False):
            return  # the other thread is already ending this process
        self._stop.set()
        if store_answers and seen_by is None:
            rank, beat, problem, seen_by = self._first_verdict(rank, beat, problem)
        where = (
            f" in step {beat['step']} (phase: {beat['phase']}, host {beat['host']})" if beat else ""
        )
        seen = f" (seen by rank {seen_by})" if seen_by not in (None, self._rank) else ""
        print_line(
            f"error: rank {rank} stopped making progress{where}: {problem}{seen}; rank "
            f"{self._rank} stops the job (stall limit trainer.collective_timeout_s / 2 = "
            f"{self.stall_seconds:.0f} s)"
        )
        if store_answers:
            self._acknowledge(rank)
        if beat and same_host(beat) and beat["pid"] != os.getpid():
            # A store call blocked on the killed rank would print C++ frames as it fails.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stderr.fileno())
            if rank == 0 and not store_answers:
                # The other survivors' guards fire within a beat of this one: let them say so
                # before the store they wait on closes under them.
                time.sleep(2 * self.interval)
            if start_time(beat["pid"]) == beat["process"]["start"]:  # that rank, not a reuse
                end_stalled(beat, {"by": self._rank, "problem": problem})
        os._exit(STALLED_EXIT_CODE)

    def _first_verdict(self, rank: int, beat: dict | None, problem: str):
        """Record this stall unless another rank recorded one first; the one recorded."""
        mine = json.dumps({"rank": rank, "beat": beat, "problem": problem, "by": self._rank})
        try:
            first = json.loads(self._store.compare_set(VERDICT, "", mine))
        except Exception:  # the store is going: this rank's own view
            return rank, beat, problem, self._rank
        return first["rank"], first["beat"], first["problem"], first["by"]

    def _acknowledge(self, lost: int) -> None:
        """Say this rank read the verdict, and wait (a few beats at most) until every other
        survivor has too, before the lost rank is killed and this process ends: rank 0's store
        must outlive their reading it, and Lightning's launcher in rank 0 kills every rank
        within 5 s of seeing one exit."""
        try:
            self._store.set(f"ack/{self._rank}", "1")
            waiting = [r for r in range(self._world) if r not in (lost, self._rank)]
            deadline = time.monotonic() + 3 * self.interval + 2
            while waiting and time.monotonic() < deadline:
                waiting = [r for r in waiting if not self._store.check([f"ack/{r}"])]
                time.sleep(0.1)
        except Exception:
            pass
