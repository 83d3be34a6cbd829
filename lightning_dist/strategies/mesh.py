"""`MeshStrategy`: the Lightning adapter of the mesh runtime (lightning_dist/mesh/).

One strategy on Lightning's `ParallelStrategy` hooks for every layout of `Layout`: data (FSDP2 /
HSDP) x context x tensor x pipeline parallelism, and expert parallelism for a mixture of
experts. Each hook forwards to a `MeshRuntime`, which knows nothing of Lightning:

- `setup_environment`: the process group (torch's public `init_process_group`), then the
  runtime, which builds the layout's mesh;
- `parallelize_model(model, init_seed=...)`, which the LightningModule calls in
  `configure_model()`: the runtime's checks and `parallelize`;
- `setup`: the accelerator, the model (a module that built its layers in `__init__` is sharded
  child by child), optimizers, precision, and clipping by the runtime's global norm;
- `training_step` / `backward`: under pipeline parallelism the LightningModule's call
  `model(inputs, target, loss_fn)` runs the schedule, backward included, so `backward` only
  hands the gradients back; the loss-parallel context around both otherwise;
- `distributed_sampler_kwargs`: the data-parallel ranks only (context-parallel peers read the
  same batch and the LightningModule cuts each sequence);
- the checkpoint hooks: the one format of every strategy (`checkpoint_hooks.py`), with the
  runtime's single-process names, optionally written in the background.

Its presets are `Parallel3DStrategy` (`3d`, `tp`, `pp`), `FSDP2Strategy` and `FTHSDPStrategy`.
"""

from __future__ import annotations

from collections.abc import Generator
from contextlib import contextmanager, nullcontext
from datetime import timedelta
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.fabric.utilities.seed import reset_seed
from lightning.pytorch.strategies import ParallelStrategy
from lightning.pytorch.trainer.states import TrainerFn
from torch import nn
from torch.distributed.fsdp import FSDPModule
from typing_extensions import override

from lightning_dist._compat import ScriptLauncherHook, set_module_device_mesh
from lightning_dist.checkpoint.async_saves import AsyncSaves
from lightning_dist.layout import Layout
from lightning_dist.mesh import MeshRuntime
from lightning_dist.mesh.checks import check_layout, check_model
from lightning_dist.models.materialize import materialize_with_reset
from lightning_dist.options import StrategyOptions
from lightning_dist.options.optimizer_sharding import check_shard_optimizer_precision
from lightning_dist.parallel.context_parallel import context_parallel_of
from lightning_dist.parallel.parallelize import dp_mesh, optimizers_to_device, shard_children
from lightning_dist.parallel.precision import check_param_dtype
from lightning_dist.runtime.refusal import Refusal, install_refusal_hook, refusals
from lightning_dist.strategies import sharding
from lightning_dist.strategies.base import LightningDistStrategy, build_options
from lightning_dist.strategies.process_group import TorchProcessGroup
from lightning_dist.strategies.user_path import explain_stage_errors


