"""`strategy=fsdp2` / `Trainer(strategy="fsdp2")`: per-parameter sharding with FSDP2.

A preset of `Parallel3DStrategy` with tp = pp = 1: the same mesh (built from a `Layout`), the
same `apply_fsdp` call, mixed-precision policy, `init_sharded` meaning and gradient clipping, so
every FSDP2 fix is made once. What the preset adds is the data-parallel shape: `dp_replicate`
replica groups (HSDP), one per node by default, each sharding over the rest of the ranks.
A LightningModule that builds its layers in `__init__` (no `configure_model`) is sharded child
by child in `setup()`.
"""

from __future__ import annotations

from datetime import timedelta

from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from torch import nn

from lightning_dist.layout import Layout
from lightning_dist.strategies.parallel3d import Parallel3DStrategy


class FSDP2Strategy(Parallel3DStrategy):
    """FSDP2 (`fully_shard` on every block and the root) over a 1-D or 2-D data-parallel mesh.

    Args:
        dp_replicate: replica groups (HSDP); None means one per node. The shard group size is
            the world size divided by it.
        reshard_after_forward: True (free gathered weights after forward), False (keep them
            until backward) or an int (reshard to groups of that size).
        prefetch_forward / prefetch_backward: blocks whose all-gather is issued ahead.
        param_dtype / reduce_dtype: MixedPrecisionPolicy; param_dtype None follows the
            Trainer's precision on GPUs and stays fp32 on CPUs.
        cpu_offload: CPUOffloadPolicy (the optimizer step then runs on the CPU).
        activation_checkpointing: 0 off; n checkpoints every n-th block; 'full' every block;
            'op' / 'selective' saves matmul outputs and recomputes the pointwise ops.
        compile / compile_backend: torch.compile each block (after checkpointing, before FSDP).
        auto_wrap: block classes (or names) to shard one by one; None detects them.
        state_dict_type: "sharded" (torch.distributed.checkpoint folder) or "full" (one file).
        init_sharded: each rank allocates and initialises only its own shards (weights then
            differ from a single process's). Default: materialise whole, then shard.
    """

    strategy_name = "fsdp2"

    def __init__(
        self,
        *,
        dp_replicate: int | None = None,
        reshard_after_forward: bool | int = True,
        prefetch_forward: int = 1,
        prefetch_backward: int = 1,
        param_dtype: str | None = None,
        reduce_dtype: str | None = "fp32",
        cpu_offload: bool = False,
        activation_checkpointing: int | str = 0,
        compile: bool = False,
        compile_backend: str = "inductor",
        auto_wrap: list[str | type[nn.Module]] | None = None,
        state_dict_type: str = "sharded",
        init_sharded: bool = False,
        async_save: bool = False,
        process_group_backend: str | None = None,
        timeout: timedelta | None = default_pg_timeout,
    ) -> None:
        if dp_replicate is not None and (not isinstance(dp_replicate, int) or dp_replicate < 1):
            raise ValueError(f"strategy.dp_replicate={dp_replicate!r} must be a positive integer")
        super().__init__(
            dp_shard=-1, dp_replicate=dp_replicate or 1, reshard_after_forward=reshard_after_forward,
            prefetch_forward=prefetch_forward, prefetch_backward=prefetch_backward,
            param_dtype=param_dtype, reduce_dtype=reduce_dtype, cpu_offload=cpu_offload,
            activation_checkpointing=activation_checkpointing, compile=compile,
            compile_backend=compile_backend, auto_wrap=auto_wrap,
            state_dict_type=state_dict_type, init_sharded=init_sharded, async_save=async_save,
            process_group_backend=process_group_backend, timeout=timeout,
        )  # fmt: skip
        self.dp_replicate = dp_replicate

    def declared_layout(self, num_nodes: int) -> Layout:
        """Replica groups (one per node unless `dp_replicate` says otherwise) x the rest."""
        return Layout(dp_replicate=self.dp_replicate or num_nodes, dp_shard=-1)

    def layout_for(self, devices: int, num_nodes: int) -> Layout:
        world = devices * num_nodes
        replicas = self.dp_replicate or num_nodes
        if world % replicas:
            raise ValueError(
                f"strategy.dp_replicate={replicas} does not divide the world size {world}"
            )
        return super().layout_for(devices, num_nodes)

    @classmethod
    def register_strategies(cls, strategy_registry) -> None:
        strategy_registry.register("fsdp2", cls, description="FSDP2 / HSDP (lightning_dist)")
