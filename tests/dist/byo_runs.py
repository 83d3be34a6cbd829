"""Train the docs' own-model example (examples/byo_model.py) under several layouts in one launch.

    python tests/dist/byo_runs.py OUT.json LAYOUT [LAYOUT ...]

Every layout named must use the same number of devices (Lightning's launcher starts the other
ranks once, by re-running this command), except `single`, which runs first on rank 0 alone.
Each run is 10 optimizer steps, fp32, on the same fixed sequence of global batches of 8: Lightning
would shuffle the training data under a distributed strategy but not on one device, so the data
module hands each data-parallel rank its share of batch k in order. The loss of every step is
what the module logs (`self.log("loss", ..., sync_dist=True)`), as a logger receives it. Rank 0
writes {layout: [loss per step]} to OUT.json.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import lightning as L
from lightning.pytorch.loggers import Logger
from torch.utils.data import DataLoader, DistributedSampler

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from byo_model import ByoLM, counting_tokens, layouts  # noqa: E402

STEPS, GLOBAL_BATCH, SEQ_LEN, VOCAB = 10, 8, 16, 64


class StepLosses(Logger):
    """Keeps the logged "loss" of every step (Lightning calls loggers on rank 0 only)."""

    def __init__(self) -> None:
        super().__init__()
        self.losses: list[float] = []

    @property
    def name(self) -> str:
        return "step_losses"

    @property
    def version(self) -> int:
        return 0

    def log_metrics(self, metrics, step=None) -> None:
        if "loss" in metrics:
            self.losses.append(float(metrics["loss"]))

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass


class FixedBatches(L.LightningDataModule):
    """Global batch k is samples 8k..8k+7 whatever the layout; each data-parallel rank reads
    every dp-th of them (TP and PP peers the same ones)."""

    def train_dataloader(self) -> DataLoader:
        data = counting_tokens(STEPS * GLOBAL_BATCH, SEQ_LEN, VOCAB, seed=1)
        shard = getattr(self.trainer.strategy, "distributed_sampler_kwargs", None)
        shard = shard or {"num_replicas": 1, "rank": 0}
        sampler = DistributedSampler(data, shuffle=False, **shard)
        return DataLoader(data, batch_size=GLOBAL_BATCH // shard["num_replicas"], sampler=sampler)


def train(layout: str) -> tuple[list[float], bool]:
    strategy, devices, _ = layouts()[layout]
    logger = StepLosses()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy=strategy,
        max_steps=STEPS,
        logger=logger,
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        precision="32-true",
        use_distributed_sampler=False,
    )
    module = ByoLM(vocab=VOCAB, width=32, heads=4, depth=4, seq_len=SEQ_LEN, lr=1e-2)
    trainer.fit(module, datamodule=FixedBatches())
    return logger.losses, trainer.is_global_zero


def main(out_path: str, names: list[str]) -> None:
    results, is_zero = {}, True
    for name in names:
        if name == "single" and os.environ.get("LOCAL_RANK", "0") != "0":
            continue  # a rank started by the launcher: the reference ran on rank 0 before it
        losses, is_zero = train(name)
        results[name] = losses
    if is_zero:
        Path(out_path).write_text(json.dumps(results))


if __name__ == "__main__":
    from lightning_dist.runtime.process_end import run_then_end

    run_then_end(main, sys.argv[1], sys.argv[2:])
