"""GarbageCollection: automatic collection off during training, a collection every n optimizer
steps on a real Lightning fit, and Python's own settings back after the fit or an error."""

from __future__ import annotations

import gc
import weakref

import lightning as L
import pytest
import torch
from torch import nn

from lightning_dist.callbacks.gc_control import GarbageCollection


class Cycles(L.LightningModule):
    """Makes a reference cycle in each micro-batch (freed only by the cyclic collector) and
    records, per optimizer step, whether the first cycle still lives and whether gc is on."""

    def __init__(self, fail_at: int | None = None) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)
        self.fail_at = fail_at
        self.first_cycle: weakref.ref | None = None
        self.alive: list[bool] = []
        self.gc_enabled: list[bool] = []

    def training_step(self, batch, batch_idx):
        node: dict = {}
        node["self"] = node  # a cycle: reference counting never frees it
        holder = type("Holder", (), {})()
        holder.node = node
        node["holder"] = holder
        if self.first_cycle is None:
            self.first_cycle = weakref.ref(holder)
        self.gc_enabled.append(gc.isenabled())
        if self.fail_at is not None and self.global_step == self.fail_at:
            raise RuntimeError("boom")
        return self.layer(batch[0]).pow(2).mean()

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        if (batch_idx + 1) % self.trainer.accumulate_grad_batches == 0:
            self.alive.append(self.first_cycle() is not None)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(module: L.LightningModule, callback: GarbageCollection, steps: int) -> None:
    data = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randn(64, 4)), batch_size=2
    )
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        accumulate_grad_batches=2,
        callbacks=[callback],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, data)


def test_collections_run_every_n_steps_and_python_gc_is_restored():
    assert gc.isenabled() and gc.get_freeze_count() == 0
    module, callback = Cycles(), GarbageCollection(every_n_steps=3)
    _fit(module, callback, steps=7)
    assert not any(module.gc_enabled)  # automatic collection off in every micro-batch
    assert callback.collections == 2  # after optimizer steps 3 and 6, not per micro-batch
    # The first step's cycle outlives steps 1 and 2 and is gone from the step-3 collection on.
    assert module.alive == [True, True, False, False, False, False, False]
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_an_error_in_training_restores_python_gc():
    module, callback = Cycles(fail_at=2), GarbageCollection(every_n_steps=5)
    with pytest.raises(RuntimeError, match="boom"):
        _fit(module, callback, steps=6)
    assert gc.isenabled() and gc.get_freeze_count() == 0


@pytest.mark.parametrize("value", [0, -3, 2.5, True])
def test_a_bad_interval_names_the_setting(value):
    with pytest.raises(ValueError, match=r"trainer\.gc_every_n_steps="):
        GarbageCollection(every_n_steps=value)
