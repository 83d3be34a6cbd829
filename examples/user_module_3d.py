"""Your own LightningModule under data x tensor x pipeline parallelism.

    python examples/user_module_3d.py --tp 2 --pp 2          # 4 CPU processes (gloo)
    python examples/user_module_3d.py --tp 2 --dp 2 --steps 30

Lightning's launcher starts the other ranks by re-running this command. Three things make a model
work with `Parallel3DStrategy` (see lightning_dist/models/protocol.py):

1. **Build on the meta device and hand the model to the strategy** in `configure_model()`:
   `self.model = self.trainer.strategy.parallelize_model(model, init_seed=0)`. The strategy
   materialises it (`to_empty` + your `init_weights()`), applies TP, FSDP2 and the pipeline cut,
   and returns this rank's part.
2. **Tensor parallelism** reads `tp_plan`, a class attribute mapping module-name patterns (`*` is
   one name segment) to styles: "embedding", "colwise", "colwise_fused(n)" (one Linear holding
   n tensors, e.g. a fused qkv: never plain "colwise" there), "rowwise", "output" (and "norm"
   and "sp_input" for sequence parallelism). Attention must infer its local head count from shapes
   (`view(b, s, -1, head_dim)`), since each rank holds `n_heads / tp` heads.
3. **Pipeline parallelism** reads `pipeline_blocks` (the path of the ModuleList of repeated
   blocks; a stage keeps some of them and still iterates like a ModuleList), `pipeline_first`
   (modules only the first stage keeps) and `pipeline_last` (only the last stage). `forward`
   must accept hidden states when the embedding is None and return hidden states when the head
   is None. Under PP the returned model computes the loss itself: call
   `self.model(inputs, targets, loss_fn)`; it runs forward and backward over the microbatches
   and returns the batch's mean loss on every rank.

The loss needs no special handling: under tensor parallelism it is a DTensor (the logits stay
split along the vocabulary), which `self.log` and `self.trainer.strategy.reduce` accept as it
is. docs/BRING_YOUR_OWN_MODEL.md walks through a model like this one.
"""

from __future__ import annotations

import argparse
import math

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from lightning_dist import Parallel3DStrategy


class Attention(nn.Module):
    def __init__(self, dim: int, n_heads: int) -> None:
        super().__init__()
        self.head_dim = dim // n_heads
        self.q, self.k, self.v = (nn.Linear(dim, dim) for _ in range(3))
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        # -1 heads: under tensor parallelism this rank holds only some of them.
        q, k, v = (
            f(x).view(b, s, -1, self.head_dim).transpose(1, 2) for f in (self.q, self.k, self.v)
        )
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(out.transpose(1, 2).reshape(b, s, -1))


class Block(nn.Module):
    def __init__(self, dim: int, n_heads: int) -> None:
        super().__init__()
        self.norm_1, self.norm_2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim, n_heads)
        self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm_1(x))
        return x + self.down(F.gelu(self.up(self.norm_2(x))))


class TinyGPT(nn.Module):
    tp_plan = {
        "embed": "embedding",
        "blocks.*.attn.q": "colwise",
        "blocks.*.attn.k": "colwise",
        "blocks.*.attn.v": "colwise",
        "blocks.*.attn.proj": "rowwise",
        "blocks.*.up": "colwise",
        "blocks.*.down": "rowwise",
        "head": "output",
    }
    pipeline_blocks = "blocks"
    pipeline_first = ("embed", "pos")
    pipeline_last = ("norm", "head")

    def __init__(self, vocab: int = 256, dim: int = 64, n_heads: int = 4, n_layers: int = 4,
                 seq_len: int = 32) -> None:  # fmt: skip
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq_len, dim)
        self.blocks = nn.ModuleList(Block(dim, n_heads) for _ in range(n_layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:  # first stage: token ids in
            positions = torch.arange(x.shape[1], device=x.device)
            x = self.embed(x) + self.pos(positions)
        for block in self.blocks:
            x = block(x)
        if self.head is not None:  # last stage: logits out
            x = self.head(self.norm(x))
        return x

    @torch.no_grad()
    def init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                module.reset_parameters()


class UserLM(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.model: nn.Module | None = None
        self.losses: list[float] = []

    def configure_model(self) -> None:
        if self.model is None:
            with torch.device("meta"):
                model = TinyGPT()
            self.model = self.trainer.strategy.parallelize_model(model, init_seed=0)

    def loss_fn(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        inputs, targets = batch[:, :-1], batch[:, 1:]
        if getattr(self.model, "computes_loss", False):  # pipeline: forward + backward here
            loss = self.model(inputs, targets, self.loss_fn)
        else:
            loss = self.loss_fn(self.model(inputs), targets)
        self.losses.append(float(self.trainer.strategy.reduce(loss)))
        self.log("loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.model.parameters(), lr=3e-3)


def patterned_tokens(n: int, seq_len: int = 33, vocab: int = 256) -> torch.Tensor:
    """Sequences that count up from a random start: learnable, so the loss visibly falls."""
    start = torch.randint(0, vocab, (n, 1), generator=torch.Generator().manual_seed(0))
    return (start + torch.arange(seq_len)) % vocab


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--pp", type=int, default=2)
    parser.add_argument("--dp", type=int, default=1)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    strategy = Parallel3DStrategy(
        tp=args.tp, pp=args.pp, dp_shard=args.dp, process_group_backend="gloo"
    )
    # Each data-parallel rank gets its own shard of the batches; TP and PP peers the same one.
    loader = DataLoader(patterned_tokens(1024), batch_size=8, shuffle=True)
    trainer = L.Trainer(
        accelerator="cpu", devices=args.tp * args.pp * args.dp, strategy=strategy,
        max_steps=args.steps, logger=False, enable_checkpointing=False,
        enable_model_summary=False, gradient_clip_val=1.0,
    )  # fmt: skip
    module = UserLM()
    trainer.fit(module, loader)
    if trainer.is_global_zero:
        first, last = module.losses[0], module.losses[-1]
        print(f"loss {first:.3f} -> {last:.3f} (ln vocab = {math.log(256):.3f})", flush=True)


if __name__ == "__main__":
    main()
