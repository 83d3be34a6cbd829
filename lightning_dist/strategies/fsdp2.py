"""`strategy=fsdp2` / `Trainer(strategy="fsdp2")`: per-parameter sharding with FSDP2.

A thin layer over Lightning's ModelParallelStrategy, which already brings the process group,
DTensor-aware checkpointing (sharded through torch.distributed.checkpoint, or full) and the
launcher. We replace its (data, tensor) mesh with a data-parallel one, 1-D for FSDP or 2-D
(dp_replicate, dp_shard) for HSDP, and shard with `lightning_dist.parallel.fsdp.apply_fsdp`.

Gradient clipping needs nothing special: FSDP2 gradients are DTensors, and
`torch.nn.utils.clip_grad_norm_` (Lightning's default path) reduces their norms over the mesh,
so the clipped norm is the global one.
"""

from __future__ import annotations

from datetime import timedelta

import torch
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.pytorch.strategies import ModelParallelStrategy
from lightning.pytorch.trainer.states import TrainerFn
from torch import nn

from lightning_dist.layout import Layout
from lightning_dist.parallel.activation_checkpoint import apply_activation_checkpointing
from lightning_dist.parallel.fsdp import apply_fsdp, check_reshard, parse_dtype
from lightning_dist.strategies import sharding


