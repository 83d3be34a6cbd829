"""CausalLM: the next-token LightningModule every strategy trains.

The model is built on the meta device in `configure_model()` (the Lightning convention) and then
either handed to the strategy's `parallelize_model(model)` hook, which applies tensor, data and
pipeline parallelism and materialises each rank's shard, or materialised whole on this device.
That is the only place a strategy touches the module, so new strategies need no change here.
"""

from __future__ import annotations

import math
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor
from torchmetrics.text import Perplexity

from lightning_dist._compat import attached_trainer
from lightning_dist.checkpoint.canonical import WRAPPER_SEGMENTS
from lightning_dist.contract import contract_of
from lightning_dist.lm.chunked_loss import chunked_cross_entropy, defer_output_head
from lightning_dist.lm.experts import ExpertStats
from lightning_dist.mesh.reductions import mean_over_ranks, sum_over_ranks
from lightning_dist.models.documents import document_positions
from lightning_dist.models.materialize import materialize
from lightning_dist.models.moe import (
    moe_layers,
    take_aux_loss,
    take_step_loads,
    update_expert_biases,
)
from lightning_dist.options.optim import OptimOptions
from lightning_dist.parallel.context_parallel import context_parallel_of, shard_sequences

IGNORE = -100
"""The target of a masked position (cross-entropy's default ignore_index): it adds no loss."""


def _loss_scale(batch: dict, trained: torch.Tensor) -> float:
    """Targets over trained targets: of the step's global batch when the sampler sent it
    (`loss_scale`, training), else of this batch (validation, a batch outside a Trainer)."""
    if "loss_scale" in batch:
        return float(batch["loss_scale"].flatten()[0])
    count = int(trained.sum())
    return trained.numel() / count if count else 0.0


