"""`strategy=3d` / `Trainer(strategy="parallel3d")`: data x context x tensor x pipeline
parallelism, and expert parallelism for a mixture of experts.

A thin layer over Lightning's ModelParallelStrategy (process group, launcher). What it adds:

- the mesh of a `Layout` (pp, dp_replicate, dp_shard, cp, tp; tp innermost so it stays in a
  node), FSDP over dp_shard x cp; `ep` ranks borrowed from dp_shard for a mixture of experts;
- `parallelize_model(model, init_seed=...)`, which the LightningModule calls in
  `configure_model()` and which applies `lightning_dist.parallel.parallelize`;
- under pipeline parallelism the LightningModule's call `model(inputs, target, loss_fn)` runs
  the schedule (forward and backward), so Lightning's backward is a no-op;
- the loss-parallel context around the steps and backward when the logits stay vocab-split;
- gradient clipping by the norm over every mesh dimension;
- the data sampler over the data-parallel ranks only (context-parallel peers read the same
  batch, and the LightningModule cuts each sequence: `context_parallel_of`);
- checkpoints in the one format of every strategy (`strategies/checkpoint_hooks.py`), with
  pipeline stages under their single-process names, optionally written in the background.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn

from lightning_dist._compat import set_module_device_mesh
from lightning_dist.checkpoint.async_saves import AsyncSaves
from lightning_dist.layout import Layout
from lightning_dist.models.materialize import materialize, materialize_with_reset
from lightning_dist.models.protocol import require_init_weights
from lightning_dist.options import StrategyOptions
from lightning_dist.options.knobs import check_reshard
from lightning_dist.parallel.clip import clip_grad_norm_global
from lightning_dist.parallel.context_parallel import check_context_parallel, context_parallel_of
from lightning_dist.parallel.expert_parallel import check_expert_parallel
from lightning_dist.parallel.parallelize import (
    dp_mesh,
    init_shards,
    model_parts,
    optimizers_to_device,
    parallelize,
    shard_children,
)
from lightning_dist.parallel.pipeline import PipelinedModel, split_blocks
from lightning_dist.parallel.precision import check_param_dtype
from lightning_dist.parallel.tp import check_tp, loss_parallel_context, plain_tensor
from lightning_dist.planner.estimate import float8_problem
from lightning_dist.runtime.refusal import Refusal, install_refusal_hook, refusals
from lightning_dist.runtime.strategy_names import register_strategies
from lightning_dist.strategies import sharding
from lightning_dist.strategies.base import LightningDistStrategy, build_options
from lightning_dist.strategies.user_path import explain_stage_errors


class Parallel3DStrategy(LightningDistStrategy, ModelParallelStrategy):
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

    strategy_name = "parallel3d"
    preset = "3d"

    def __init__(
        self,
        *,
        options: StrategyOptions | None = None,
        async_save: bool = False,
        timeout: timedelta | None = default_pg_timeout,
        **knobs: Any,
    ) -> None:
        self.options, _ = build_options(type(self), self.preset, options, knobs)
        super().__init__(
            save_distributed_checkpoint=self.options.checkpoint_format.state_dict_type == "sharded",
            process_group_backend=self.options.process.process_group_backend,
            timeout=timeout,
        )
        self.check_machine_options()
        self._async_saves = None
        if async_save:
            self.enable_async_save()
        self._pipeline: PipelinedModel | None = None
        self._parallelize_called = False
        self._micro_step = 0
        self._hidden_grads: list[tuple[torch.Tensor, torch.Tensor | None]] = []

    # --- the contract: layout and checks ------------------------------------------------------

    def declared_layout(self, num_nodes: int) -> Layout:
        return self.options.declared_layout(num_nodes)

    def layout_for(self, devices: int, num_nodes: int) -> Layout:
        layout = super().layout_for(devices, num_nodes)
        reshard = self.options.fsdp.reshard_after_forward
        if not isinstance(reshard, bool):
            check_reshard(reshard, layout.shard_size)
        problem = float8_problem(self.options.float8.float8, layout.tp)  # the planner's own rule
        if problem:
            raise ValueError(problem)
        return layout

    def check_run(self, *, devices: int, num_nodes: int, precision: str, accelerator: str,
                  model: nn.Module | None = None, global_batch_size: int | None = None,
                  micro_batch_size: int | None = None) -> None:  # fmt: skip
        """Validate the layout against the run, the batch and the (meta) model before any
        process starts; raises ValueError naming the numbers."""
        layout = self.layout_for(devices, num_nodes)
        check_param_dtype(self.options.precision.param_dtype, precision)
        if global_batch_size is not None:
            layout.check_batch(global_batch_size, micro_batch_size)
        self.check_simulation(accelerator, devices * num_nodes)
        if model is not None:
            self.check_model(model, layout)

    def check_model(self, model: nn.Module, layout: Layout | None = None) -> None:
        """Can `layout` split `model`? Head, FFN and vocabulary divisibility by tp, the TP plan's
        patterns, the pipeline-layers contract, the layer count and split points, the
        attention slot and heads context parallelism needs, and the block classes to shard."""
        layout = layout or self.layout
        require_init_weights(model)
        args = _model_args(model)
        if args is not None:
            layout.check_model(args)
        tp, auto_wrap = self.options.tp, self.options.sharding.auto_wrap
        check_expert_parallel(model, layout.ep, layout.tp, layout.pp,
                              getattr(args, "num_experts", 0))  # fmt: skip
        if layout.tp > 1:
            check_tp(model, layout.tp, plan=tp.tp_plan, sequence_parallel=tp.sequence_parallel,
                     shard_size=layout.shard_size)  # fmt: skip
        if layout.pp > 1:
            split_blocks(model, layout.num_stages, self.options.pipeline.split_points)
        if layout.cp > 1:
            _check_context_parallel(model, layout, self.options.cp.cp_mode, args)
        if auto_wrap is not None:
            sharding.check_auto_wrap(model, auto_wrap)

    # --- processes, mesh, data ----------------------------------------------------------------

    def setup_environment(self) -> None:
        self.join_process_group()
        self._setup_distributed()
        install_refusal_hook()  # outside torch.distributed's, which init_process_group installs
        with refusals():  # alike on every rank: one line from rank 0 (runtime/refusal.py)
            layout = self.layout_for(self.num_processes, self.num_nodes)
            check_param_dtype(self.options.precision.param_dtype, self.precision_plugin.precision)
        self._device_mesh = layout.build_mesh(self.root_device.type)
        self.place_on_nodes(self._device_mesh)
        set_module_device_mesh(self.lightning_module, self._device_mesh)

    @property
    def pipelined(self) -> bool:  # the contract's
        return self._pipeline is not None

    @property
    def distributed_sampler_kwargs(self) -> dict[str, int]:
        # Tensor- and pipeline-parallel peers read the same batch.
        layout = self.layout
        return {"num_replicas": layout.dp, "rank": layout.dp_rank(self.global_rank)}

    # --- the model ----------------------------------------------------------------------------

    def parallelize_model(self, model: nn.Module, *, init_seed: int) -> nn.Module:
        """Apply the layout to a meta-device `model`; called from `configure_model()`.

        Returns the sharded model, or under pipeline parallelism a `PipelinedModel` to call as
        `model(inputs, target, loss_fn)`.
        """
        layout = self.layout
        with refusals():
            self.check_model(model, layout)
        init_sharded = self.options.fsdp.init_sharded
        if not init_sharded:
            model = materialize(model, self.root_device, init_seed)
        result = parallelize(
            model, self.device_mesh, layout, device=self.root_device, options=self.options,
            precision=self.precision_plugin.precision,
        )  # fmt: skip
        if init_sharded:
            self._init_shards(result, init_seed)
        self.simulate_speed(model_parts(result))  # a test tool; nothing unless configured
        self._pipeline = result if isinstance(result, PipelinedModel) else None
        self._parallelize_called = True
        return result if self.options.sharding.cpu_offload else result.to(self.root_device)

    def _init_shards(self, model: nn.Module, seed: int) -> None:
        init_shards(
            model_parts(model), self.layout, self.global_rank, device=self.root_device, seed=seed
        )

    def setup(self, trainer) -> None:
        """Lightning's public pieces, in ModelParallelStrategy's order: accelerator, the model
        (materialised, precision-converted, on its device; a module that built its layers in
        `__init__` and never called `parallelize_model` is sharded child by child here),
        optimizers, precision plugin; then clipping by the global norm."""
        from lightning.pytorch.trainer.states import TrainerFn
        from torch.distributed.fsdp import FSDPModule

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
                self.model, dp_mesh(self.device_mesh, self.layout), device=self.root_device,
                options=self.options, precision=self.precision_plugin.precision,
            )  # fmt: skip
        self.barrier()
        if trainer.state.fn == TrainerFn.FITTING:
            self.setup_optimizers(trainer)
        self.setup_precision_plugin()
        if trainer.state.fn == TrainerFn.FITTING:
            optimizers_to_device(self.optimizers, self.root_device)
        sharding.move_metrics(self.model, self.root_device)
        self._clip_by_global_norm()

    def model_to_device(self) -> None:
        if not self.options.sharding.cpu_offload:  # offloaded shards stay in host memory
            super().model_to_device()

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
        # it, for this plugin instance only, by the norm over the whole model.
        plugin = self.precision_plugin
        stage_size = self.layout.dp * self.layout.cp * self.layout.tp

        def clip_grad_by_norm(optimizer, clip_val: float) -> None:
            clip_grad_norm_global(plugin.main_params(optimizer), clip_val, stage_size=stage_size)

        plugin.clip_grad_by_norm = clip_grad_by_norm

    # --- steps --------------------------------------------------------------------------------

    def _loss_parallel(self):
        return loss_parallel_context(self.layout.tp, self.options.tp.loss_parallel)

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        if self._pipeline is None:
            with self._loss_parallel():
                return super().training_step(*args, **kwargs)
        # Under PP the module's step runs the schedule, backward included. Lightning zeroes
        # gradients after the step and before its backward, so: clear the previous optimizer
        # step's gradients first ourselves, and hide the new ones until backward() (a no-op)
        # hands them back.
        accumulate = self.lightning_module.trainer.accumulate_grad_batches
        self._pipeline.grad_accumulation = accumulate
        if self._micro_step % accumulate == 0:
            for param in self._pipeline.parameters():
                param.grad = None
        self._micro_step += 1
        with self._loss_parallel(), explain_stage_errors(self._pipeline):
            output = super().training_step(*args, **kwargs)
        self._hidden_grads = [(p, p.grad) for p in self._pipeline.parameters()]
        for param, _ in self._hidden_grads:
            param.grad = None
        return output

    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        with self._loss_parallel(), explain_stage_errors(self._pipeline):
            return super().validation_step(*args, **kwargs)

    def backward(self, closure_loss: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if self._pipeline is not None:  # the schedule already ran the backward
            for param, grad in self._hidden_grads:
                param.grad = grad
            self._hidden_grads = []
            return closure_loss
        with self._loss_parallel():
            return super().backward(closure_loss, *args, **kwargs)

    def reduce(self, tensor: Any, group: Any = None, reduce_op: Any = "mean") -> Any:
        """Lightning's reduce, also for DTensors (the loss under loss parallelism), on a
        detached copy: the caller's tensor is never modified in place."""
        if isinstance(tensor, torch.Tensor):
            tensor = plain_tensor(tensor)
        return super().reduce(tensor, group=group, reduce_op=reduce_op)

    def summary_fields(self) -> dict[str, Any]:
        """Under context parallelism: its degree, mode and this rank's attention calls
        through it (zero would mean the model attended to whole sequences)."""
        module = self.lightning_module
        step = context_parallel_of(module) if module is not None else None
        if step is None:
            return {}
        cp = {"cp": self.layout.cp, "mode": step.mode, "attention_calls": step.calls}
        return {"context_parallel": cp}

    # --- checkpoints --------------------------------------------------------------------------

    def enable_async_save(self) -> None:  # the contract's
        if not self._save_distributed_checkpoint:
            raise ValueError(
                "trainer.checkpoint.async_save=true needs strategy.state_dict_type=sharded"
            )
        self._async_saves = AsyncSaves()

    def teardown(self) -> None:
        if self._async_saves is not None:  # the last save finishes before the processes end
            self._async_saves.wait()
        super().teardown()

    @classmethod
    def register_strategies(cls, strategy_registry) -> None:
        strategy_registry.register(
            "parallel3d", cls, description="data x tensor x pipeline parallelism (lightning_dist)"
        )


def _check_context_parallel(model: nn.Module, layout: Layout, mode: str, args) -> None:
    """ValueError in one line unless `model` runs under `layout`'s cp in `mode`."""
    heads = (None, None) if args is None else (args.n_heads, args.kv_heads)
    check_context_parallel(
        model, layout.cp, mode, n_heads=heads[0], n_kv_heads=heads[1], tp=layout.tp
    )


def _model_args(model: nn.Module):
    """The ModelArgs of our Transformer or of a Llama-family HF model, else None."""
    args = getattr(model, "args", None)
    if args is not None:
        return args
    spec = getattr(model, "spec", None)
    try:
        return spec.to_model_args() if spec is not None else None
    except ValueError:  # an HF architecture ModelArgs cannot describe; the plan checks remain
        return None


register_strategies()  # this module's names too, when it was the first to import Lightning
