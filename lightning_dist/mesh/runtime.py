"""`MeshRuntime`: a `Layout` and its options over this process group, for any training loop.

It holds what a run needs between its steps and knows nothing of Lightning:

- the named device mesh of the layout (`Layout.build_mesh`);
- the model, parallelized by `lightning_dist.parallel.parallelize` in its fixed order and
  materialised on this rank (whole, then sliced; or shard by shard with `init_sharded`);
- one training step over a rank's micro-batches: the context-parallel cut of each sequence, the
  loss-parallel context, the pipeline schedule (forward and backward in one call) or a plain
  forward and backward, the gradient accumulation, clipping by the norm of the whole model's
  gradient, the optimizer's step, and the loss's mean over micro-batches and ranks;
- the checkpoint state in the one format of every strategy, under the single-process names
  (pipeline stages merged), so any layout loads it and `train.py trainer.init_from=` starts
  from a plain loop's weights.

The Lightning adapter (`lightning_dist.strategies.parallel3d`) forwards to the same methods.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from lightning_dist.checkpoint import format as ckpt
from lightning_dist.checkpoint.canonical import canonical_module
from lightning_dist.layout import Layout
from lightning_dist.mesh.checks import check_layout, check_model
from lightning_dist.mesh.reductions import mean_over_ranks
from lightning_dist.models.materialize import materialize
from lightning_dist.options import StrategyOptions
from lightning_dist.parallel.clip import clip_grad_norm_global
from lightning_dist.parallel.context_parallel import (
    ContextParallelAttention,
    context_parallel_of,
    shard_sequences,
)
from lightning_dist.parallel.parallelize import init_shards, model_parts, parallelize
from lightning_dist.parallel.pipeline import PipelinedModel
from lightning_dist.parallel.sharded_optimizer import ShardedOptimizer
from lightning_dist.parallel.tp import loss_parallel_context

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""`loss_fn(output, targets)`: one micro-batch's mean loss, a plain tensor (under loss
parallelism the caller turns torch's DTensor into one, e.g. with `full_tensor()`)."""


@dataclass(frozen=True)
class MicroBatch:
    """One micro-batch of a rank: the model's inputs, the targets, and keyword inputs cut with
    them (`positions` [b, s] or [s], `documents` [b, s] of packed documents)."""

    inputs: torch.Tensor
    targets: torch.Tensor
    extra: dict[str, torch.Tensor] = field(default_factory=dict)


