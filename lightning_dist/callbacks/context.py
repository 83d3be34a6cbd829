"""RunContext: what telemetry needs to know about a run beyond the Trainer itself."""

from __future__ import annotations

from dataclasses import dataclass

from lightning_dist.hardware import HardwareSpec
from lightning_dist.layout import Layout


@dataclass(frozen=True, kw_only=True)
class RunContext:
    """Set by `train()` on every callback that has a `bind(context)` method."""

    hardware: HardwareSpec
    layout: Layout
    precision: str
    seq_len: int
    global_batch_size: int
    flops_per_token: float
    """Training FLOPs per token of the model (6N plus attention; recompute not counted)."""

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.seq_len

    def mfu(self, tokens_per_sec: float | None, world_size: int) -> float | None:
        """Model FLOPs utilisation against the hardware's dense peak; None if unknown."""
        peak = self.hardware.peak_flops(self.precision)
        if not peak or not tokens_per_sec:
            return None
        return self.flops_per_token * tokens_per_sec / (peak * world_size)


class StepClock:
    """Notices when an optimizer step has finished (the global step moved) across micro-batches."""

    def __init__(self) -> None:
        self.last_step = 0

    def start(self, trainer) -> None:
        self.last_step = trainer.global_step

    def stepped(self, trainer) -> bool:
        if trainer.global_step == self.last_step:
            return False
        self.last_step = trainer.global_step
        return True