class CausalLM(L.LightningModule):
    """Next-token prediction over batches of `seq_len + 1` token windows."""

    def __init__(
        self,
        model_spec: Any,
        *,
        optim: OptimOptions | None = None,
        init_seed: int = 0,
    ) -> None:
        super().__init__()
        self.model_spec = model_spec
        self.optim = optim or OptimOptions()
        """The optimizer and schedule settings (`optim.*`, options/optim.py)."""
        self.init_seed = init_seed
        self.model: torch.nn.Module | None = None
        self._matrix_names: set[str] = set()
        self.val_perplexity = Perplexity(ignore_index=IGNORE)
        self.step_losses: list[float] = []
        """Global train loss of each optimizer step (mean over ranks and micro-batches)."""
        self.val_losses: list[float] = []
        """Global validation loss of each validation run."""
        self.val_steps: list[int] = []
        """The optimizer step after which each validation ran (1-based, as in the console)."""
        self.val_losses_by_source: dict[str, list[float]] = {}
        """A mixture of several sources: each source's validation loss of each validation run
        (`val/loss/<name>`; the datamodule's `val_batch_sources` names each batch's source)."""
        self._loss_sum = torch.zeros(())
        self._micro_steps = 0
        self._loss_scale: float | None = None
        """The batch's loss scale under a loss mask (`loss_fn`), None without one."""
        self._ppl_from_loss = False
        self.loss_chunk_tokens = int(getattr(model_spec, "loss_chunk_tokens", 0) or 0)
        """Tokens per chunk of a loss that never holds the whole logits; 0: plain loss."""
        self._heads: list[torch.nn.Module] = []
        """The deferred output projection (a plain list: not registered as a submodule)."""
        self._context = None
        """The model's context-parallel attention step, if any: each rank then computes its
        chunks of every sequence (`parallel/context_parallel.py`)."""
        self._experts: list = []
        """The model's mixture-of-experts layers (`models/moe.py`), none for a dense model."""
        self._aux_sum = torch.zeros(())
        self.expert_stats: ExpertStats | None = None
        """Each step's expert loads and auxiliary loss (MoE models; summary.json's `moe`)."""

    # --- model --------------------------------------------------------------------------------

    def configure_model(self) -> None:
        if self.model is not None:
            return
        with torch.device("meta"):  # nothing is allocated until the layout is known
            model = self.model_spec.build()
        # Weight decay goes by each parameter's original rank; FSDP1 shows flat 1-D shards later.
        self._matrix_names = {n for n, p in model.named_parameters() if p.ndim >= 2}
        # The chunked loss applies the output projection itself, so the model returns the
        # final hidden states; a model that names no `output_head` keeps the plain loss.
        deferred = self.loss_chunk_tokens > 0 and defer_output_head(model) is not None
        parallelize = (
            getattr(self.trainer.strategy, "parallelize_model", None)
            if attached_trainer(self)
            else None
        )
        if parallelize is not None:
            self.model = parallelize(model, init_seed=self.init_seed)
        else:
            self.model = materialize(model, self.device, self.init_seed)
        if deferred:
            # After parallelisation: under PP the head is on the last stage (a copy or not).
            self._heads = [m for m in self.model.modules() if getattr(m, "defers_logits", False)]
        self._context = context_parallel_of(self.model)
        self._experts = moe_layers(self.model)
        # A pipeline rank whose stages hold no MoE layer (first_k_dense) still takes part.
        if self._experts or getattr(self.model, "mixture_of_experts", False):
            self.expert_stats = ExpertStats.of(self.model_spec)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """The model's output: logits, or the final hidden states under a chunked loss."""
        return self.model(tokens)

    def loss_fn(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy; also the loss each pipeline microbatch runs.

        With a chunked loss the model's output is the final hidden states, and the output
        projection is applied here, `loss_chunk_tokens` tokens at a time. Its weight is read
        after the model's forward: FSDP keeps the root unit (which holds it) gathered until
        backward.
        """
        scale = self._loss_scale
        if self._heads:
            weight = self._heads[0].weight
            loss = chunked_cross_entropy(logits, weight, targets, self.loss_chunk_tokens)
        elif scale is None:
            loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        else:
            flat = logits.flatten(0, 1).float()
            loss = F.cross_entropy(flat, targets.flatten(), reduction="sum") / targets.numel()
        if scale is not None:
            # A loss mask (supervised fine-tuning): masked targets are IGNORE and add nothing
            # to the sum; `scale` is the global batch's targets over its trained ones, so the
            # mean of these over micro-batches, pipeline microbatches and ranks (every one
            # holds as many targets) is the mean over the global batch's trained targets.
            loss = loss * scale
        # With loss parallelism the logits, and so the loss, are DTensors; hand on a plain one.
        return loss.full_tensor() if isinstance(loss, DTensor) else loss

    def _loss(self, batch) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        # A batch of packed documents (`data.pack_documents`) is a dict of the windows'
        # "tokens" and their "documents" (ids); otherwise the token windows themselves.
        tokens = batch["tokens"] if isinstance(batch, dict) else batch
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        extra = {}
        self._loss_scale = None
        if isinstance(batch, dict) and "loss_mask" in batch:
            # Supervised fine-tuning: only the trained targets count (`lm/chat.py`); the
            # mask rides in the targets, so it is split with them below (context parallelism)
            # and cut with them into pipeline microbatches.
            trained = batch["loss_mask"][:, 1:].bool()
            targets = targets.masked_fill(~trained, IGNORE)
            self._loss_scale = _loss_scale(batch, trained)
        if isinstance(batch, dict) and "documents" in batch:  # positions restart per document
            documents = batch["documents"][:, :-1]
            extra = {"positions": document_positions(documents), "documents": documents}
        if self._context is not None:
            # Context parallelism: this rank's chunks of every sequence, inputs and targets
            # alike, at their true positions (and documents).
            inputs, targets, extra = shard_sequences(self._context, inputs, targets, extra)
        if getattr(self.model, "computes_loss", False):
            # A pipeline: the stages run forward (and backward, in training) over microbatches
            # and return the batch's mean loss on every rank; no rank has the whole logits.
            return self.model(inputs, targets, self.loss_fn, **extra), None, targets
        logits = self.model(inputs, **extra)
        # With a chunked loss these are hidden states, not logits: no perplexity from them.
        return self.loss_fn(logits, targets), None if self._heads else logits, targets

    # --- training -----------------------------------------------------------------------------

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss, _, _ = self._loss(batch)
        aux = self._take_aux_loss()
        if aux is not None:
            # Both are micro-batch means, so Lightning's mean over micro-batches (and the mean
            # over ranks) treats the load-balancing loss as the LM loss (MoEShape.aux_loss_coeff).
            # Under a pipeline both are values, already differentiated by the schedule.
            self._aux_sum = self._aux_sum.to(aux.device) + aux.detach()
            loss = loss + aux
        self._loss_sum = self._loss_sum.to(loss.device) + loss.detach()
        self._micro_steps += 1
        return loss

    def _take_aux_loss(self) -> torch.Tensor | None:
        """The last forward's load-balancing loss: the MoE layers' (None for a dense model),
        or a pipeline's over all its stages (`PipelinedModel.take_aux_loss`)."""
        if self.expert_stats is None:
            return None
        pipeline = getattr(self.model, "take_aux_loss", None)
        return pipeline() if pipeline is not None else take_aux_loss(self._experts)

    def on_before_optimizer_step(self, optimizer: Any) -> None:
        # Every micro-batch of this optimizer step has run forward and backward. Logging here,
        # not in on_train_batch_end (which runs after the callbacks' hooks), lets the progress
        # line of step N show step N's loss, as summary.json and the loggers do.
        if not self._micro_steps:
            return
        # Average over micro-batches, then over replica groups (strategy=ft_hsdp), then ranks;
        # under speed-weighted shares a rank's mean counts by its micro-batches (loss_weight).
        strategy = contract_of(self.trainer.strategy)
        local = self._loss_sum / self._micro_steps * strategy.loss_weight()
        global_loss = mean_over_ranks(strategy.mean_over_replica_groups(local))
        self._loss_sum = torch.zeros((), device=global_loss.device)
        if self.expert_stats is not None:
            self._expert_step(self._aux_sum / self._micro_steps)
        self._micro_steps = 0
        value = float(global_loss)
        self.step_losses.append(value)
        self.log("train/loss", value, prog_bar=True, rank_zero_only=True)

    def _expert_step(self, local_aux: torch.Tensor) -> None:
        """After the step's last micro-batch: the step's expert loads and auxiliary loss over
        every rank (one all-reduce), the auxiliary-loss-free bias update, their metrics.

        Each rank's table has a row per layer of the whole model, zero where it holds no such
        layer, so the sum over all ranks is, for every layer, a positive multiple of its
        tokens per expert over the whole step, whatever the layout (a rank's micro-batches are
        all counted; under pipeline or tensor parallelism each layer has as many holders). The
        bias update's sign rule and the shares logged read only ratios of it."""
        spec = self.model_spec
        device = self._loss_sum.device
        loads = take_step_loads(self._experts, spec.n_layers, spec.num_experts, device)
        packed = torch.cat([loads.flatten(), local_aux.to(device, torch.float64).view(1)])
        # Summed, not averaged: whole token counts stay exact in float64, so an expert whose
        # load equals the mean moves its bias in no layout (a mean's rounding could).
        packed, ranks = sum_over_ranks(packed)
        loads, aux = packed[:-1].view_as(loads), float(packed[-1]) / ranks
        self._aux_sum = torch.zeros((), device=device)
        update_expert_biases(self._experts, loads)
        metrics = self.expert_stats.record(loads, aux if spec.aux_loss_coeff else None)
        for name, value in metrics.items():
            self.log(name, value, rank_zero_only=True)

    # --- validation ---------------------------------------------------------------------------

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        loss, logits, targets = self._loss(batch)
        self.log("val/loss", loss, sync_dist=True, prog_bar=True)
        sources = self._val_batch_sources()
        if sources:
            # Every rank's batch_idx-th batch comes from the same source (whole micro-batches
            # of each, in source order), so the per-source means sync like val/loss.
            self.log(f"val/loss/{sources[batch_idx]}", loss, sync_dist=True)
        self._ppl_from_loss = logits is None or isinstance(logits, DTensor)
        if not self._ppl_from_loss:
            self.val_perplexity.update(logits.float(), targets)
            self.log("val/ppl", self.val_perplexity)

    def on_validation_epoch_end(self) -> None:
        val = self.trainer.callback_metrics.get("val/loss")
        if val is not None and not self.trainer.sanity_checking:
            self.val_losses.append(float(val))
            self.val_steps.append(int(self.trainer.global_step))
            for name in dict.fromkeys(self._val_batch_sources()):
                value = self.trainer.callback_metrics.get(f"val/loss/{name}")
                if value is not None:
                    self.val_losses_by_source.setdefault(name, []).append(float(value))
            if self._ppl_from_loss:
                # Pipeline or vocab-split logits: every batch has as many tokens, so the
                # perplexity is exp of the mean loss.
                self.log("val/ppl", torch.exp(val))

    def _val_batch_sources(self) -> list[str]:
        datamodule = getattr(self.trainer, "datamodule", None) if attached_trainer(self) else None
        return list(getattr(datamodule, "val_batch_sources", None) or [])

    # --- optimisation -------------------------------------------------------------------------

    def configure_optimizers(self) -> dict[str, Any]:
        decay, no_decay = [], []
        for name, param in self.model.named_parameters():
            if param.requires_grad:
                # Norm weights and biases are vectors; decaying them only hurts.
                matrix = param.ndim >= 2
                if self._matrix_names:
                    matrix = WRAPPER_SEGMENTS.sub("", name) in self._matrix_names
                (decay if matrix else no_decay).append(param)
        o = self.optim
        optimizer = torch.optim.AdamW(
            [
                {"params": decay, "weight_decay": o.weight_decay},
                {"params": no_decay, "weight_decay": 0.0},
            ],
            lr=o.lr,
            betas=tuple(o.betas),
            eps=o.eps,
        )
        schedule = warmup_cosine(o.warmup_steps, self.trainer.max_steps, o.min_lr_ratio)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }


def warmup_cosine(warmup_steps: int, total_steps: int, min_ratio: float):
    """LR multiplier: linear warm-up, then a cosine decay to `min_ratio` at `total_steps`."""

    def multiplier(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return multiplier
