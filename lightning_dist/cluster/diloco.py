"""DiLoCo (Douillard et al. 2023): data-parallel replicas that talk once every H steps.

Each replica takes H inner optimizer steps (AdamW, our module's) on its own gradients, with no
all-reduce (DDP runs a hook that keeps them local, `cluster/grad_sync.py`). Then the replicas
average their "pseudo-gradient", the change of their parameters since the last sync
(anchor - current), in one all-reduce, and an outer SGD with Nesterov momentum (DiLoCo's lr 0.7,
momentum 0.9) moves the anchor, which every replica copies back into its parameters. With
outer lr 1 and no momentum that is plain parameter averaging (LocalSGD). The inner optimizer
states stay each replica's own, as in the paper.

Ours rather than torchft's `DiLoCo` (which needs a torchft Manager and a Lighthouse to form a
quorum before each sync) or torch's `PeriodicModelAverager` (parameter averaging only, no outer
optimizer): it is one all-reduce and one SGD step over a copy of the parameters, and runs on any
process group. Plain torch.distributed, no Lightning.
"""

from __future__ import annotations

import logging
import time

import torch
import torch.distributed as dist
from torch import nn

log = logging.getLogger(__name__)


class DiLoCo:
    """The outer loop over `params` (this replica's parameters, the same on every replica at
    construction, which takes them as the anchor: make it once the weights a run starts from
    are in place, after a checkpoint's restore): call `after_inner_step(step)` after every
    optimizer step."""

    def __init__(
        self,
        params: list[nn.Parameter],
        *,
        inner_steps: int,
        outer_lr: float = 0.7,
        outer_momentum: float = 0.9,
        group=None,
        delay_s: float = 0.0,
    ) -> None:
        if inner_steps < 1:
            raise ValueError(f"strategy.diloco_inner_steps={inner_steps} must be at least 1")
        self.params = [p for p in params if p.requires_grad]
        self.inner_steps = inner_steps
        self.group = group
        self.delay_s = delay_s
        # The anchor: the parameters of the last sync, in fp32 whatever the parameters' dtype.
        self.anchor = [p.detach().clone().float() for p in self.params]
        self.outer = torch.optim.SGD(
            self.anchor, lr=outer_lr, momentum=outer_momentum, nesterov=outer_momentum > 0
        )
        self.syncs = 0
        self.sync_seconds = 0.0
        """Time spent in the outer syncs (the all-reduce, its simulated delay, the outer step)."""

    def after_inner_step(self, step: int, *, last: bool = False) -> bool:
        """After optimizer step `step` (1-based, the run's count, so that a resumed run syncs
        at the steps the uninterrupted one would): sync the replicas at every multiple of
        `inner_steps` and at the `last` step. Returns whether it synced."""
        if step % self.inner_steps and not last:
            return False
        self.sync()
        return True

    @torch.no_grad()
    def sync(self) -> None:
        """Average the pseudo-gradients over the group (one all-reduce), take the outer step,
        and set every replica's parameters to the new anchor."""
        started = time.perf_counter()
        deltas = torch.cat(
            [(a - p.float()).flatten() for a, p in zip(self.anchor, self.params, strict=True)]
        )
        if self.delay_s > 0:
            time.sleep(self.delay_s)  # the simulated slow link (cluster/simulate.py)
        if dist.is_initialized():
            dist.all_reduce(deltas, group=self.group)
            deltas /= dist.get_world_size(self.group)
        offset = 0
        for anchor in self.anchor:
            anchor.grad = deltas[offset : offset + anchor.numel()].view_as(anchor)
            offset += anchor.numel()
        self.outer.step()
        for param, anchor in zip(self.params, self.anchor, strict=True):
            param.copy_(anchor)
            anchor.grad = None
        self.syncs += 1
        self.sync_seconds += time.perf_counter() - started
