"""A LightningModule written as a user would, trained with lightning_dist's strategies.

Run as a script (`python fsdp_user_module.py OUT.json`): Lightning's launcher starts rank 1 by
re-running the same command. Rank 0 writes what each run did to OUT.json.
"""

import json
import sys

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_dist import TunedFSDPStrategy


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(width, 2 * width), nn.Linear(2 * width, width)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(x)))


class Regressor(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(16, 32)
        self.blocks = nn.ModuleList(Block(32) for _ in range(3))
        self.head = nn.Linear(32, 1)
        self.losses = []

    def forward(self, x):
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.losses.append(float(self.trainer.strategy.reduce(loss.detach())))
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=3e-3)


def sharded_units(model: nn.Module) -> int:
    """FSDP1 wrappers, or modules that FSDP2's fully_shard turned into FSDP classes."""
    return sum(type(m).__name__ == "FullyShardedDataParallel" for m in model.modules())


def main(out_path: str) -> None:
    torch.manual_seed(0)
    x = torch.randn(256, 16)
    data = TensorDataset(x, x[:, :1] * 2 - x[:, 1:2])
    strategies = {
        "fsdp_tuned": "fsdp_tuned",
        "object": TunedFSDPStrategy(sharding_strategy="FULL_SHARD", auto_wrap=["Block"]),
        "fsdp2": "fsdp2",
    }
    results = {}
    for name, strategy in strategies.items():
        L.seed_everything(0, verbose=False)
        model = Regressor()
        trainer = L.Trainer(
            accelerator="cpu",
            devices=2,
            strategy=strategy,
            max_steps=30,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        trainer.fit(model, DataLoader(data, batch_size=16))
        results[name] = {
            "strategy": type(trainer.strategy).__name__,
            "units": sharded_units(trainer.strategy.model),
            "losses": model.losses,
        }
    if trainer.is_global_zero:
        with open(out_path, "w") as f:
            json.dump(results, f)


if __name__ == "__main__":
    from lightning_dist.runtime.process_end import run_then_end

    run_then_end(main, sys.argv[1])
