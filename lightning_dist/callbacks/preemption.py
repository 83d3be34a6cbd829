"""Preemption: SIGTERM, SIGUSR1 or a first Ctrl-C (SIGINT) on any rank checkpoints every rank
and stops the run cleanly; a second Ctrl-C stops at once.

The signal handler only sets a flag; it never touches a collective (Lightning's own SIGTERM
handler broadcasts from inside the handler, which deadlocks against a collective that the
interrupted rank is waiting in). The ranks OR their flags in one all-reduce per optimizer step
(before the step, in the NaN guard's: `StepFlags`), so they all see the signal at the same step
boundary, the end of that step; then every rank saves
`step<N>.ckpt` into the checkpoint folder, rank 0 prints the command that continues the run, and
the fit stops without the validation Lightning would run on an early stop. `train()` writes
summary.json with `"status": "preempted"` (and `"signal"`) and exits with `PREEMPTED_EXIT_CODE`
(130, as a shell reports Ctrl-C, for SIGINT); `trainer.resume=auto` continues.
Under SLURM, SIGUSR1 (the warning signal of `--signal=USR1@...`) also requeues the job: rank 0
runs `scontrol requeue`, or, in the job scripts of `python -m lightning_dist.launch slurm`, the
script does once srun has returned (summary.json then says `"requeue": true`).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import Callback

from lightning_dist._compat import sigterm_broadcast_off
from lightning_dist.callbacks.context import step_flags

log = logging.getLogger(__name__)

PREEMPTED_EXIT_CODE = 75
"""EX_TEMPFAIL: the run stopped on request and can be resumed; not a failure of the run."""
INTERRUPTED_EXIT_CODE = 128 + signal.SIGINT
"""A run stopped by Ctrl-C: checkpointed like a preemption, but not one to requeue."""
SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
PREEMPTION_FLAG = "preemption"
"""Its name in the trainer's `StepFlags`."""


def _nothing() -> None:
    pass


class Preemption(Callback):
    """Turns SIGTERM/SIGUSR1/SIGINT into a checkpoint at the next step boundary and a clean stop."""

    def __init__(self, dirpath: str | Path) -> None:
        self.dirpath = Path(dirpath)
        self.received: int | None = None
        """The signal this rank received, if any."""
        self.preempted_at: int | None = None
        """The optimizer step at which every rank stopped, once they agreed."""
        self.checkpoint: Path | None = None
        self._previous: dict[int, Any] = {}
        self._restore_broadcast: Callable[[], None] = _nothing

    def _handle(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGINT and self.received == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now, without the checkpoint
        self.received = signum  # nothing else here: the main thread may be inside a collective

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        # Lightning installed its handlers before this hook; ours replace them for the fit and
        # Lightning restores its originals at teardown.
        if threading.current_thread() is threading.main_thread():
            for signum in SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
            if trainer.received_sigterm:  # came to Lightning's handler before ours
                self.received = signal.SIGTERM
            # Its flag can no longer rise, so its broadcast of rank 0's flag before every
            # batch (`_broadcast_sigterm_tensor`) would be one more collective per step for
            # nothing: the per-step flag all-reduce (`StepFlags`) covers every rank's signal.
            self._restore_broadcast = sigterm_broadcast_off(trainer)
        # Agreed in the NaN guard's all-reduce before each optimizer step where there is one.
        step_flags(trainer).add(PREEMPTION_FLAG, lambda: self.received is not None)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        for signum, handler in self._previous.items():
            if handler is not None:
                signal.signal(signum, handler)
        self._previous = {}
        self._end_fit(trainer)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._end_fit(trainer)

    def _end_fit(self, trainer: Any) -> None:
        # Nothing of this fit stays referenced from the trainer or from this callback.
        self._restore_broadcast()
        self._restore_broadcast = _nothing
        step_flags(trainer).remove(PREEMPTION_FLAG)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        from lightning_dist.runtime.requeue_signal import release

        release(self)  # the fit is over: nothing global holds this run's trainer any longer

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if (batch_idx + 1) % trainer.accumulate_grad_batches:
            return  # not an optimizer-step boundary
        if not step_flags(trainer).agreed(trainer, PREEMPTION_FLAG):
            return
        step = trainer.global_step
        self.preempted_at = step
        self.checkpoint = self.dirpath / f"step{step}.ckpt"
        name = signal.Signals(self.received).name if self.received else "a signal on another rank"
        if trainer.is_global_zero:
            print(f"preempted ({name}): saving {self.checkpoint} at step {step}", flush=True)
        trainer.save_checkpoint(self.checkpoint, weights_only=False)  # the whole state
        trainer.should_stop = True
        trainer.limit_val_batches = (
            0  # Lightning validates on an early stop: not in the warning window
        )
        if trainer.is_global_zero and self.received != signal.SIGUSR1:
            from lightning_dist.runtime.record import command_line

            print(f"continue this run with: {command_line(resume=True)}", flush=True)
        if self.received == signal.SIGUSR1 and trainer.is_global_zero:
            if os.environ.get(REQUEUE_BY_SCRIPT):
                print("the job script requeues the job once every rank has exited", flush=True)
            else:
                requeue_slurm_job()

    def summary(self, world_size: int) -> dict[str, Any]:
        if self.preempted_at is None:
            return {}
        return {"status": "preempted", "preempted_at_step": self.preempted_at,
                "checkpoint": str(self.checkpoint),
                "signal": signal.Signals(self.received).name if self.received else None,
                "requeue": self.received == signal.SIGUSR1}  # fmt: skip


REQUEUE_BY_SCRIPT = "LIGHTNING_DIST_REQUEUE_BY_SCRIPT"
"""Set by the sbatch scripts of `python -m lightning_dist.launch slurm`: the script requeues the
job after srun returns, so the ranks end cleanly instead of being killed by their own requeue."""


def requeue_slurm_job() -> None:
    """`scontrol requeue` this SLURM job (array task included); logs and returns on failure."""
    job = os.environ.get("SLURM_JOB_ID")
    if os.environ.get("SLURM_ARRAY_JOB_ID"):
        job = f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    if not job or not shutil.which("scontrol"):
        return
    result = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True)
    if result.returncode:
        log.warning("scontrol requeue %s failed: %s", job, result.stderr.strip())
    else:
        print(f"requeued SLURM job {job}", flush=True)
