"""A GPT with a fused q/k/v projection (tests/fused_gpt.py) under Parallel3DStrategy, on 4 and 8 ranks.

`main(out_dir)` runs in every rank of a started world of 4 (tests/dist/world.py), each run a
Lightning `Trainer.fit` of 10 fp32 steps on the same fixed global batches of 8:

- `tp2_pp2`: tp=2 x pp=2 with `"colwise_fused(3)"`; saves `tp2_pp2.ckpt` at step 10;
- `tp2`: dp_replicate=2 x tp=2 (two TP groups of 2 ranks, each reading half of every batch);
- `fsdp_tp2`: dp_shard=2 x tp=2 (FSDP2 shards each part's rows over dp_shard); saves
  `fsdp_tp2.ckpt` at step 10;
- `resumed`: dp_shard=2 x tp=2 resuming from `tp2_pp2.ckpt` for steps 11 and 12;
- `resumed_from_fsdp`: the `tp2` layout resuming from `fsdp_tp2.ckpt` for steps 11 and 12;
- `unfused_tp2_pp2`: tp=2 x pp=2 with plain `"colwise"` on the fused projection.

`main_8(out_dir)` runs in a world of 8: `fsdp_tp2_pp2`, dp_shard=2 x tp=2 x pp=2 (FSDP2 on each
pipeline stage), saving `fsdp_tp2_pp2.ckpt` at step 10.

Each rank also trains the model on its own, one device, plain PyTorch (12 steps): the
reference. Rank 0 returns {run: [loss per step]}, the reference, and for each checkpoint the
largest difference between its weights (read whole in one process) and the reference's after
step 10.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from byo_runs import StepLosses  # noqa: E402

from lightning_dist import Parallel3DStrategy  # noqa: E402
from lightning_dist.models.materialize import materialize  # noqa: E402
from tests.fused_gpt import UNFUSED_PLAN, FusedGPT  # noqa: E402

STEPS, GLOBAL_BATCH, SEQ_LEN, VOCAB, LR = 10, 8, 16, 64, 1e-2


def batches(steps: int) -> torch.Tensor:
    """`steps` global batches of counting sequences (learnable), batch k = rows 8k..8k+7."""
    g = torch.Generator().manual_seed(1)
    start = torch.randint(0, VOCAB, (steps * GLOBAL_BATCH, 1), generator=g)
    return (start + torch.arange(SEQ_LEN + 1)) % VOCAB


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def reference(steps: int) -> tuple[list[float], dict[str, torch.Tensor]]:
    """One device, no Lightning: the losses of `steps` steps and the weights after STEPS."""
    with torch.device("meta"):
        model = FusedGPT(vocab=VOCAB, seq_len=SEQ_LEN)
    model = materialize(model, torch.device("cpu"), seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    losses, weights = [], {}
    for batch in batches(steps).split(GLOBAL_BATCH):
        loss = loss_fn(model(batch[:, :-1]), batch[:, 1:])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        if len(losses) == STEPS:
            weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return losses, weights


class FusedLM(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.model: nn.Module | None = None

    def configure_model(self) -> None:
        if self.model is None:
            with torch.device("meta"):
                model = FusedGPT(vocab=VOCAB, seq_len=SEQ_LEN)
            self.model = self.trainer.strategy.parallelize_model(model, init_seed=0)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        inputs, targets = batch[:, :-1], batch[:, 1:]
        if getattr(self.model, "computes_loss", False):  # pipeline parallelism
            loss = self.model(inputs, targets, loss_fn)
        else:
            loss = loss_fn(self.model(inputs), targets)
        self.log("loss", loss, sync_dist=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=LR)


class FixedBatches(L.LightningDataModule):
    """Global batch k at step k + 1 whatever the layout; each data-parallel rank reads its share
    of it. A run resumed at step `first` reads its loader from the start again (it is not
    resumable) and stops at the epoch's length: its loader starts at batch `first`."""

    def __init__(self, steps: int, first: int = 0) -> None:
        super().__init__()
        self.steps, self.first = steps, first

    def train_dataloader(self) -> DataLoader:
        data = batches(self.steps).roll(-self.first * GLOBAL_BATCH, dims=0)
        shard = self.trainer.strategy.distributed_sampler_kwargs
        sampler = DistributedSampler(data, shuffle=False, **shard)
        return DataLoader(data, batch_size=GLOBAL_BATCH // shard["num_replicas"], sampler=sampler)


def fit(
    strategy: Parallel3DStrategy, *, steps: int = STEPS, ckpt_path=None, save_to: Path | None = None
) -> list[float]:
    logger = StepLosses()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=int(os.environ["WORLD_SIZE"]),
        strategy=strategy,
        max_steps=steps,
        logger=logger,
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        precision="32-true",
        use_distributed_sampler=False,
    )
    first = STEPS if ckpt_path else 0
    trainer.fit(FusedLM(), datamodule=FixedBatches(steps, first), ckpt_path=ckpt_path)
    if save_to is not None:
        trainer.save_checkpoint(save_to)
    return logger.losses


