"""`strategy=3d` / `Trainer(strategy="parallel3d")`: data x context x tensor x pipeline
parallelism, and expert parallelism for a mixture of experts.

The `3d` preset of the one mesh adapter (`strategies/mesh.py`, which forwards Lightning's hooks
to the Lightning-free `lightning_dist.mesh.MeshRuntime`): the mesh of a `Layout` (pp,
dp_replicate, dp_shard, cp, tp; tp innermost so it stays in a node), FSDP over dp_shard x cp,
`ep` ranks borrowed from dp_shard for a mixture of experts; `parallelize_model(model,
init_seed=...)` for the LightningModule's `configure_model()`; the pipeline schedule inside the
module's step; clipping by the global norm; the data sampler over the data-parallel ranks only;
checkpoints in the one format of every strategy. `strategy=tp` and `strategy=pp` are this class
with other defaults in their YAML; `strategy=fsdp2` and `strategy=ft_hsdp` are its subclasses.
"""

from __future__ import annotations

from typing import Any

from lightning_dist.runtime.console import print_line
from lightning_dist.runtime.strategy_names import deprecation_line, register_strategies
from lightning_dist.strategies.mesh import MeshStrategy


class Parallel3DStrategy(MeshStrategy):
    """Data (FSDP2/HSDP) x context x tensor x pipeline parallelism for any LightningModule.

    Every knob is a keyword argument named as in `conf/strategy/3d.yaml` (`tp=2`,
    `activation_checkpointing="op"`, `prefetch_forward=2`, ...): the option classes of
    `lightning_dist.options` declare and document each one (`MESH_GROUPS`), and the
    `PRESETS` entry of the class gives its defaults. Alternatively pass a built
    `options=StrategyOptions(...)`. Besides the knobs:

    Args:
        async_save: write checkpoints in the background (see `checkpoint.async_saves`).
        timeout: the process group's collective timeout.
    """

    strategy_name = "3d"
    preset = "3d"

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        strategy_registry.register(
            "3d", cls, description="data x tensor x pipeline parallelism (lightning_dist)"
        )
        strategy_registry.register(
            "parallel3d", _deprecated_parallel3d, description="deprecated name of '3d'"
        )


def _deprecated_parallel3d(**kwargs: Any) -> Parallel3DStrategy:
    """`Trainer(strategy="parallel3d")`, the old registry name: one deprecation line, then '3d'."""
    print_line(deprecation_line("parallel3d"))
    return Parallel3DStrategy(**kwargs)


register_strategies()  # this module's names too, when it was the first to import Lightning
