"""HangWatchdog: a rank that stops making progress stops the whole job, with its name.

Every rank runs a heartbeat thread that writes `(step, phase, time, host, pid)` into a small
key-value store (a `torch.distributed.TCPStore` hosted by rank 0, separate from the process
group's) every `interval` seconds and reads everyone else's. The thread keeps beating while the
main thread waits inside a collective, so a rank is stalled when:

- its heartbeat is older than `stall_seconds` (the process is frozen: SIGSTOP, a dead host), or
- it is behind this rank's step while this rank has not advanced for `stall_seconds` (it is
  stuck, and this rank is waiting for it in a collective).

Every rank that sees a stall prints one line naming the stalled rank, its step and its phase
(forward, backward, optimizer, checkpoint, data), SIGKILLs it when it is on the same host (a
stopped process cannot act on anything gentler), and exits with `STALLED_EXIT_CODE` without
touching a collective. Keep `stall_seconds` below the process group's collective timeout so the
watchdog speaks before a collective times out with a traceback.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from lightning.pytorch.callbacks import Callback

STALLED_EXIT_CODE = 4


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
        self._thread: threading.Thread | None = None
        self._store = None
        self._rank, self._world = 0, 1
        self._started = time.time()

    # --- phases, from the training hooks -------------------------------------------------------

    def _enter(self, phase: str, step: int | None = None) -> None:
        self.phase = phase
        if step is not None and step != self.step:
            self.step, self._progress_time = step, time.monotonic()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._enter("forward", trainer.global_step)

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        self._enter("backward")

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self._enter("optimizer")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._enter("data", trainer.global_step)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        self._enter("checkpoint")

    def on_validation_start(self, trainer, pl_module) -> None:
        self._enter("validation")

    # --- the heartbeat thread ------------------------------------------------------------------

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
            return
        self._rank, self._world = dist.get_rank(), dist.get_world_size()
        self._store = _heartbeat_store(self._rank, self.interval)
        self._progress_time = time.monotonic()
        self._started = time.time()
        # The first beat before step 1: a rank that freezes early, even before its thread's
        # first beat, has a heartbeat (with its pid) that ages, and is named and killed.
        self._store.set(f"hb/{self._rank}", json.dumps(self._heartbeat(time.time())))
        self._thread = threading.Thread(target=self._beat, name="lightning_dist-watchdog",
                                        daemon=True)  # fmt: skip
        self._thread.start()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._stop.set()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._stop.set()

    def _heartbeat(self, now: float) -> dict[str, Any]:
        return {"step": self.step, "phase": self.phase, "time": now,
                "host": socket.gethostname(), "pid": os.getpid()}  # fmt: skip

    def _beat(self) -> None:
        while not self._stop.wait(self.interval):
            now = time.time()
            try:
                self._store.set(f"hb/{self._rank}", json.dumps(self._heartbeat(now)))
                others = self._read_others()
            except Exception as e:  # the store lives in rank 0: it is frozen or gone
                if self._stop.is_set():
                    return
                self._stalled(0, None, f"its heartbeat store does not answer ({e})")
                return
            for rank in range(self._world):
                if rank == self._rank:
                    continue
                beat = others.get(rank)
                problem = self._problem(beat, now) if beat else self._never_beat(now)
                if problem and not self._stop.is_set():
                    self._stalled(rank, beat, problem)
                    return

    def _read_others(self) -> dict[int, dict]:
        ranks = [r for r in range(self._world) if r != self._rank]
        present = [r for r in ranks if self._store.check([f"hb/{r}"])]
        values = self._store.multi_get([f"hb/{r}" for r in present]) if present else []
        return {r: json.loads(v) for r, v in zip(present, values, strict=True)}

    def _never_beat(self, now: float) -> str | None:
        """A rank with no heartbeat at all: stalled once this rank has watched for
        `stall_seconds` (every rank writes its first beat before step 1)."""
        waited = now - self._started
        if waited > self.stall_seconds:
            return f"it has sent no heartbeat in the {waited:.0f} s since training started"
        return None

    def _problem(self, beat: dict, now: float) -> str | None:
        age = now - beat["time"]
        if age > self.stall_seconds:
            return f"its last heartbeat was {age:.0f} s ago"
        waited = time.monotonic() - self._progress_time
        if beat["step"] < self.step and waited > self.stall_seconds:
            return (
                f"it is behind step {self.step}, where the other ranks have waited {waited:.0f} s"
            )
        return None

    def _stalled(self, rank: int, beat: dict | None, problem: str) -> None:
        where = f" at step {beat['step']} (phase: {beat['phase']})" if beat else ""
        print(
            f"error: rank {rank} stopped making progress{where}: {problem}; rank {self._rank} "
            f"stops the job (stall limit trainer.collective_timeout_s / 2 = "
            f"{self.stall_seconds:.0f} s)",
            file=sys.stderr,
            flush=True,
        )
        if beat and beat["host"] == socket.gethostname() and beat["pid"] != os.getpid():
            try:
                os.kill(beat["pid"], signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        os._exit(STALLED_EXIT_CODE)


def _heartbeat_store(rank: int, interval: float):
    """A TCPStore served by rank 0 on a free port of MASTER_ADDR, joined by every rank."""
    host = os.environ.get("MASTER_ADDR", "127.0.0.1")
    timeout = timedelta(seconds=max(5.0, 3 * interval))
    store = None
    if rank == 0:
        store = dist.TCPStore(host, 0, None, True, timeout=timeout, wait_for_workers=False)
    port = [store.port if store is not None else 0]
    dist.broadcast_object_list(port, src=0)
    if store is None:
        store = dist.TCPStore(host, port[0], None, False, timeout=timeout)
    return store
