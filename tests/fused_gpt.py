"""A from-scratch GPT with a fused q/k/v projection, in plain single-device PyTorch.

nanoGPT's shape: learned position embeddings, LayerNorm, one `Linear(C, 3C)` with a bias for
q, k and v (`.chunk(3, -1)` splits them), a GELU MLP, biases everywhere, an untied head. Its
`tp_plan` marks the fused projection `"colwise_fused(3)"`; `UNFUSED_PLAN` is the same plan with
plain `"colwise"` there, the silently wrong one (tests/dist/test_fused_projection_dist.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class CausalSelfAttention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.head_dim = width // heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Heads by head size, not count: under tensor parallelism a rank holds some of them.
        q, k, v = (
            t.unflatten(-1, (-1, self.head_dim)).transpose(1, 2) for t in self.qkv(x).chunk(3, -1)
        )
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).flatten(2))


class MLP(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, 4 * width)
        self.proj = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = MLP(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class FusedGPT(nn.Module):
    tp_plan = {
        "tok": "embedding",
        "blocks.*.attn.qkv": "colwise_fused(3)",
        "blocks.*.attn.proj": "rowwise",
        "blocks.*.mlp.fc": "colwise",
        "blocks.*.mlp.proj": "rowwise",
        "head": "output",
    }
    pipeline_blocks = "blocks"
    pipeline_first = ("tok", "pos")
    pipeline_last = ("ln_f", "head")

    def __init__(
        self, vocab: int = 64, width: int = 32, heads: int = 4, depth: int = 4, seq_len: int = 16
    ) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(seq_len, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(depth))
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tok is not None:  # None on later pipeline stages
            x = self.tok(x) + self.pos(torch.arange(x.shape[1], device=x.device))
        for block in self.blocks:
            x = block(x)
        if self.head is not None:  # None on earlier pipeline stages
            x = self.head(self.ln_f(x))
        return x

    @torch.no_grad()
    def init_weights(self) -> None:
        for module in self.modules():
            if module is not self and hasattr(module, "reset_parameters"):
                module.reset_parameters()


UNFUSED_PLAN = {**FusedGPT.tp_plan, "blocks.*.attn.qkv": "colwise"}
"""What the user first wrote: under tp=2 rank 0 gets all of q and half of k, not half of each."""
