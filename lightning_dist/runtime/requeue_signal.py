"""Slurm's requeue signal (SIGUSR1) is caught from the start of `train()`, not from step 1.

`sbatch --signal=USR1@N` warns a job N seconds before its time limit, and `scancel --signal=USR1`
at any moment, also while Python imports, data is tokenized or the model is built. The
Preemption callback installs its handler only when training starts, and SIGUSR1's default
action ends the process, which would lose the checkpoint and the requeue. So under Slurm
`train()` calls `hold_requeue_signal()` first: the signal only sets a flag, which `hand_over`
gives to the Preemption callback; that callback then checkpoints at the first step boundary and
requeues the job. Holding SIGUSR1 also keeps Lightning's own SLURM handler (an `hpc_ckpt_N.ckpt`
and a requeue from inside the handler) from being installed: Lightning skips it when the signal
already has a handler, so one mechanism handles the signal. A signal that arrives before
`train()` (during imports) still ends the process; the Slurm script of
`python -m lightning_dist.launch slurm` requeues the job then (exit status 138 = 128 + SIGUSR1).
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

REQUEUE_SIGNAL = signal.SIGUSR1

_received: list[int] = []
_preemption: Any = None


def _flag(signum: int, frame: Any) -> None:
    if _preemption is not None:
        _preemption.received = signum
    else:
        _received.append(signum)


def hold_requeue_signal() -> None:
    """Under Slurm (`SLURM_JOB_ID` set), make SIGUSR1 set a flag from now on."""
    if "SLURM_JOB_ID" in os.environ and threading.current_thread() is threading.main_thread():
        signal.signal(REQUEUE_SIGNAL, _flag)


def hand_over(preemption: Any) -> None:
    """Give the signal held so far, and any until its own handler is installed, to the
    Preemption callback (its `received` attribute)."""
    global _preemption
    if _received and preemption.received is None:
        preemption.received = _received[-1]
    _received.clear()
    _preemption = preemption


def release(preemption: Any) -> None:
    """Forget `preemption` once its fit has ended. Held here, it would keep its trainer, model
    and process groups (with their gloo threads) alive in a process that goes on to train again:
    rank 0 of a Hydra multirun, or a rank of the test harness. A signal from now on is held
    for the next `hand_over`."""
    global _preemption
    if _preemption is preemption:
        _preemption = None
