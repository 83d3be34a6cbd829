"""`strategy=fsdp2` / `Trainer(strategy="fsdp2")`: per-parameter sharding with FSDP2.

A preset of `Parallel3DStrategy` (`options.PRESETS["fsdp2"]`): the same knobs, mesh,
`apply_fsdp` call, mixed-precision policy, `init_sharded` meaning and gradient clipping, so every
FSDP2 fix is made once. What the preset changes is the data-parallel shape by default:
`dp_replicate` replica groups (HSDP), one per node unless set, each sharding over the rest of
the ranks. A LightningModule that builds its layers in `__init__` (no `configure_model`) is
sharded child by child in `setup()`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout

from lightning_dist.layout import Layout
from lightning_dist.options import StrategyOptions
from lightning_dist.runtime.strategy_names import register_strategies
from lightning_dist.strategies.parallel3d import Parallel3DStrategy


class FSDP2Strategy(Parallel3DStrategy):
    """FSDP2 (`fully_shard` on every block and the root) over a 1-D or 2-D data-parallel mesh;
    `dp_replicate=None` (the default) means one replica group per node."""

    strategy_name = "fsdp2"
    preset = "fsdp2"

    def __init__(
        self,
        *,
        options: StrategyOptions | None = None,
        async_save: bool = False,
        timeout: timedelta | None = default_pg_timeout,
        **knobs: Any,
    ) -> None:
        replicas = knobs.get("dp_replicate")
        if replicas is not None and (
            isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1
        ):
            raise ValueError(f"strategy.dp_replicate={replicas!r} must be a positive integer")
        super().__init__(options=options, async_save=async_save, timeout=timeout, **knobs)

    def layout_for(self, devices: int, num_nodes: int) -> Layout:
        world = devices * num_nodes
        replicas = self.declared_layout(num_nodes).dp_replicate
        if world % replicas:
            raise ValueError(
                f"strategy.dp_replicate={replicas} does not divide the world size {world}"
            )
        return super().layout_for(devices, num_nodes)

    @classmethod
    def register_strategies(cls, strategy_registry) -> None:
        strategy_registry.register("fsdp2", cls, description="FSDP2 / HSDP (lightning_dist)")


register_strategies()  # this module's names too, when it was the first to import Lightning
