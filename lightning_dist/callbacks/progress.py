"""Progress: a Rich bar on a terminal, plain periodic lines in logs and CI."""

from __future__ import annotations

import sys
from typing import Any

from lightning.pytorch.callbacks import ProgressBar, RichProgressBar

from lightning_dist.callbacks.context import RunContext, StepClock, step_clock


def progress_bar(plain_every_n_steps: int = 10) -> ProgressBar:
    """A Rich bar when stdout is a terminal, else `PlainProgress` lines every N steps.

    The console is this callback's: it also silences the third-party hints of
    `lightning_dist.runtime.quiet` in this process, before the Trainer that prints them is built.
    """
    from lightning_dist.runtime.quiet import quiet_third_party

    quiet_third_party()
    if sys.stdout.isatty():
        return RichProgressBar()
    return PlainProgress(every_n_steps=plain_every_n_steps)


class PlainProgress(ProgressBar):
    """One line per `every_n_steps` optimizer steps, for logs that are not a terminal.

    `step N | loss X` is the N-th optimizer step's global loss: summary.json's `losses[N-1]`,
    and the loggers' row N-1 (`lightning_dist.runtime.record`). Its times come from the trainer's shared
    step clock: `s/step` is the median step time of the last `every_n_steps` steps after the
    first, `tok/s` the global tokens per step over it (as `throughput/*`), then the elapsed time.
    """

    def __init__(self, every_n_steps: int = 10) -> None:
        super().__init__()
        self.every_n_steps = every_n_steps
        self.clock = StepClock()
        """The trainer's shared clock once training starts (`step_clock(trainer)`)."""
        self.tokens_per_step: int | None = None
        """Global tokens per optimizer step, from `bind(context)`; no tok/s without it."""
        self._enabled = True

    def bind(self, context: RunContext) -> None:
        self.tokens_per_step = context.tokens_per_step

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.clock = step_clock(trainer)
        self.clock.start(trainer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        stepped = self.clock.tick(trainer, batch_idx)  # ticks on every rank
        if not (stepped and self._enabled and trainer.is_global_zero):
            return
        step = trainer.global_step
        if step % self.every_n_steps and step != trainer.max_steps:
            return
        metrics = self.get_metrics(trainer, pl_module)
        shown = [f"step {step}/{trainer.max_steps}"]
        for key, label in (("train/loss", "loss"), ("val/loss", "val_loss")):
            if key in metrics:
                shown.append(f"{label} {float(metrics[key]):.4f}")
        seconds = self.clock.steady_step_seconds(last=self.every_n_steps)
        if seconds is not None:
            if self.tokens_per_step:
                shown.append(f"tok/s {self.tokens_per_step / seconds:,.0f}")
            shown.append(f"{seconds:.3f} s/step")
        shown.append(f"{self.clock.end_times[-1] - self.clock.start_time:.0f}s")
        print(" | ".join(shown), flush=True)

    def on_validation_end(self, trainer, pl_module) -> None:
        metrics = trainer.callback_metrics
        if self._enabled and trainer.is_global_zero and "val/loss" in metrics:
            print(
                f"validation at step {trainer.global_step}: loss {float(metrics['val/loss']):.4f}",
                flush=True,
            )
