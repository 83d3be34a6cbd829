"""Progress: a Rich bar on a terminal, plain periodic lines in logs and CI."""

from __future__ import annotations

import sys
import time
from typing import Any

from lightning.pytorch.callbacks import ProgressBar, RichProgressBar


def progress_bar(plain_every_n_steps: int = 10) -> ProgressBar:
    """A Rich bar when stdout is a terminal, else `PlainProgress` lines every N steps."""
    if sys.stdout.isatty():
        return RichProgressBar()
    return PlainProgress(every_n_steps=plain_every_n_steps)


class PlainProgress(ProgressBar):
    """One line per `every_n_steps` optimizer steps, for logs that are not a terminal."""

    def __init__(self, every_n_steps: int = 10) -> None:
        super().__init__()
        self.every_n_steps = every_n_steps
        self._enabled = True
        self._last_step = -1
        self._start = 0.0

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if not (self._enabled and trainer.is_global_zero) or step == self._last_step:
            return
        if step % self.every_n_steps and step != trainer.max_steps:
            return
        self._last_step = step
        metrics = self.get_metrics(trainer, pl_module)
        shown = [f"step {step}/{trainer.max_steps}"]
        for key, label, fmt in (
            ("train/loss", "loss", "{:.4f}"),
            ("val/loss", "val_loss", "{:.4f}"),
            ("throughput/tokens_per_sec", "tok/s", "{:,.0f}"),
        ):
            if key in metrics:
                shown.append(f"{label} {fmt.format(float(metrics[key]))}")
        shown.append(f"{time.perf_counter() - self._start:.0f}s")
        print(" | ".join(shown), flush=True)

    def on_validation_end(self, trainer, pl_module) -> None:
        metrics = trainer.callback_metrics
        if self._enabled and trainer.is_global_zero and "val/loss" in metrics:
            print(f"validation at step {trainer.global_step}: loss {float(metrics['val/loss']):.4f}",
                  flush=True)  # fmt: skip