class MeshRuntime:
    """The layout `layout` with `options` over the default process group, on `device`.

    `precision` is a Lightning-style precision name ("32-true", "bf16-mixed", ...), which
    FSDP's mixed-precision policy follows. The default process group must exist; the mesh is
    built here (a collective: every rank constructs its runtime), unless `mesh` is given.
    """

    def __init__(
        self,
        layout: Layout,
        options: StrategyOptions | None = None,
        *,
        device: torch.device | str = "cpu",
        precision: str = "32-true",
        mesh: Any = None,
    ) -> None:
        if not dist.is_initialized():
            raise ValueError(
                "MeshRuntime runs over torch.distributed's default process group: call "
                "torch.distributed.init_process_group() first (torchrun sets its environment)"
            )
        self.layout = layout.resolve(dist.get_world_size())  # ValueError naming the degrees
        self.options = options or StrategyOptions(layout=self.layout)
        check_layout(self.layout, self.options)
        self.device = torch.device(device)
        self.precision = precision
        self.rank = dist.get_rank()
        self.mesh = mesh if mesh is not None else self.layout.build_mesh(self.device.type)
        self.model: nn.Module | None = None
        """The parallelized model (a `PipelinedModel` under pipeline parallelism)."""
        self.pipeline: PipelinedModel | None = None
        self.context: ContextParallelAttention | None = None
        self._holder: nn.Module | None = None

    # --- the layout's view of this rank ---------------------------------------------------

    @property
    def dp_rank(self) -> int:
        """This rank's index among the data-parallel ranks (the sampler's rank): tensor-,
        context- and pipeline-parallel peers read the same batch."""
        return self.layout.dp_rank(self.rank)

    @property
    def dp_size(self) -> int:
        """The number of data-parallel ranks (the sampler's replicas)."""
        return self.layout.dp

    @property
    def stage_size(self) -> int:
        """The ranks that hold one pipeline stage (dp x cp x tp), for the global norm."""
        return self.layout.dp * self.layout.cp * self.layout.tp

    # --- the model ------------------------------------------------------------------------

    def check_model(self, model: nn.Module) -> None:
        """ValueError in one line unless the layout can split `model` (`mesh/checks.py`)."""
        check_model(model, self.layout, self.options)

    def parallelize(self, model: nn.Module, *, init_seed: int) -> nn.Module:
        """Apply the layout to `model` (on the meta device, or materialised alike on every rank)
        and return this rank's part, on its device: the sharded model, or under pipeline
        parallelism a `PipelinedModel` to call as `model(inputs, target, loss_fn)`.

        The weights are the single-process model's for `init_seed` (materialised whole, then
        sliced), or each rank's own draw with `strategy.init_sharded` (no full copy anywhere)."""
        init_sharded = self.options.fsdp.init_sharded
        if not init_sharded:
            model = materialize(model, self.device, init_seed)
        result = parallelize(
            model, self.mesh, self.layout, device=self.device, options=self.options,
            precision=self.precision,
        )  # fmt: skip
        if init_sharded:
            init_shards(
                model_parts(result), self.layout, self.rank, device=self.device, seed=init_seed
            )
        return self.adopt(result if self.options.sharding.cpu_offload else result.to(self.device))

    def adopt(self, model: nn.Module) -> nn.Module:
        """Take `model` (already parallelized, e.g. sharded by a caller's own code) as the
        runtime's model; return it."""
        self.model = model
        self.pipeline = model if isinstance(model, PipelinedModel) else None
        self.context = context_parallel_of(model)
        return model

    def parts(self) -> list[nn.Module]:
        """The modules of this rank: its pipeline stages, or the model."""
        return model_parts(self._require_model())

    def shard_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """The optimizer to step and checkpoint: `optimizer` itself, or under
        `strategy.shard_optimizer` (ZeRO-1) a `ShardedOptimizer` over the dp_replicate ranks
        that holds 1/dp of its states and reduce-scatters the gradients (FSDP2 runs over
        dp_shard alone then: `parallel/parallelize.dp_mesh`; `parallel/sharded_optimizer.py`)."""
        if not self.options.optimizer_sharding.shard_optimizer:
            return optimizer
        group = self.mesh["dp_replicate"].get_group()
        return ShardedOptimizer(optimizer, group, reduce_gradients=True)

    def _require_model(self) -> nn.Module:
        if self.model is None:
            raise RuntimeError("MeshRuntime has no model yet: call parallelize(model) first")
        return self.model

    # --- one step -------------------------------------------------------------------------

    def loss_parallel(self) -> contextlib.AbstractContextManager:
        """The context the loss and its backward run in: torch's loss parallelism when the
        logits stay split along the vocabulary (tp > 1 and `strategy.loss_parallel`)."""
        return loss_parallel_context(self.layout.tp, self.options.tp.loss_parallel)

    def shard_sequences(self, batch: MicroBatch) -> MicroBatch:
        """Under context parallelism, this rank's chunks of every sequence (inputs, targets and
        keyword inputs alike, with their true positions); else `batch` itself."""
        if self.context is None:
            return batch
        inputs, targets, extra = shard_sequences(
            self.context, batch.inputs, batch.targets, batch.extra
        )
        return MicroBatch(inputs, targets, extra)

    def start_accumulation(self, accumulate: int) -> None:
        """Before the first micro-batch of an optimizer step under pipeline parallelism: clear
        the previous step's gradients, and tell the schedule how many micro-batches the step
        has (each microbatch's loss is divided by it, so the summed gradients are the mean's)."""
        if self.pipeline is None:
            return
        self.pipeline.grad_accumulation = accumulate
        for param in self.pipeline.parameters():
            param.grad = None

    def forward_backward(
        self, batch: MicroBatch, loss_fn: LossFn, *, accumulate: int = 1
    ) -> torch.Tensor:
        """One micro-batch of an optimizer step of `accumulate` micro-batches: its loss (a
        detached value, the same on every pipeline rank), its gradients added to the
        parameters' (scaled by 1 / accumulate)."""
        model = self._require_model()
        batch = self.shard_sequences(batch)
        with self.loss_parallel():
            if self.pipeline is not None:  # the schedule runs forward and backward
                self.pipeline.grad_accumulation = accumulate
                return self.pipeline(batch.inputs, batch.targets, loss_fn, **batch.extra)
            loss = loss_fn(model(batch.inputs, **batch.extra), batch.targets)
            (loss / accumulate).backward()
        return loss.detach()

    def clip_grad_norm_(self, max_norm: float, parameters: Iterable[torch.Tensor]) -> torch.Tensor:
        """Scale the gradients of `parameters` (every parameter this rank holds, in the
        optimizer's order) so that the whole model's gradient norm is at most `max_norm`;
        return that norm (`parallel/clip.py`)."""
        return clip_grad_norm_global(parameters, max_norm, stage_size=self.stage_size)

    def train_step(
        self,
        micro_batches: Sequence[MicroBatch],
        loss_fn: LossFn,
        optimizer: torch.optim.Optimizer,
        *,
        max_norm: float | None = None,
    ) -> torch.Tensor:
        """One optimizer step over this rank's `micro_batches`: gradients accumulated over
        them, clipped by the global norm when `max_norm` is set, then `optimizer.step()`.
        Returns the step's loss: the mean over micro-batches, then over every rank."""
        optimizer.zero_grad(set_to_none=True)
        self.start_accumulation(len(micro_batches))
        total = torch.zeros(())
        for batch in micro_batches:
            loss = self.forward_backward(batch, loss_fn, accumulate=len(micro_batches))
            total = total.to(loss.device) + loss
        global_loss = mean_over_ranks(total / len(micro_batches))
        if max_norm and isinstance(optimizer, ShardedOptimizer):  # ZeRO-1: its reduced slices
            optimizer.clip_grad_norm_(max_norm, stage_size=self.stage_size)
        elif max_norm:
            self.clip_grad_norm_(max_norm, optimizer_parameters(optimizer))
        optimizer.step()
        return global_loss

    # --- checkpoint state -----------------------------------------------------------------

    def checkpoint_module(self, root: nn.Module | None = None) -> nn.Module:
        """The module whose state-dict names are the single-process model's: `root` (a module
        that holds the model, e.g. a LightningModule), by default a holder with the model as
        its `model` (the names a LightningModule gives it), with pipeline stages merged."""
        if root is None:
            if self._holder is None or self._holder.model is not self.model:
                self._holder = nn.Module()
                self._holder.model = self._require_model()
            root = self._holder
        return canonical_module(root, self.pipeline)

    def state_dict(
        self, optimizers: Sequence[Any] = (), *, root: nn.Module | None = None
    ) -> dict[str, Any]:
        """This rank's model and optimizer state in the files' names and shapes."""
        return ckpt.gather_state(self.checkpoint_module(root), list(optimizers))

    def save(
        self,
        path: str | Path,
        optimizers: Sequence[Any] = (),
        *,
        meta: dict[str, Any] | None = None,
        fields: dict[str, Any] | None = None,
        root: nn.Module | None = None,
    ) -> None:
        """Write a checkpoint folder at `path` (collective): every rank's shards, `meta` (the
        loop's own state: step, schedulers, ...; plain values) and the manifest, which
        records `fields` and the layout."""
        layout = {name: getattr(self.layout, name) for name in LAYOUT_FIELDS}
        fields = {"layout": {**layout, "world_size": self.layout.world_size}, **(fields or {})}
        state = self.state_dict(optimizers, root=root)
        ckpt.write_folder(state, Path(path), dict(meta or {}), fields, rank0=self.rank == 0)

    def load(
        self, path: str | Path, optimizers: Sequence[Any] = (), *, root: nn.Module | None = None
    ) -> dict[str, Any]:
        """Load a checkpoint folder of any strategy and layout into this rank's shards (the
        optimizers must exist: their state is resharded with the model's); return its meta."""
        return ckpt.load_state(
            self.checkpoint_module(root), list(optimizers), Path(path),
            whole_model=self.pipeline is None,
        )  # fmt: skip


LAYOUT_FIELDS = ("dp_replicate", "dp_shard", "cp", "tp", "ep", "pp", "schedule", "virtual_stages")
"""The layout's fields a checkpoint's manifest records."""


def optimizer_parameters(optimizer: torch.optim.Optimizer) -> Iterator[torch.Tensor]:
    """The optimizer's parameters, group by group (the order its state and clipping use)."""
    for group in optimizer.param_groups:
        yield from group["params"]
