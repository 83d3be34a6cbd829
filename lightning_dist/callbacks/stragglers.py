"""Stragglers: per-rank step time, the slowest rank and the spread, every N steps.

In a synchronous step every rank ends together, because the fast ones wait for the slow one
inside a collective. So each rank times its *busy* part: from the end of the previous step to
the start of backward (data loading, callbacks and forward), before the first gradient
collective can make it wait. The rank with the largest busy time is the straggler.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn

from lightning_dist.callbacks.context import StepClock


class StragglerMonitor(Callback):
    """Gathers each rank's busy time every `every_n_steps` steps and names the slowest rank."""

    def __init__(self, every_n_steps: int = 10, warn_ratio: float = 1.3) -> None:
        self.every_n_steps = every_n_steps
        self.warn_ratio = warn_ratio
        self.busy_seconds: list[float] = []
        self.per_rank_mean: list[float] = []
        self.slowest_rank: int | None = None
        self.spread: float | None = None
        self._clock = StepClock()
        self._window_start = 0.0
        self._busy = 0.0

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._clock.start(trainer)
        self._window_start = time.perf_counter()

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        self._busy += time.perf_counter() - self._window_start

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._window_start = time.perf_counter()
        if not self._clock.stepped(trainer):
            return
        self.busy_seconds.append(self._busy)
        self._busy = 0.0
        if trainer.global_step % self.every_n_steps == 0:
            self._aggregate(trainer, pl_module)

    def _aggregate(self, trainer: Any, pl_module: Any) -> None:
        window = self.busy_seconds[-self.every_n_steps :]
        mine = torch.tensor(
            [statistics.fmean(window)], dtype=torch.float64, device=pl_module.device
        )
        per_rank = trainer.strategy.all_gather(mine).flatten().tolist()
        self.per_rank_mean = per_rank
        median = statistics.median(per_rank)
        self.slowest_rank = max(range(len(per_rank)), key=per_rank.__getitem__)
        self.spread = per_rank[self.slowest_rank] / median if median > 0 else 1.0
        pl_module.log("stragglers/slowest_rank", float(self.slowest_rank), rank_zero_only=True)
        pl_module.log("stragglers/spread", self.spread, rank_zero_only=True)
        if len(per_rank) > 1 and self.spread > self.warn_ratio and trainer.is_global_zero:
            rank_zero_warn(
                f"rank {self.slowest_rank} is a straggler: its busy time per step is "
                f"{per_rank[self.slowest_rank] * 1e3:.1f} ms, {self.spread:.2f}x the median "
                f"({median * 1e3:.1f} ms) at step {trainer.global_step}"
            )

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self.busy_seconds and not self.per_rank_mean:
            self._aggregate(trainer, pl_module)  # a run shorter than one window

    def summary(self, world_size: int) -> dict[str, Any]:
        return {
            "stragglers": {
                "busy_seconds_per_rank": self.per_rank_mean,
                "slowest_rank": self.slowest_rank,
                "spread": self.spread,
            }
        }
