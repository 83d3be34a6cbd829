"""RunStats: step timing, tokens/s and peak memory per rank, the numbers behind summary.json."""

from __future__ import annotations

import resource
import sys
import time
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback

from lightning_dist.callbacks.context import StepClock


def peak_memory_bytes(device: torch.device) -> int:
    """Peak memory of this rank: CUDA allocator peak on GPUs, process peak RSS on CPUs."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)  # Linux reports KiB


class RunStats(Callback):
    """Always on: times each optimizer step and gathers every rank's peak memory at the end."""

    def __init__(self, tokens_per_step: int) -> None:
        self.tokens_per_step = tokens_per_step
        self.step_end_times: list[float] = []
        self.peak_memory_per_rank: list[int] = []
        self._clock = StepClock()
        self._start = 0.0

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._start = time.perf_counter()
        self._clock.start(trainer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._clock.stepped(trainer):  # not while still accumulating gradients
            self.step_end_times.append(time.perf_counter())

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        mine = torch.tensor([peak_memory_bytes(pl_module.device)], device=pl_module.device)
        gathered = trainer.strategy.all_gather(mine)
        self.peak_memory_per_rank = [int(v) for v in gathered.flatten().tolist()]

    def step_seconds(self) -> list[float]:
        """Wall time of each optimizer step on this rank (the first includes warm-up)."""
        ends = [self._start, *self.step_end_times]
        return [b - a for a, b in zip(ends, ends[1:], strict=False)]

    def tokens_per_sec(self) -> float | None:
        """Steady-state throughput: every step after the first (which pays for warm-up)."""
        times = self.step_end_times
        if len(times) < 2:
            return None
        return self.tokens_per_step * (len(times) - 1) / (times[-1] - times[0])
