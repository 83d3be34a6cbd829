"""Throughput and MFU: tokens/s and samples/s, globally and per device, every N steps.

Named `ThroughputMFU` so as not to shadow Lightning's own `ThroughputMonitor`.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import Callback

from lightning_dist.callbacks.context import RunContext, StepClock, step_clock

TOP_LEVEL_RATES = ("tokens_per_sec", "mfu")
"""Rates that summary.json holds at its top level (from RunStats), so never under `throughput`."""


class ThroughputMFU(Callback):
    """Logs `throughput/*` every `every_n_steps` optimizer steps from rank 0's step clock: the
    median step time of the last `every_n_steps` steps after the first.

    MFU follows the PaLM definition: model FLOPs (6N plus the attention term, without
    recomputation) per second over the hardware's dense peak; null where no peak is known.
    """

    def __init__(self, every_n_steps: int = 10) -> None:
        self.every_n_steps = every_n_steps
        self.context: RunContext | None = None
        self.clock = StepClock()
        """The trainer's shared clock once training starts (`step_clock(trainer)`)."""

    def bind(self, context: RunContext) -> None:
        self.context = context

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.clock = step_clock(trainer)
        self.clock.start(trainer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not self.clock.tick(trainer, batch_idx) or self.context is None:
            return
        if trainer.global_step % self.every_n_steps:
            return
        seconds = self.clock.steady_step_seconds(last=self.every_n_steps)
        if seconds is not None:
            for key, value in self.rates(seconds, trainer.world_size).items():
                if value is not None:
                    shown = key == "tokens_per_sec"
                    pl_module.log(f"throughput/{key}", value, prog_bar=shown, rank_zero_only=True)
        pl_module.log(
            "train/tokens_seen",
            float(self.context.tokens_per_step * trainer.global_step),
            rank_zero_only=True,
        )

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
        """`throughput`: the other rates at the clock's steady step time (the same statistic as
        summary.json's top-level `tokens_per_sec` and `mfu`, which are not repeated here)."""
        seconds = self.clock.steady_step_seconds()
        if seconds is None or self.context is None:
            return {}
        rates = self.rates(seconds, world_size)
        return {"throughput": {k: v for k, v in rates.items() if k not in TOP_LEVEL_RATES}}
