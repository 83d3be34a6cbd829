"""A user's own Lightning script whose layout its world cannot hold: `Parallel3DStrategy(tp=2,
pp=2)` on 2 CPU ranks, refused after Lightning's launcher has started both
(tests/e2e/test_bad_inputs_e2e.py counts the lines it prints)."""

import lightning as L
import torch
from torch.utils.data import DataLoader

from lightning_dist import Parallel3DStrategy


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 4)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return self.layer(batch).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


if __name__ == "__main__":
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=Parallel3DStrategy(tp=2, pp=2),
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    trainer.fit(Tiny(), DataLoader(torch.randn(8, 4), batch_size=2))
