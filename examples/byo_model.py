"""Bring your own model: one LightningModule, unchanged under eight layouts.

`python examples/byo_model.py --layout tp` trains it on 2 CPU processes; the layouts are
single, fsdp_tuned, fsdp2, tp, pp (2 processes each but single), dp_tp, tp_pp (4) and 3d (8).
docs/BRING_YOUR_OWN_MODEL.md walks through this file.
"""

from __future__ import annotations

import argparse

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.strategies import Strategy
from torch import nn
from torch.utils.data import DataLoader

from lightning_dist import Parallel3DStrategy
from lightning_dist.models.materialize import materialize


class SelfAttention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.head_dim = width // heads
        self.query = nn.Linear(width, width, bias=False)
        self.key = nn.Linear(width, width, bias=False)
        self.value = nn.Linear(width, width, bias=False)
        self.out = nn.Linear(width, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Split into heads by head size, not head count: under tensor parallelism a rank holds
        # only some of the heads.
        q, k, v = (
            proj(x).unflatten(-1, (-1, self.head_dim)).transpose(1, 2)
            for proj in (self.query, self.key, self.value)
        )
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).flatten(2))


class FeedForward(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.hidden = nn.Linear(width, 4 * width)
        self.proj = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.hidden(x), approximate="tanh"))


class Layer(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.attn_norm = nn.LayerNorm(width)
        self.attn = SelfAttention(width, heads)
        self.mlp_norm = nn.LayerNorm(width)
        self.mlp = FeedForward(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class TinyLM(nn.Module):
    # Tensor parallelism: which layers to split, and how ("*" is one name segment).
    tp_plan = {
        "tokens": "embedding",
        "layers.*.attn.query": "colwise",
        "layers.*.attn.key": "colwise",
        "layers.*.attn.value": "colwise",
        "layers.*.attn.out": "rowwise",
        "layers.*.mlp.hidden": "colwise",
        "layers.*.mlp.proj": "rowwise",
        "head": "output",
    }
    # Pipeline parallelism: the repeated layers to cut, and what only the ends keep.
    pipeline_blocks = "layers"
    pipeline_first = ("tokens", "positions")
    pipeline_last = ("norm", "head")

    def __init__(self, vocab: int, width: int, heads: int, depth: int, seq_len: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(seq_len, width)
        self.layers = nn.ModuleList(Layer(width, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tokens is not None:  # None on later pipeline stages: x is then hidden states
            x = self.tokens(x) + self.positions(torch.arange(x.shape[1], device=x.device))
        for layer in self.layers:  # under pipeline parallelism: this stage's layers
            x = layer(x)
        if self.head is not None:  # None on earlier pipeline stages: return hidden states
            x = self.head(self.norm(x))
        return x

    @torch.no_grad()
    def init_weights(self) -> None:
        """Give every parameter its initial value (the model is built on the meta device)."""
        for module in self.modules():
            if module is not self and hasattr(module, "reset_parameters"):
                module.reset_parameters()


class ByoLM(L.LightningModule):
    def __init__(self, vocab: int = 256, width: int = 64, heads: int = 4, depth: int = 4,
                 seq_len: int = 32, lr: float = 3e-3) -> None:  # fmt: skip
        super().__init__()
        self.save_hyperparameters()
        self.model: nn.Module | None = None

    def configure_model(self) -> None:
        if self.model is not None:  # Lightning may call this hook more than once
            return
        h = self.hparams
        with torch.device("meta"):  # no memory is used until the strategy knows the layout
            model = TinyLM(h.vocab, h.width, h.heads, h.depth, h.seq_len)
        strategy = self.trainer.strategy
        if hasattr(strategy, "parallelize_model"):  # every lightning_dist strategy
            self.model = strategy.parallelize_model(model, init_seed=0)
        else:  # Lightning's own strategies (one device, DDP): the whole model on this device
            self.model = materialize(model, self.device, seed=0)

    def loss_fn(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        inputs, targets = batch[:, :-1], batch[:, 1:]
        if getattr(self.model, "computes_loss", False):
            # Pipeline parallelism: the stages run forward and backward over microbatches and
            # return the batch's mean loss on every rank.
            loss = self.model(inputs, targets, self.loss_fn)
        else:
            loss = self.loss_fn(self.model(inputs), targets)
        self.log("loss", loss, prog_bar=True, sync_dist=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)


def layouts() -> dict[str, tuple[str | Strategy, int, int]]:
    """name: (Trainer strategy, devices, data-parallel size). New strategy objects each call."""
    return {
        "single": ("auto", 1, 1),
        "fsdp_tuned": ("fsdp_tuned", 2, 2),  # FSDP1 with lightning_dist's defaults
        "fsdp2": ("fsdp2", 2, 2),  # FSDP2: each layer sharded over the 2 ranks
        "tp": (Parallel3DStrategy(tp=2), 2, 1),  # each rank holds half of every layer
        "pp": (Parallel3DStrategy(pp=2), 2, 1),  # each rank holds half of the layers
        "dp_tp": (Parallel3DStrategy(tp=2), 4, 2),  # FSDP2 over 2 groups of 2 TP ranks
        "tp_pp": (Parallel3DStrategy(tp=2, pp=2), 4, 1),  # 2 pipeline stages of 2 TP ranks
        "3d": (Parallel3DStrategy(tp=2, pp=2), 8, 2),  # FSDP2 x TP x PP
    }


def counting_tokens(n: int, seq_len: int, vocab: int, seed: int = 0) -> torch.Tensor:
    """`n` sequences of `seq_len + 1` tokens counting up from random starts (learnable)."""
    start = torch.randint(0, vocab, (n, 1), generator=torch.Generator().manual_seed(seed))
    return (start + torch.arange(seq_len + 1)) % vocab


def main() -> None:
    parser = argparse.ArgumentParser(description="Train TinyLM under one of the layouts.")
    parser.add_argument("--layout", choices=list(layouts()), default="tp")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--global-batch", type=int, default=8)
    args = parser.parse_args()
    strategy, devices, dp = layouts()[args.layout]
    # Each data-parallel rank reads its share of every batch; TP and PP peers read the same one.
    data = DataLoader(counting_tokens(1024, 32, 256), batch_size=args.global_batch // dp)
    trainer = L.Trainer(accelerator="cpu", devices=devices, strategy=strategy,
                        max_steps=args.steps, logger=False, enable_checkpointing=False)  # fmt: skip
    trainer.fit(ByoLM(), data)
    if trainer.is_global_zero:
        print(f"final loss {float(trainer.callback_metrics['loss']):.3f}")


if __name__ == "__main__":
    main()
