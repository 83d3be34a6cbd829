"""MemoryByCategory: one training step's memory per rank, by category, for summary.json.

The tracker wraps a real Lightning step (from the first micro-batch's start to the end of the
optimizer step) rather than a side step on a copied batch, so training itself is unchanged and
every strategy's own forward, backward, communication and optimizer code is what is measured.
It measures the second step of the run by default: the first one creates the optimizer state.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback

from lightning_dist.contract import contract_of
from lightning_dist.measure.step_memory import CATEGORIES, StepMemoryMeter

log = logging.getLogger(__name__)


class MemoryByCategory(Callback):
    """Measures optimizer step `step` of this fit (1-based) on every rank; rank 0 gets all."""

    def __init__(self, step: int = 2) -> None:
        if step < 1:
            raise ValueError(f"MemoryByCategory(step={step}) must be at least 1")
        self.step = step
        self.per_rank: list[dict[str, int]] | None = None
        self._target: int | None = None  # global_step at the start of the measured step
        self._meter: StepMemoryMeter | None = None
        self._mine: dict[str, int] | None = None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        # Fewer steps than `step` (or a resumed run near its end): measure the last one.
        last = max(trainer.max_steps - 1, trainer.global_step) if trainer.max_steps > 0 else None
        self._target = trainer.global_step + self.step - 1
        if last is not None:
            self._target = min(self._target, last)

    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._meter is None and self._mine is None and trainer.global_step == self._target:
            pipelined = contract_of(trainer.strategy).pipelined
            # Module hooks (torch's MemTracker) refuse a module run twice in one step, as
            # pipeline microbatches and gradient accumulation do.
            repeated = pipelined or trainer.accumulate_grad_batches > 1
            self._meter = StepMemoryMeter(
                trainer.strategy.root_device, closure_step=True, module_hooks=not repeated
            )
            try:
                self._meter.start(trainer.strategy.model, trainer.optimizers)
            except Exception as e:  # the measurement must never cost the run
                log.warning("Memory by category is not measured: %s", e)
                self._meter, self._mine = None, {}

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if self._meter is not None:  # Lightning runs forward and backward inside step(closure)
            self._meter.optimizer_step_begins()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs, batch, batch_idx) -> None:
        if self._meter is not None and trainer.global_step > self._target:
            meter, self._meter = self._meter, None
            try:
                self._mine = meter.stop()
            except Exception as e:
                log.warning("Memory by category is not measured: %s", e)
                self._mine = {}

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self._meter is not None:  # training stopped inside the measured step
            self.on_train_batch_end(trainer, pl_module, None, None, 0)
        mine = self._mine or {}
        row = torch.tensor([mine.get(k, -1) for k in CATEGORIES], dtype=torch.float64)
        gathered = trainer.strategy.all_gather(row.to(trainer.strategy.root_device))
        rows = gathered.reshape(-1, len(CATEGORIES)).cpu().tolist()
        self.per_rank = [
            {k: int(v) for k, v in zip(CATEGORIES, r, strict=True)} if r[0] >= 0 else None
            for r in rows
        ]

    def summary(self, world_size: int) -> dict[str, Any]:
        """`memory_by_category`: per rank, bytes of params, grads, optimizer, activations,
        temps and the step's peak (total); null for a rank that measured nothing."""
        return {"memory_by_category": self.per_rank}
