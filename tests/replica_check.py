"""A test-only callback: whether the data-parallel replicas hold the same parameters after
given optimizer steps (DiLoCo's syncs), and differ after others (its local inner steps)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback


class ReplicaParameters(Callback):
    """Raises AssertionError on every rank when the replicas' parameters (a float64 sum and a
    position-weighted sum over every element) differ after a step of `agree_at`, or agree
    after a step of `differ_at` (1-based optimizer steps)."""

    def __init__(self, agree_at: list[int], differ_at: list[int]) -> None:
        self.agree_at, self.differ_at = set(agree_at), set(differ_at)
        self._step = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step == self._step or step not in self.agree_at | self.differ_at:
            return
        self._step = step
        flat = torch.cat([p.detach().flatten().double() for p in pl_module.parameters()])
        mine = torch.stack([flat.sum(), (flat * torch.arange(flat.numel())).sum()])
        every = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(every, mine)
        same = all(torch.equal(every[0], other) for other in every[1:])
        if same != (step in self.agree_at):
            raise AssertionError(
                f"after step {step} the replicas' parameters {'agree' if same else 'differ'}: "
                f"{[v.tolist() for v in every]}"
            )
