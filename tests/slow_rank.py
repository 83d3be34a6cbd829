"""A test-only callback that makes one rank slow, to check the straggler monitor names it."""

import time

import torch.distributed as dist
from lightning.pytorch.callbacks import Callback


class SlowRank(Callback):
    def __init__(self, rank: int = 1, seconds: float = 0.05, from_step: int = 0) -> None:
        self.rank = rank
        self.seconds = seconds
        self.from_step = from_step  # steps before this one run at full speed

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step < self.from_step:
            return
        if dist.is_initialized() and dist.get_rank() == self.rank:
            time.sleep(self.seconds)
