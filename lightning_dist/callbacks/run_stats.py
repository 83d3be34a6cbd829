"""RunStats: tokens/s from the shared step clock and peak memory per rank, for summary.json."""

from __future__ import annotations

import resource
import sys
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback

from lightning_dist.callbacks.context import StepClock, step_clock


def peak_memory_bytes(device: torch.device) -> int:
    """Peak memory of this rank: CUDA allocator peak on GPUs, process peak RSS on CPUs."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)  # Linux reports KiB


class RunStats(Callback):
    """Always on: keeps the trainer's step clock ticking (the numbers behind summary.json's
    `step_seconds` and `tokens_per_sec`) and gathers every rank's peak memory at the end."""

    def __init__(self, tokens_per_step: int) -> None:
        self.tokens_per_step = tokens_per_step
        self.clock = StepClock()
        """The trainer's shared clock once training starts (`step_clock(trainer)`)."""
        self.peak_memory_per_rank: list[int] = []

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.clock = step_clock(trainer)
        self.clock.start(trainer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.clock.tick(trainer, batch_idx)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        mine = torch.tensor([peak_memory_bytes(pl_module.device)], device=pl_module.device)
        gathered = trainer.strategy.all_gather(mine)
        self.peak_memory_per_rank = [int(v) for v in gathered.flatten().tolist()]

    def step_seconds(self) -> list[float]:
        """Wall time of each optimizer step on this rank (the first includes warm-up)."""
        return self.clock.step_seconds()

    def tokens_per_sec(self) -> float | None:
        """Global tokens per step over the clock's steady step time (the median of the steps
        after the first); None before the second step."""
        seconds = self.clock.steady_step_seconds()
        return self.tokens_per_step / seconds if seconds else None
