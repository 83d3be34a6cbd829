"""`strategy=ddp`: Lightning's DDPStrategy, declaring the contract (every rank a replica)."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.strategies import DDPStrategy

from lightning_dist.options import StrategyOptions
from lightning_dist.strategies.base import LightningDistStrategy, build_options


class DataParallelStrategy(LightningDistStrategy, DDPStrategy):
    """DDP: each rank holds the whole model and reads its own slice of the global batch.

    The contract's defaults describe it exactly (layout dp_replicate = world size, planner
    sharding NO_SHARD); this class adds them to Lightning's DDPStrategy, and per-block
    compilation before DDP wraps the model. Its knobs are those of `options.PRESETS["ddp"]`
    (`find_unused_parameters`, `compile`, ...), with their defaults also from Python:
    `gradient_as_bucket_view=True` and `broadcast_buffers=False` (our buffers never change;
    pass `broadcast_buffers=True` for a model whose buffers do, such as BatchNorm's). Other
    keyword arguments go to Lightning.
    """

    preset = "ddp"

    def __init__(self, *, options: StrategyOptions | None = None, **kwargs: Any) -> None:
        self.options, rest = build_options(type(self), self.preset, options, kwargs)
        ddp = self.options.ddp
        super().__init__(
            process_group_backend=self.options.process.process_group_backend,
            find_unused_parameters=ddp.find_unused_parameters,
            gradient_as_bucket_view=ddp.gradient_as_bucket_view,
            static_graph=ddp.static_graph,
            broadcast_buffers=ddp.broadcast_buffers,
            **rest,
        )
        self.check_machine_options()
