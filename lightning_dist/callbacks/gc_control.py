"""GarbageCollection: Python's cyclic collector runs between steps, at a fixed interval.

A training process holds millions of long-lived Python objects (torch, Lightning, Hydra, the
logger); each automatic full collection walks all of them, at a moment set by allocation
counts, which falls inside a step, on one rank at a time, so the other ranks wait for it at the
next collective. At the start of training the objects that exist then are collected once and
frozen (`gc.freeze`: never scanned again), automatic collection is switched off, and every
`every_n_steps` optimizer steps the young generations are collected on every rank at the same
point, after the optimizer step. At the end of training (or on an error) everything is restored.
Objects that are not in a reference cycle are freed at once by reference counting either way.
"""

from __future__ import annotations

import gc
from typing import Any

from lightning.pytorch.callbacks import Callback


class GarbageCollection(Callback):
    """Collect every `every_n_steps` optimizer steps instead of whenever Python decides."""

    def __init__(self, every_n_steps: int = 50) -> None:
        if not isinstance(every_n_steps, int) or isinstance(every_n_steps, bool):
            raise ValueError(f"trainer.gc_every_n_steps={every_n_steps!r} must be an integer")
        if every_n_steps < 1:
            raise ValueError(
                f"trainer.gc_every_n_steps={every_n_steps} must be at least 1 "
                "(0 leaves Python's automatic collection on)"
            )
        self.every_n_steps = every_n_steps
        self.collections = 0
        """Collections this callback ran during training."""
        self._was_enabled: bool | None = None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._was_enabled = gc.isenabled()
        gc.collect()
        gc.freeze()
        gc.disable()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if (batch_idx + 1) % trainer.accumulate_grad_batches:
            return  # not an optimizer-step boundary
        if trainer.global_step % self.every_n_steps == 0:
            gc.collect(1)
            self.collections += 1

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._restore()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._restore()

    def _restore(self) -> None:
        if self._was_enabled is None:
            return
        gc.unfreeze()
        if self._was_enabled:
            gc.enable()
        self._was_enabled = None
