"""`strategy=fsdp` / `Trainer(strategy="fsdp_tuned")`: Lightning's FSDPStrategy (FSDP1) with the
tuned recipe as defaults and every knob a typed argument.

What it changes on top of Lightning's class:

- defaults: SHARD_GRAD_OP (HYBRID_SHARD across nodes), limit_all_gathers, forward and backward
  prefetch, bf16 parameters with fp32 reductions and buffers on GPUs, sharded checkpoints;
- auto-wrap on the model's transformer block class, found automatically;
- HYBRID_SHARD with a settable shard group size, on a DeviceMesh of this run's device type;
- runs on CPUs (FSDP1 needs `device_id=cpu` there), so everything is testable with gloo;
- gradient clipping by norm computes the global norm through the root FSDP module, where
  Lightning's FSDP precision plugin refuses.

It stays a subclass of Lightning's FSDPStrategy rather than a preset of the mesh adapter
(`strategies/mesh.py`): FSDP1 wraps the whole LightningModule in one flat-parameter module,
with its own precision plugin, state-dict types and checkpoint wrapping, all of which
Lightning's class implements; the mesh runtime applies FSDP2 (`fully_shard`) only.
"""

from __future__ import annotations

from datetime import timedelta

import lightning.pytorch as pl
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.pytorch.plugins.precision.fsdp import FSDPPrecision
from lightning.pytorch.strategies import FSDPStrategy
from torch import nn
from typing_extensions import override

from lightning_dist._compat import ModelSetupHook, stored_precision_plugin
from lightning_dist.layout import Layout, batch_plan
from lightning_dist.options import FSDP1_HYBRID, PRESETS, StrategyOptions, group_knobs
from lightning_dist.parallel.activation_checkpoint import apply_activation_checkpointing
from lightning_dist.parallel.compile import apply_compile
from lightning_dist.parallel.precision import check_param_dtype, mixed_dtypes
from lightning_dist.runtime.strategy_names import register_strategies
from lightning_dist.strategies import sharding
from lightning_dist.strategies.base import LightningDistStrategy, build_options

HYBRID = FSDP1_HYBRID
LIGHTNING_ARGUMENTS = {
    "accelerator",
    "parallel_devices",
    "cluster_environment",
    "checkpoint_io",
    "precision_plugin",
}
"""Lightning's own FSDPStrategy arguments this class passes on (besides `timeout`)."""


class GlobalNormFSDPPrecision(FSDPPrecision):
    """FSDPPrecision that clips by the global gradient norm via the root FSDP module.

    `torch.nn.utils.clip_grad_norm_` would only see this rank's shards; FSDP1's own
    `clip_grad_norm_` all-reduces the shard norms first.
    """

    def __init__(self, precision: str, scaler=None, *, strategy: FSDPStrategy) -> None:
        super().__init__(precision, scaler)
        self._strategy = strategy

    @override
    def clip_grad_by_norm(self, optimizer, clip_val) -> None:
        self._strategy.model.clip_grad_norm_(clip_val)