class FSDP2Strategy(ModelParallelStrategy):
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
        activation_checkpointing: 0 off; n checkpoints every n-th block.
        auto_wrap: block classes (or names) to shard one by one; None detects them.
        state_dict_type: "sharded" (torch.distributed.checkpoint folder) or "full" (one file).
        init_sharded: initialise after sharding (no rank holds the whole model; weights then
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
        activation_checkpointing: int = 0,
        auto_wrap: list[str | type[nn.Module]] | None = None,
        state_dict_type: str = "sharded",
        init_sharded: bool = False,
        process_group_backend: str | None = None,
        timeout: timedelta | None = default_pg_timeout,
    ) -> None:
        _check_knobs(dp_replicate, reshard_after_forward, prefetch_forward, prefetch_backward)
        parse_dtype(param_dtype, "strategy.param_dtype")
        parse_dtype(reduce_dtype, "strategy.reduce_dtype")
        sharded = sharding.check_state_dict_type(state_dict_type) == "sharded"
        super().__init__(
            save_distributed_checkpoint=sharded,
            process_group_backend=process_group_backend,
            timeout=timeout,
        )
        self.dp_replicate = dp_replicate
        self.reshard_after_forward = reshard_after_forward
        self.prefetch_forward, self.prefetch_backward = prefetch_forward, prefetch_backward
        self.param_dtype, self.reduce_dtype = param_dtype, reduce_dtype
        self.cpu_offload = cpu_offload
        self.activation_checkpointing = sharding.check_activation_checkpointing(
            activation_checkpointing
        )
        self.auto_wrap = None if auto_wrap is None else list(auto_wrap)
        self.state_dict_type = state_dict_type
        self.init_sharded = init_sharded

    # --- the layout and the checks that need the run ------------------------------------------

    @property
    def replicas(self) -> int:
        return self.dp_replicate or self.num_nodes

    @property
    def layout(self) -> Layout:
        """Data-parallel degrees: replicas x shards (shards: the remaining ranks)."""
        return Layout(dp_replicate=self.replicas, dp_shard=-1)

    def check_run(self, *, devices: int, num_nodes: int, precision: str, accelerator: str,
                  model: nn.Module | None = None, **batch) -> None:  # fmt: skip
        """Validate against the run before any process starts; raises ValueError.

        Records `num_nodes` (Lightning sets the same value later) so `layout` is right now.
        The batch sizes (`global_batch_size`, `micro_batch_size`) constrain nothing here.
        """
        self.num_nodes = num_nodes
        self._check_world(devices * num_nodes)
        sharding.check_param_dtype(self.param_dtype, precision)
        if model is not None:
            sharding.check_auto_wrap(model, self.auto_wrap)

    def _check_world(self, world_size: int) -> None:
        if world_size % self.replicas:
            raise ValueError(
                f"strategy.dp_replicate={self.replicas} does not divide the world size {world_size}"
            )
        shard = world_size // self.replicas
        if not isinstance(self.reshard_after_forward, bool):
            check_reshard(self.reshard_after_forward, shard)

    # --- Lightning hooks ---------------------------------------------------------------------

    @property
    def distributed_sampler_kwargs(self) -> dict[str, int]:
        # Every rank is a data-parallel rank: HSDP's replicas and shards all read different data.
        return {"num_replicas": self.world_size, "rank": self.global_rank}

    def setup_environment(self) -> None:
        from torch.distributed.device_mesh import init_device_mesh

        self._setup_distributed()
        self._check_world(self.world_size)
        sharding.check_param_dtype(self.param_dtype, self.precision_plugin.precision)
        shard = self.world_size // self.replicas
        if self.replicas > 1:
            shape, names = (self.replicas, shard), ("dp_replicate", "dp_shard")
        else:
            shape, names = (shard,), ("dp_shard",)
        self._device_mesh = init_device_mesh(self.root_device.type, shape, mesh_dim_names=names)
        self.lightning_module._device_mesh = self._device_mesh

    def parallelize_model(self, model: nn.Module, *, init_seed: int) -> nn.Module:
        """CausalLM's hook: materialise (single-process weights), checkpoint, shard."""
        from lightning_dist.models.materialize import materialize

        block_types = sharding.check_auto_wrap(model, self.auto_wrap)
        if not self.init_sharded:
            model = materialize(model, self.root_device, init_seed)
        apply_activation_checkpointing(model, block_types, every_n=self.activation_checkpointing)
        self.shard(model, block_types)
        if self.init_sharded:
            model = materialize(model, self.root_device, init_seed)
        return model

    def shard(self, model: nn.Module, block_types=None) -> nn.Module:
        """`apply_fsdp` with this strategy's settings, on its mesh."""
        return apply_fsdp(
            model, self.device_mesh,
            reshard_after_forward=self.reshard_after_forward, mp_policy=self._mp_policy(),
            offload_policy=self._offload_policy(), prefetch_forward=self.prefetch_forward,
            prefetch_backward=self.prefetch_backward, block_types=block_types,
        )  # fmt: skip

    def _mp_policy(self):
        from torch.distributed.fsdp import MixedPrecisionPolicy

        precision = self.precision_plugin.precision
        compute = sharding.compute_dtype(self.param_dtype, precision, self.root_device.type)
        reduce = parse_dtype(self.reduce_dtype, "strategy.reduce_dtype") or compute
        if compute == reduce == torch.float32:
            return None
        return MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=reduce)

    def _offload_policy(self):
        from torch.distributed.fsdp import CPUOffloadPolicy

        # Pinned host memory needs CUDA; on a CPU-only machine plain memory does the same job.
        return CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if self.cpu_offload else None

    def setup(self, trainer) -> None:
        """ModelParallelStrategy.setup, minus its demand for `configure_model`: a module that
        did not shard itself gets `apply_fsdp` on each child that holds parameters."""
        from torch.distributed.fsdp import FSDPModule

        self.accelerator.setup(trainer)
        if not any(isinstance(m, FSDPModule) for m in self.model.modules()):
            self._shard_plain_module(self.model)
        sharding.move_metrics(self.model, self.root_device)
        self.model = self.precision_plugin.convert_module(self.model)
        self.barrier()
        if trainer.state.fn == TrainerFn.FITTING:
            self.setup_optimizers(trainer)
        self.setup_precision_plugin()

    def model_to_device(self) -> None:
        # Parameters are placed by sharding (and stay on the CPU under offload).
        pass

    def _shard_plain_module(self, module: nn.Module) -> None:
        own = [name for name, _ in module.named_parameters(recurse=False)]
        if own:
            raise ValueError(
                f"strategy=fsdp2 cannot shard parameters held by the LightningModule itself "
                f"({', '.join(own)}); move them into a submodule, or shard in configure_model()"
            )
        module.to(self.root_device)
        block_types = sharding.check_auto_wrap(module, self.auto_wrap)
        for child in module.children():
            # Containers have no forward of their own to hook, so their members are the units.
            is_container = isinstance(child, (nn.ModuleList, nn.ModuleDict))
            for unit in child.children() if is_container else [child]:
                if any(True for _ in unit.parameters()):
                    apply_activation_checkpointing(
                        unit, block_types, every_n=self.activation_checkpointing
                    )
                    self.shard(unit, block_types)

    @classmethod
    def register_strategies(cls, strategy_registry) -> None:
        strategy_registry.register("fsdp2", cls, description="FSDP2 / HSDP (lightning_dist)")


def _check_knobs(dp_replicate, reshard_after_forward, prefetch_forward, prefetch_backward) -> None:
    if dp_replicate is not None and (not isinstance(dp_replicate, int) or dp_replicate < 1):
        raise ValueError(f"strategy.dp_replicate={dp_replicate!r} must be a positive integer")
    check_reshard(reshard_after_forward, None)  # the shard group size is checked with the run
    for name, value in (("prefetch_forward", prefetch_forward),
                        ("prefetch_backward", prefetch_backward)):  # fmt: skip
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"strategy.{name}={value!r} must be 0 or a number of blocks")