class MeshStrategy(TorchProcessGroup, LightningDistStrategy, ScriptLauncherHook, ParallelStrategy):
    """Any layout of the mesh runtime for any LightningModule; see the module's docstring.

    Every knob is a keyword argument named as in `conf/strategy/3d.yaml` (`tp=2`,
    `activation_checkpointing="op"`, `prefetch_forward=2`, ...): the option classes of
    `lightning_dist.options` declare and document each one, and the `PRESETS` entry of the
    class gives its defaults. Alternatively pass a built `options=StrategyOptions(...)`.

    Args:
        async_save: write checkpoints in the background (see `checkpoint.async_saves`).
        timeout: the process group's collective timeout.
    """

    strategy_name = "3d"
    preset: str | None = "3d"

    def __init__(
        self,
        *,
        options: StrategyOptions | None = None,
        async_save: bool = False,
        timeout: timedelta | None = default_pg_timeout,
        **knobs: Any,
    ) -> None:
        self.options, _ = build_options(type(self), str(self.preset), options, knobs)
        super().__init__()
        self.sharded_checkpoints = self.options.checkpoint_format.state_dict_type == "sharded"
        """Whether each rank writes its own shards (else rank 0 the whole state)."""
        self.process_group_backend = self.options.process.process_group_backend
        self.timeout = timeout
        self.num_nodes = 1
        self.runtime: MeshRuntime | None = None
        """The layout over this run's processes, from `setup_environment` on."""
        self.check_machine_options()
        self._async_saves: AsyncSaves | None = None
        if async_save:
            self.enable_async_save()
        self._parallelize_called = False
        self._micro_step = 0
        self._hidden_grads: list[tuple[torch.Tensor, torch.Tensor | None]] = []

    # --- the contract: layout and checks --------------------------------------------------

    def declared_layout(self, num_nodes: int) -> Layout:
        return self.options.declared_layout(num_nodes)

    def layout_for(self, devices: int, num_nodes: int) -> Layout:
        layout = super().layout_for(devices, num_nodes)
        check_layout(layout, self.options)
        return layout

    def check_run(self, *, devices: int, num_nodes: int, precision: str, accelerator: str,
                  model: nn.Module | None = None, global_batch_size: int | None = None,
                  micro_batch_size: int | None = None) -> None:  # fmt: skip
        """Validate the layout against the run, the batch and the (meta) model before any
        process starts; raises ValueError naming the numbers."""
        layout = self.layout_for(devices, num_nodes)
        check_param_dtype(self.options.precision.param_dtype, precision)
        check_shard_optimizer_precision(self.options, precision)
        if global_batch_size is not None:
            layout.check_batch(global_batch_size, micro_batch_size)
        self.check_simulation(accelerator, devices * num_nodes)
        if model is not None:
            self.check_model(model, layout)

    def check_model(self, model: nn.Module, layout: Layout | None = None) -> None:
        """Can `layout` (default: this run's) split `model`? See `mesh/checks.py`."""
        check_model(model, layout or self.layout, self.options)

    # --- processes, mesh, data ------------------------------------------------------------

    @property
    def is_distributed(self) -> bool:  # read by Lightning for strategies it does not know
        return True

    @property
    def device_mesh(self) -> Any:
        """The layout's named DeviceMesh (None before `setup_environment`)."""
        return self.runtime.mesh if self.runtime is not None else None

    @override
    def setup_environment(self) -> None:
        self.join_process_group()
        ParallelStrategy.setup_environment(self)  # the accelerator's device (not the base's)
        reset_seed()
        self.set_world_ranks()
        # Alike on every rank, and before the process group: a rank that refused cannot leave a
        # peer halfway through connecting to it (one line from rank 0, runtime/refusal.py).
        with refusals():
            layout = self.layout_for(self.num_processes, self.num_nodes)
            check_param_dtype(self.options.precision.param_dtype, self.precision_plugin.precision)
        self.init_process_group()
        install_refusal_hook()  # outside torch.distributed's, which init_process_group installs
        self.runtime = MeshRuntime(
            layout, self.options, device=self.root_device,
            precision=str(self.precision_plugin.precision),
        )  # fmt: skip
        self.place_on_nodes(self.runtime.mesh)
        set_module_device_mesh(self.lightning_module, self.runtime.mesh)

    @property
    def pipelined(self) -> bool:  # type: ignore[override]  # the contract's
        return self.runtime is not None and self.runtime.pipeline is not None

    @property
    @override
    def distributed_sampler_kwargs(self) -> dict[str, int]:
        # Tensor-, context- and pipeline-parallel peers read the same batch.
        layout = self.layout
        return {"num_replicas": layout.dp, "rank": layout.dp_rank(self.global_rank)}

    @property
    @override
    def restore_checkpoint_after_setup(self) -> bool:
        return True

    @property
    @override
    def lightning_restore_optimizer(self) -> bool:
        return False  # load_checkpoint reads the optimizers with the model

    # --- the model ------------------------------------------------------------------------

    def _require_runtime(self) -> MeshRuntime:
        if self.runtime is None:
            raise RuntimeError(f"{type(self).__name__} has no processes yet (setup_environment)")
        return self.runtime

    def parallelize_model(self, model: nn.Module, *, init_seed: int) -> nn.Module:
        """Apply the layout to a meta-device `model`; called from `configure_model()`.

        Returns the sharded model, or under pipeline parallelism a `PipelinedModel` to call as
        `model(inputs, target, loss_fn)`.
        """
        runtime = self._require_runtime()
        with refusals():
            runtime.check_model(model)
        result = runtime.parallelize(model, init_seed=init_seed)
        self.simulate_speed(runtime.parts())  # a test tool; nothing unless configured
        self._parallelize_called = True
        return result

    @override
    def setup(self, trainer: pl.Trainer) -> None:
        """The accelerator, the model (materialised, precision-converted, on its device; a
        module that built its layers in `__init__` and never called `parallelize_model` is
        sharded child by child here), optimizers, precision plugin; then clipping by the
        global norm."""
        assert self.model is not None
        runtime = self._require_runtime()
        assert self.accelerator is not None
        self.accelerator.setup(trainer)
        if self.options.float8.float8 != "none" and not self._parallelize_called:
            raise Refusal(
                f"strategy.float8={self.options.float8.float8} converts models built through "
                "parallelize_model (lightning_dist's models, or a configure_model() that calls "
                "it); this module built or sharded its layers itself: call "
                "self.trainer.strategy.parallelize_model() in configure_model(), or set "
                "strategy.float8=none"
            )
        prepared = self._parallelize_called or any(
            isinstance(m, FSDPModule) for m in self.model.modules()
        )
        if not prepared:
            self._require_data_parallel_only()
        else:  # a configure_model() that applied FSDP2 itself on the meta device
            materialize_with_reset(self.model, self.root_device)
        self.model = self.precision_plugin.convert_module(self.model)
        self.model_to_device()
        if not prepared:
            self.model = shard_children(
                self.model,
                dp_mesh(
                    runtime.mesh, runtime.layout,
                    shard_optimizer=self.options.optimizer_sharding.shard_optimizer,
                ),
                device=self.root_device,
                options=self.options, precision=str(self.precision_plugin.precision),
            )  # fmt: skip
        self.barrier()
        if trainer.state.fn == TrainerFn.FITTING:
            self.setup_optimizers(trainer)
        self.setup_precision_plugin()
        if trainer.state.fn == TrainerFn.FITTING:
            optimizers_to_device(self.optimizers, self.root_device)
        sharding.move_metrics(self.model, self.root_device)
        self._clip_by_global_norm()

    @override
    def setup_optimizers(self, trainer: pl.Trainer) -> None:
        """The LightningModule's optimizers; under `strategy.shard_optimizer` (ZeRO-1) each
        wrapped to hold 1/dp of its states (its schedulers keep steering it)."""
        super().setup_optimizers(trainer)
        runtime = self._require_runtime()
        with refusals():  # an optimizer ZeRO-1 cannot slice: one line, every rank alike
            # a plain Lightning script skips check_run: checked here too
            check_shard_optimizer_precision(self.options, trainer.precision)
            self.optimizers = [runtime.shard_optimizer(o) for o in self.optimizers]

    @override
    def model_to_device(self) -> None:
        assert self.model is not None
        if not self.options.sharding.cpu_offload:  # offloaded shards stay in host memory
            self.model.to(self.root_device)

    @contextmanager
    @override
    def tensor_init_context(self, empty_init: bool | None = None) -> Generator[None, None, None]:
        with torch.device("meta") if empty_init else nullcontext():
            with self.precision_plugin.tensor_init_context():
                yield

    def _require_data_parallel_only(self) -> None:
        layout = self.layout
        if layout.tp > 1 or layout.pp > 1 or layout.cp > 1 or layout.ep > 1:
            raise Refusal(
                f"{type(self).__name__} with tp={layout.tp}, pp={layout.pp}, cp={layout.cp}, "
                f"ep={layout.ep}: the LightningModule "
                "must build its model in configure_model() and pass it to "
                "self.trainer.strategy.parallelize_model(model, init_seed=...) "
                "(see docs/BRING_YOUR_OWN_MODEL.md)"
            )

    def _clip_by_global_norm(self) -> None:
        # Lightning clips through the precision plugin with torch's clip_grad_norm_, which would
        # see only this rank's stage (and fails on a mix of DTensor meshes); torch's public
        # clip_grads_with_norm_ cannot scale DTensor gradients by a plain norm either. Replace
        # it, for this plugin instance only, by the runtime's norm over the whole model.
        plugin, runtime = self.precision_plugin, self._require_runtime()

        def clip_grad_by_norm(optimizer: Any, clip_val: float) -> None:
            runtime.clip_grad_norm_(clip_val, plugin.main_params(optimizer))

        plugin.clip_grad_by_norm = clip_grad_by_norm  # type: ignore[method-assign,assignment]
        # ZeRO-1: its optimizers clip their reduced slices (by norm and by value) instead.
        sharding.clip_sharded_gradients(plugin, stage_size=runtime.stage_size)

    # --- steps ----------------------------------------------------------------------------

    def _loss_parallel(self) -> Any:
        return self._require_runtime().loss_parallel()

    @override
    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        runtime = self._require_runtime()
        pipeline = runtime.pipeline
        if pipeline is None:
            with self._loss_parallel():
                return super().training_step(*args, **kwargs)
        # Under PP the module's step runs the schedule, backward included. Lightning zeroes
        # gradients after the step and before its backward, so: clear the previous optimizer
        # step's gradients first ourselves, and hide the new ones until backward() (a no-op)
        # hands them back.
        assert self.lightning_module is not None
        accumulate = self.lightning_module.trainer.accumulate_grad_batches
        if self._micro_step % accumulate == 0:
            runtime.start_accumulation(accumulate)
        pipeline.grad_accumulation = accumulate
        self._micro_step += 1
        with self._loss_parallel(), explain_stage_errors(pipeline):
            output = super().training_step(*args, **kwargs)
        self._hidden_grads = [(p, p.grad) for p in pipeline.parameters()]
        for param, _ in self._hidden_grads:
            param.grad = None
        return output

    @override
    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        with self._loss_parallel(), explain_stage_errors(self._require_runtime().pipeline):
            return super().validation_step(*args, **kwargs)

    @override
    def backward(
        self, closure_loss: torch.Tensor, optimizer: Any, *args: Any, **kwargs: Any
    ) -> torch.Tensor:
        if self.pipelined:  # the schedule already ran the backward
            for param, grad in self._hidden_grads:
                param.grad = grad
            self._hidden_grads = []
            return closure_loss
        with self._loss_parallel():
            return super().backward(closure_loss, optimizer, *args, **kwargs)

    def summary_fields(self) -> dict[str, Any]:
        """Under context parallelism: its degree, mode and this rank's attention calls
        through it (zero would mean the model attended to whole sequences); under ZeRO-1 the
        optimizer-state bytes this rank holds."""
        module = self.lightning_module
        step = context_parallel_of(module) if module is not None else None
        out = sharding.sharding_summary(self.optimizers)  # ZeRO-1: the state bytes this rank holds
        if step is not None:
            cp = {"cp": self.layout.cp, "mode": step.mode, "attention_calls": step.calls}
            out["context_parallel"] = cp
        return out

    # --- checkpoints ----------------------------------------------------------------------

    def pipeline_part(self) -> nn.Module | None:  # the checkpoint hooks'
        return self.runtime.pipeline if self.runtime is not None else None

    def enable_async_save(self) -> None:  # the contract's
        if not self.sharded_checkpoints:
            raise ValueError(
                "trainer.checkpoint.async_save=true needs strategy.state_dict_type=sharded"
            )
        self._async_saves = AsyncSaves()

    @override
    def teardown(self) -> None:
        if self._async_saves is not None:  # the last save finishes before the processes end
            self._async_saves.wait()
        if self.cluster_environment is not None:
            self.cluster_environment.teardown()
        self.precision_plugin.teardown()
        if self.accelerator is not None:
            self.accelerator.teardown()
