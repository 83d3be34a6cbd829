"""`strategy=ddp`: Lightning's DDPStrategy, declaring the contract (every rank a replica)."""

from __future__ import annotations

from lightning.pytorch.strategies import DDPStrategy

from lightning_dist.strategies.base import LightningDistStrategy


class DataParallelStrategy(LightningDistStrategy, DDPStrategy):
    """DDP: each rank holds the whole model and reads its own slice of the global batch.

    The contract's defaults describe it exactly (layout dp_replicate = world size, planner
    sharding NO_SHARD); this class only adds them to Lightning's DDPStrategy.
    """
