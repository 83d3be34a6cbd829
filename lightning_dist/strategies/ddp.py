"""`strategy=ddp`: Lightning's DDPStrategy, declaring the contract (every rank a replica), with
speed-weighted shares, gradient compression and DiLoCo for ranks of unequal speed and slow links
(docs/SLOW_LINKS.md).

It stays a subclass of Lightning's DDPStrategy rather than a preset of the mesh adapter
(`strategies/mesh.py`): its gradient hooks (compression, simulated delays, speed-weighted
shares) and DiLoCo act on `DistributedDataParallel`'s communication hook and `no_sync`, which
Lightning's class already drives; the adapter's ddp-like layout (`dp_replicate`) replicates
through FSDP2 instead and has none of them."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import DDPStrategy
from typing_extensions import override

from lightning_dist._compat import sigterm_broadcast_once_per_step
from lightning_dist.cluster.diloco import DiLoCo
from lightning_dist.cluster.grad_sync import gradient_hook
from lightning_dist.layout import Layout
from lightning_dist.options import StrategyOptions
from lightning_dist.options.optimizer_sharding import (
    check_shard_optimizer_precision,
    shard_optimizer_problem,
)
from lightning_dist.parallel.sharded_optimizer import ShardedOptimizer
from lightning_dist.runtime.refusal import refusals
from lightning_dist.strategies.base import LightningDistStrategy, build_options
from lightning_dist.strategies.sharding import clip_sharded_gradients, sharding_summary


class DataParallelStrategy(LightningDistStrategy, DDPStrategy):
    """DDP: each rank holds the whole model and reads its own slice of the global batch.

    The contract's defaults describe it exactly (layout dp_replicate = world size, planner
    sharding NO_SHARD); this class adds them to Lightning's DDPStrategy, and per-block
    compilation before DDP wraps the model. Its knobs are those of `options.PRESETS["ddp"]`
    (`find_unused_parameters`, `compile`, ...), with their defaults also from Python:
    `gradient_as_bucket_view=True` and `broadcast_buffers=False` (our buffers never change;
    pass `broadcast_buffers=True` for a model whose buffers do, such as BatchNorm's). Other
    keyword arguments go to Lightning.

    For ranks of unequal speed and slow links:

    - `dp_shares`: rank r runs `dp_shares[r] x k` micro-batches per step (Lightning's
      `accumulate_grad_batches` set per rank in `setup`), and its loss is weighted by
      `loss_weight()` so the averaged gradient is one device's;
    - `grad_compression` / `diloco_inner_steps`: the DDP communication hook
      (`cluster/grad_sync.py`) and the outer loop after each optimizer step
      (`cluster/diloco.py`);
    - `simulate_*`: the test tool of `cluster/simulate.py` (a delay in the hook, hooks that
      pace the blocks).

    Why a subclass of Lightning's DDPStrategy and not a preset of the mesh strategy: DDP's
    bucketed all-reduce, its communication hooks (compression, DiLoCo's local steps) and
    per-rank gradient accumulation are DistributedDataParallel's own; Lightning's DDPStrategy
    already drives exactly that, so a subclass adds only what differs and owns no loop.
    """

    preset = "ddp"
    delays_gradients = True

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
        self.diloco: DiLoCo | None = None
        """The outer loop under `strategy.diloco_inner_steps`, made at the first optimizer step
        (after a checkpoint's restore and `trainer.init_from`, which come after `setup`)."""
        self._accumulation: tuple[int, Any] | None = None
        """Lightning's accumulation and validation interval before `dp_shares` scaled them."""

    # --- the contract: shares of the global batch ---------------------------------------------

    def data_shares(self, layout) -> int:
        """The pieces the global batch is cut into: the layout's dp, or the sum of
        `strategy.dp_shares` (each rank then takes its share of them)."""
        shares = self.options.shares.dp_shares
        return sum(shares) if shares else layout.dp

    def dp_weights(self) -> list[int] | None:
        return self.options.shares.dp_shares

    def loss_weight(self) -> float:
        """dp x share / sum of shares: Lightning divides each micro-batch's loss by this rank's
        accumulation (share x k) and DDP the summed gradients by dp, so every one of the
        sum x k micro-batches then counts 1 / (sum x k), as on one device."""
        shares = self.options.shares.dp_shares
        if not shares:
            return 1.0
        return len(shares) * shares[self.global_rank] / sum(shares)

    def check_run(
        self,
        *,
        devices: int,
        num_nodes: int,
        precision: str,
        accelerator: str,
        model=None,
        global_batch_size: int | None = None,
        micro_batch_size: int | None = None,
    ) -> None:
        super().check_run(
            devices=devices,
            num_nodes=num_nodes,
            precision=precision,
            accelerator=accelerator,
            model=model,
            global_batch_size=global_batch_size,
            micro_batch_size=micro_batch_size,
        )
        shares = self.options.shares.dp_shares
        if not shares:
            return
        self._check_shares(shares, devices * num_nodes)
        if global_batch_size is not None:
            step = sum(shares) * (micro_batch_size or 1)
            if global_batch_size % step:
                what = f"sum(strategy.dp_shares={shares})"
                if micro_batch_size is not None:
                    what += f" x data.per_rank_batch_size={micro_batch_size}"
                raise ValueError(
                    f"data.global_batch_size={global_batch_size} is not divisible by {what} = "
                    f"{step}; use a multiple of {step}"
                )

    def _check_shares(self, shares: list[int], world: int) -> None:
        """One share per rank, and no DiLoCo beside them."""
        if len(shares) != world:
            raise ValueError(
                f"strategy.dp_shares={shares} has {len(shares)} entries for {world} data-parallel "
                f"ranks; give one share per rank"
            )
        if self.options.grad_sync.diloco_inner_steps:
            raise ValueError(
                f"strategy.dp_shares={shares} with strategy.diloco_inner_steps="
                f"{self.options.grad_sync.diloco_inner_steps} is not supported (DiLoCo's replicas "
                "step alone); unset one of them"
            )

    # --- the run ------------------------------------------------------------------------------

    @override
    def setup(self, trainer: pl.Trainer) -> None:
        """Lightning's DDP setup; under `dp_shares` this rank's accumulation (and the
        validation interval, counted in its batches) first. The shares are checked here too
        (train.py checks them before launch, `check_run`; plain Lightning code comes here
        directly): every rank holds the same list, so each raises the same line."""
        shares = self.options.shares.dp_shares
        if shares:
            self._check_shares(shares, self.world_size)
            if self._accumulation is None:  # a second fit scales the values it started from
                self._accumulation = (trainer.accumulate_grad_batches, trainer.val_check_interval)
            accumulation, interval = self._accumulation
            mine = shares[self.global_rank]
            trainer.accumulate_grad_batches = accumulation * mine
            if isinstance(interval, int):
                trainer.val_check_interval = interval * mine
            sigterm_broadcast_once_per_step(trainer)  # else a collective per micro-batch
        super().setup(trainer)

    def layout_for(self, devices: int, num_nodes: int) -> Layout:
        """The layout, refused in one line when ZeRO-1 has no replicas to shard over (the mesh
        strategies check the same in `mesh.checks.check_layout`)."""
        layout = super().layout_for(devices, num_nodes)
        problem = shard_optimizer_problem(layout, self.options)
        if problem:
            raise ValueError(problem)
        return layout

    @override
    def setup_optimizers(self, trainer: pl.Trainer) -> None:
        """The LightningModule's optimizers; under `strategy.shard_optimizer` (ZeRO-1) each
        wrapped to hold 1/world of its states over the default group (every rank a replica;
        `parallel/sharded_optimizer.py`), its schedulers still steering it."""
        super().setup_optimizers(trainer)
        if self.options.optimizer_sharding.shard_optimizer:
            with refusals():  # an optimizer ZeRO-1 cannot slice: one line, every rank alike
                # a plain Lightning script skips check_run: checked here too
                check_shard_optimizer_precision(self.options, trainer.precision)
                self.optimizers = [
                    ShardedOptimizer(o, reduce_gradients=True) for o in self.optimizers
                ]
            clip_sharded_gradients(self.precision_plugin, stage_size=self.world_size)

    @override
    def configure_ddp(self) -> None:
        """Wrap the model in DDP, then register the gradient hook that compresses, delays or
        skips the all-reduce (DiLoCo's inner steps; ZeRO-1, whose optimizer reduce-scatters the
        gradients itself), on any backend."""
        super().configure_ddp()
        sync = self.options.grad_sync
        zero1 = self.options.optimizer_sharding.shard_optimizer
        chosen = gradient_hook(
            sync.grad_compression,
            local=sync.diloco_inner_steps > 0 or zero1,
            powersgd_rank=sync.powersgd_rank,
            powersgd_start_step=sync.powersgd_start_step,
            delay_s=self.options.simulate.simulate_delay_ms / 1000,
        )
        if chosen is not None:
            self.model.register_comm_hook(*chosen)

    @override
    def backward(self, closure_loss: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        weight = self.loss_weight()
        if weight != 1.0:
            closure_loss = closure_loss * weight
        return super().backward(closure_loss, *args, **kwargs)

    @override
    def optimizer_step(self, optimizer, closure, model=None, **kwargs: Any) -> Any:
        """The step; under DiLoCo, then the outer loop (a sync every H steps of the run and at
        its last). The outer loop's anchor is taken at the first step, from the weights the run
        starts from (a restored checkpoint's, `trainer.init_from`'s), before the inner step."""
        sync = self.options.grad_sync
        if sync.diloco_inner_steps and self.diloco is None:
            self.diloco = DiLoCo(
                list(self.lightning_module.parameters()),
                inner_steps=sync.diloco_inner_steps,
                outer_lr=sync.diloco_outer_lr,
                outer_momentum=sync.diloco_outer_momentum,
                delay_s=self.options.simulate.simulate_delay_ms / 1000,
            )
        output = super().optimizer_step(optimizer, closure, model, **kwargs)
        if self.diloco is not None:
            trainer = self.lightning_module.trainer
            step = trainer.global_step + 1  # Lightning counts this step after the hook
            self.diloco.after_inner_step(step, last=0 < trainer.max_steps <= step)
        return output

    def summary_fields(self) -> dict[str, Any]:
        """What the slow-link settings did: DiLoCo's syncs and their time; the shares; under
        ZeRO-1 the optimizer-state bytes this rank holds."""
        out: dict[str, Any] = sharding_summary(self.optimizers)
        if self.diloco is not None:
            out["diloco"] = {
                "inner_steps": self.diloco.inner_steps,
                "syncs": self.diloco.syncs,
                "sync_seconds": self.diloco.sync_seconds,
            }
        if self.options.shares.dp_shares:
            out["dp_shares"] = list(self.options.shares.dp_shares)
        if self.options.grad_sync.grad_compression != "none":
            out["grad_compression"] = self.options.grad_sync.grad_compression
        return out