class TunedFSDPStrategy(LightningDistStrategy, ModelSetupHook, FSDPStrategy):
    """FSDP1 with the tuned recipe (see docs/FSDP.md).

    Its knobs are keyword arguments named as in `conf/strategy/fsdp.yaml`, declared and
    documented once in `lightning_dist.options` (`PRESETS["fsdp"]`: `FSDP1Options`,
    `ShardingOptions`, `PrecisionOptions`, activation checkpointing, compile, the process group
    and the checkpoint format); or pass a built `options=StrategyOptions(...)`. Other keyword
    arguments (accelerator, parallel_devices, ...) go to Lightning's FSDPStrategy.

    Why a subclass of Lightning's FSDPStrategy and not a preset of the mesh strategy: FSDP1
    (FullyShardedDataParallel, flat parameters, `limit_all_gathers`, backward prefetch) is a
    different wrapper from FSDP2's DTensor sharding that the mesh strategy applies; Lightning's
    FSDPStrategy already drives it, so the subclass adds the tuned recipe and nothing else.
    """

    strategy_name = "fsdp_tuned"
    preset = "fsdp"

    def __init__(
        self,
        *,
        options: StrategyOptions | None = None,
        timeout: timedelta | None = default_pg_timeout,
        **kwargs,
    ) -> None:
        from torch.distributed.fsdp import BackwardPrefetch

        self.options, rest = build_options(type(self), self.preset, options, kwargs)
        unknown = sorted(set(rest) - LIGHTNING_ARGUMENTS)
        if unknown:  # Lightning would hand them to FullyShardedDataParallel at wrap time
            raise TypeError(
                f"{type(self).__name__} has no knob {unknown[0]!r}; its knobs are: "
                + ", ".join(f.name for g in PRESETS["fsdp"].groups for f in group_knobs(g))
            )
        fsdp1 = self.options.fsdp1
        prefetch = fsdp1.backward_prefetch
        super().__init__(
            process_group_backend=self.options.process.process_group_backend,
            timeout=timeout,
            cpu_offload=self.options.sharding.cpu_offload,
            state_dict_type=self.options.checkpoint_format.state_dict_type,
            limit_all_gathers=fsdp1.limit_all_gathers,
            forward_prefetch=fsdp1.forward_prefetch,
            backward_prefetch=BackwardPrefetch[prefetch] if prefetch else None,
            use_orig_params=fsdp1.use_orig_params,
            sync_module_states=fsdp1.sync_module_states,
            **rest,
        )
        self.check_machine_options()
        self.sharding_strategy = _sharding_enum(self.resolved_sharding())

    # --- the contract: layout and checks ------------------------------------------------------

    def resolved_sharding(self, num_nodes: int | None = None) -> str:
        """The sharding strategy on `num_nodes` nodes (default: this run's)."""
        return self.options.fsdp1.resolved_sharding(
            self.num_nodes if num_nodes is None else num_nodes
        )

    def declared_layout(self, num_nodes: int) -> Layout:
        """Data-parallel degrees: sharded over all ranks, or replicate x shard when hybrid."""
        name = self.resolved_sharding(num_nodes)
        if name == "NO_SHARD":
            return Layout(dp_replicate=-1)
        if name in HYBRID:
            if self.options.fsdp1.hybrid_shard_size is not None:
                return Layout(dp_replicate=-1, dp_shard=self.options.fsdp1.hybrid_shard_size)
            return Layout(dp_replicate=num_nodes, dp_shard=-1)
        return Layout(dp_shard=-1)

    def layout_for(self, devices: int, num_nodes: int) -> Layout:
        self._check_world(devices * num_nodes, devices, num_nodes)
        return super().layout_for(devices, num_nodes)

    def check_run(
        self,
        *,
        devices: int,
        num_nodes: int,
        precision: str,
        accelerator: str,
        model: nn.Module | None = None,
        global_batch_size: int | None = None,
        micro_batch_size: int | None = None,
    ) -> None:
        """Validate against the run before any process starts; raises ValueError."""
        layout = self.layout_for(devices, num_nodes)
        check_param_dtype(self.options.precision.param_dtype, precision)
        if self.cpu_offload.offload_params and accelerator == "cpu":
            raise ValueError(
                "strategy.cpu_offload=true cannot run on hardware.accelerator=cpu: FSDP1 offloads "
                "to pinned host memory, which needs a GPU; drop cpu_offload on CPUs"
            )
        if global_batch_size is not None:
            _, accumulate = batch_plan(global_batch_size, layout.dp, micro_batch_size)
            self._check_offload_accumulation(accumulate)
        if model is not None:
            sharding.check_auto_wrap(model, self.options.sharding.auto_wrap)

    def _check_world(self, world_size: int, devices_per_node: int, num_nodes: int) -> None:
        if self.resolved_sharding(num_nodes) not in HYBRID:
            return
        size = self.options.fsdp1.hybrid_shard_size or devices_per_node
        if world_size % size:
            divisors = [d for d in range(1, world_size + 1) if world_size % d == 0]
            raise ValueError(
                f"strategy.hybrid_shard_size={size} does not divide the world size {world_size}; "
                f"use one of {', '.join(map(str, divisors))}"
            )

    # --- Lightning hooks ---------------------------------------------------------------------

    @property
    def precision_plugin(self) -> FSDPPrecision:
        plugin = stored_precision_plugin(self)
        return plugin if plugin is not None else GlobalNormFSDPPrecision("32-true", strategy=self)

    @precision_plugin.setter
    def precision_plugin(self, plugin) -> None:
        if plugin is not None and type(plugin) is FSDPPrecision:
            plugin = GlobalNormFSDPPrecision(plugin.precision, plugin.scaler, strategy=self)
        FSDPStrategy.precision_plugin.fset(self, plugin)

    @property
    def mixed_precision_config(self):
        """FSDP1 MixedPrecision: None (fp32) unless a lower compute dtype applies (GPUs)."""
        from torch.distributed.fsdp import MixedPrecision

        dtypes = mixed_dtypes(
            param_dtype=self.options.precision.param_dtype,
            reduce_dtype=self.options.precision.reduce_dtype,
            buffer_dtype=self.options.fsdp1.buffer_dtype,
            precision=self.precision_plugin.precision,
            device_type=self.root_device.type,
        )
        if dtypes is None:
            return None
        return MixedPrecision(
            param_dtype=dtypes.compute, reduce_dtype=dtypes.reduce, buffer_dtype=dtypes.buffer
        )

    @override
    def setup_environment(self) -> None:
        super().setup_environment()
        from torch.distributed.device_mesh import init_device_mesh

        self._check_world(self.world_size, self.num_processes, self.num_nodes)
        check_param_dtype(self.options.precision.param_dtype, self.precision_plugin.precision)
        self.sharding_strategy = _sharding_enum(self.resolved_sharding())
        if self.resolved_sharding() in HYBRID:
            shard = self.options.fsdp1.hybrid_shard_size or self.num_processes
            # Outer dimension replicates (across nodes), inner shards (within a node).
            self.kwargs["device_mesh"] = init_device_mesh(
                self.root_device.type,
                (self.world_size // shard, shard),
                mesh_dim_names=("dp_replicate", "dp_shard"),
            )

    def _check_offload_accumulation(self, accumulate: int) -> None:
        if self.cpu_offload.offload_params and accumulate > 1:
            raise ValueError(
                f"strategy.cpu_offload=true cannot accumulate gradients ({accumulate} micro-batches "
                "per step): FSDP1 overwrites offloaded gradients outside no_sync; make "
                "data.per_rank_batch_size the whole per-rank batch, or use strategy=fsdp2"
            )

    @override
    def setup(self, trainer: pl.Trainer) -> None:
        self._check_offload_accumulation(trainer.accumulate_grad_batches)
        super().setup(trainer)

    # parallelize_model: the contract's default (materialise whole). FSDP1 then shards it in
    # `setup()`. At scale one would initialise each unit after sharding (FSDP1's
    # `param_init_fn`) so no rank ever holds the whole model; the weights would then differ from
    # a single process's, so parity runs use this route.

    @override
    def wrap_model(self, model: nn.Module) -> nn.Module:
        from torch.distributed.fsdp import FullyShardedDataParallel
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        if any(isinstance(m, FullyShardedDataParallel) for m in model.modules()):
            return super().wrap_model(model)  # the user wrapped it in configure_model
        block_types = sharding.check_auto_wrap(model, self.options.sharding.auto_wrap)
        policy = ModuleWrapPolicy(set(block_types)) if block_types else None
        wrapped = FullyShardedDataParallel(
            module=model,
            auto_wrap_policy=policy,
            cpu_offload=self.cpu_offload,
            mixed_precision=self.mixed_precision_config,
            sharding_strategy=self.sharding_strategy,
            device_id=self.root_device,  # an index only, as Lightning passes, is None on CPUs
            **self.kwargs,
        )
        sharding.move_metrics(wrapped, self.root_device)
        # After wrapping, as Lightning does: each checkpointed block runs inside its FSDP unit.
        every_n = self.options.checkpointing.activation_checkpointing
        apply_activation_checkpointing(wrapped, block_types, every_n=every_n)
        if self.compile_backend is not None:
            apply_compile(wrapped, block_types, backend=self.compile_backend)
        return wrapped

    @override
    @classmethod
    def register_strategies(cls, strategy_registry) -> None:
        strategy_registry.register(
            "fsdp_tuned", cls, description="FSDP1 with tuned defaults (lightning_dist)"
        )


def _sharding_enum(name: str):
    from torch.distributed.fsdp import ShardingStrategy

    return ShardingStrategy[name]


register_strategies()  # this module's names too, when it was the first to import Lightning