def main(out_dir: str) -> dict:
    out, started = Path(out_dir), time.perf_counter()
    ref_losses, ref_weights = reference(STEPS + 2)
    ckpt, fsdp_ckpt = out / "tp2_pp2.ckpt", out / "fsdp_tp2.ckpt"
    tp2 = dict(tp=2, dp_replicate=2, dp_shard=1)  # two TP groups, each half of every batch
    fsdp_tp2 = dict(tp=2, dp_shard=2)
    runs = {
        "tp2_pp2": fit(Parallel3DStrategy(tp=2, pp=2), save_to=ckpt),
        "tp2": fit(Parallel3DStrategy(**tp2)),
        "fsdp_tp2": fit(Parallel3DStrategy(**fsdp_tp2), save_to=fsdp_ckpt),
        "resumed": fit(Parallel3DStrategy(**fsdp_tp2), steps=STEPS + 2, ckpt_path=ckpt),
        "resumed_from_fsdp": fit(Parallel3DStrategy(**tp2), steps=STEPS + 2, ckpt_path=fsdp_ckpt),
        "unfused_tp2_pp2": fit(Parallel3DStrategy(tp=2, pp=2, tp_plan=UNFUSED_PLAN)),
    }
    result = {"reference": ref_losses, **runs, "seconds": time.perf_counter() - started}
    if torch.distributed.get_rank() == 0:
        result["weights"] = sorted(ref_weights)
        result["weight_diff"] = {p.name: weight_diff(p, ref_weights) for p in (ckpt, fsdp_ckpt)}
    return result


def main_8(out_dir: str) -> dict:
    started = time.perf_counter()
    ref_losses, ref_weights = reference(STEPS)
    ckpt = Path(out_dir) / "fsdp_tp2_pp2.ckpt"
    losses = fit(Parallel3DStrategy(tp=2, pp=2, dp_shard=2), save_to=ckpt)
    result = {"reference": ref_losses, "fsdp_tp2_pp2": losses}
    if torch.distributed.get_rank() == 0:
        result["weight_diff"] = {ckpt.name: weight_diff(ckpt, ref_weights)}
    return {**result, "seconds": time.perf_counter() - started}


def weight_diff(ckpt: Path, ref_weights: dict[str, torch.Tensor]) -> dict[str, list[float]]:
    """The checkpoint's weights, read whole in one process, against the reference's after the
    same 10 steps: each tensor's largest difference (a fused bias by part, q, k, v)."""
    from lightning_dist.checkpoint.format import WEIGHTS, read_full_state

    saved = read_full_state(ckpt, WEIGHTS)
    assert sorted(k.removeprefix(WEIGHTS) for k in saved) == sorted(ref_weights), ckpt
    diffs = {}
    for name, value in ref_weights.items():
        diff = (saved[WEIGHTS + name] - value).abs()
        parts = diff.chunk(3) if name.endswith("qkv.bias") else [diff]
        diffs[name] = [part.max().item() for part in parts]
    return diffs
