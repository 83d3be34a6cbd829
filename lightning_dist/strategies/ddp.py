"""`strategy=ddp`: Lightning's DDPStrategy, declaring the contract (every rank a replica)."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.strategies import DDPStrategy

from lightning_dist.strategies.base import LightningDistStrategy


class DataParallelStrategy(LightningDistStrategy, DDPStrategy):
    """DDP: each rank holds the whole model and reads its own slice of the global batch.

    The contract's defaults describe it exactly (layout dp_replicate = world size, planner
    sharding NO_SHARD); this class adds them to Lightning's DDPStrategy, and per-block
    compilation (`compile`, `compile_backend`) before DDP wraps the model.
    """

    def __init__(
        self, *, compile: bool = False, compile_backend: str = "inductor", **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self._set_compile(compile, compile_backend)
