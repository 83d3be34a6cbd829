"""Throughput and MFU: tokens/s and samples/s, globally and per device, every N steps."""

from __future__ import annotations

import statistics
import time
from typing import Any

from lightning.pytorch.callbacks import Callback

from lightning_dist.callbacks.context import RunContext, StepClock


class ThroughputMonitor(Callback):
    """Logs `throughput/*` every `every_n_steps` optimizer steps, from rank 0's step times.

    MFU follows the PaLM definition: model FLOPs (6N plus the attention term, without
    recomputation) per second over the hardware's dense peak; null where no peak is known.
    """

    def __init__(self, every_n_steps: int = 10) -> None:
        self.every_n_steps = every_n_steps
        self.context: RunContext | None = None
        self.step_seconds: list[float] = []
        self._clock = StepClock()
        self._last = 0.0

    def bind(self, context: RunContext) -> None:
        self.context = context

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._clock.start(trainer)
        self._last = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not self._clock.stepped(trainer):
            return
        now = time.perf_counter()
        self.step_seconds.append(now - self._last)
        self._last = now
        if trainer.global_step % self.every_n_steps == 0 and self.context is not None:
            window = self.step_seconds[1:][-self.every_n_steps :] or self.step_seconds
            for key, value in self.rates(statistics.fmean(window), trainer.world_size).items():
                if value is not None:
                    shown = key == "tokens_per_sec"
                    pl_module.log(f"throughput/{key}", value, prog_bar=shown, rank_zero_only=True)
            pl_module.log("train/tokens_seen", float(self.context.tokens_per_step * trainer.global_step),
                          rank_zero_only=True)  # fmt: skip

    def rates(self, step_seconds: float, world_size: int) -> dict[str, float | None]:
        ctx = self.context
        tokens_per_sec = ctx.tokens_per_step / step_seconds
        return {
            "tokens_per_sec": tokens_per_sec,
            "samples_per_sec": ctx.global_batch_size / step_seconds,
            "tokens_per_sec_per_device": tokens_per_sec / world_size,
            "step_seconds": step_seconds,
            "mfu": ctx.mfu(tokens_per_sec, world_size),
        }

    def summary(self, world_size: int) -> dict[str, Any]:
        """Steady-state rates over every step after the first (which pays for warm-up)."""
        steady = self.step_seconds[1:] or self.step_seconds
        if not steady or self.context is None:
            return {}
        return {"throughput": self.rates(statistics.median(steady), world_size)}
