"""Faults to inject into a real training run (tests only): `+callbacks.kill._target_=...`.

Loaded by tests/toy_train.py, which allows `tests.faults.` as a callback target."""

import os
import signal

from lightning.pytorch.callbacks import Callback


class KillAtStep(Callback):
    """SIGKILL rank `rank` after optimizer step `step`, on the first attempt only (torchrun
    counts its restarts in TORCHELASTIC_RESTART_COUNT)."""

    def __init__(self, step: int, rank: int = 1) -> None:
        self.step, self.rank = step, rank

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        if first_attempt and trainer.global_rank == self.rank and trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


class KillEvery(Callback):
    """SIGKILL rank `rank` after optimizer step (attempt + 1) x `every` on the first `times`
    torchrun attempts: failures `every` steps apart in training progress (bench/goodput.py)."""

    def __init__(self, every: int, times: int, rank: int = 1) -> None:
        self.every, self.times, self.rank = every, times, rank

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        due = attempt < self.times and trainer.global_step == (attempt + 1) * self.every
        if trainer.global_rank == self.rank and due:
            os.kill(os.getpid(), signal.SIGKILL)
