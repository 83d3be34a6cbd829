"""The one description of a Llama-style model: its shape, parameter count and training FLOPs.

The model builder, the planner and the FLOP counter (MFU) all read this shape (as `ModelArgs`,
`args.py`, which adds `build()`), so a flavor described here is described everywhere. Nothing
in this file allocates a tensor, and it imports nothing of the package: `llama.py` annotates
with `LlamaShape` and `args.py` builds `llama.py`'s model, with no import circle between them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(kw_only=True)
class LlamaShape:
    """Shape of a Llama-style decoder (RMSNorm, RoPE, SwiGLU, grouped-query attention)."""

    dim: int = 256
    """Width of the residual stream."""
    n_layers: int = 4
    """Number of transformer blocks."""
    n_heads: int = 4
    """Number of query heads; `dim` must be divisible by it."""
    n_kv_heads: int | None = None
    """Number of key/value heads (grouped-query attention); None means `n_heads`."""
    vocab_size: int = 512
    """Rows of the embedding and of the output projection."""
    ffn_hidden_size: int | None = None
    """Width of the SwiGLU MLP; None derives it the Llama way from `multiple_of`."""
    multiple_of: int = 256
    """Round the derived MLP width up to a multiple of this."""
    ffn_dim_multiplier: float | None = None
    """Scale of the derived MLP width (Llama 3 uses 1.3 for 70B, 1.2 for 405B)."""
    norm_eps: float = 1e-5
    """Epsilon of every RMSNorm."""
    rope_theta: float = 10000.0
    """Base of the rotary position embedding."""
    max_seq_len: int = 2048
    """Longest sequence the rotary table is built for."""
    tie_embeddings: bool = False
    """Share the embedding matrix with the output projection."""
    init_std: float = 0.02
    """Standard deviation of the normal initialisation of linear and embedding weights."""
    loss_chunk_tokens: int = 0
    """Tokens per chunk of the training loss, which then never holds the whole logits (the
    output projection runs chunk by chunk inside the loss, recomputed in backward;
    `lightning_dist.lm.chunked_loss`). 0 computes the logits of the whole batch at once."""

    def __post_init__(self) -> None:
        if self.loss_chunk_tokens < 0:
            raise ValueError(
                f"model.loss_chunk_tokens={self.loss_chunk_tokens} must be 0 (off) or positive"
            )
        for name in ("dim", "n_layers", "n_heads", "vocab_size", "max_seq_len"):
            if getattr(self, name) <= 0:
                raise ValueError(f"model.{name}={getattr(self, name)} must be positive")
        if self.dim % self.n_heads:
            raise ValueError(
                f"model.dim={self.dim} is not divisible by model.n_heads={self.n_heads}"
            )
        if self.kv_heads <= 0 or self.n_heads % self.kv_heads:
            raise ValueError(
                f"model.n_heads={self.n_heads} is not divisible by model.n_kv_heads={self.kv_heads}"
            )

    @property
    def kv_heads(self) -> int:
        """Key/value heads after resolving the `None` default."""
        return self.n_kv_heads or self.n_heads

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def hidden_dim(self) -> int:
        """Width of the SwiGLU MLP (explicit, or derived as in the Llama reference code)."""
        if self.ffn_hidden_size is not None:
            return self.ffn_hidden_size
        hidden = int(2 * (4 * self.dim) / 3)
        if self.ffn_dim_multiplier is not None:
            hidden = int(self.ffn_dim_multiplier * hidden)
        return self.multiple_of * ((hidden + self.multiple_of - 1) // self.multiple_of)

    # --- counts -----------------------------------------------------------------------------

    def block_params(self) -> int:
        """Parameters of one transformer block: attention, MLP and its two norms."""
        kv_dim = self.kv_heads * self.head_dim
        attention = self.dim * self.dim * 2 + self.dim * kv_dim * 2  # wq, wo, wk, wv
        mlp = 3 * self.dim * self.hidden_dim  # w1 (gate), w3 (up), w2 (down)
        return attention + mlp + 2 * self.dim

    def embedding_params(self) -> int:
        return self.vocab_size * self.dim

    def num_params(self) -> int:
        """Total trainable parameters, as a meta-device model reports them."""
        output = 0 if self.tie_embeddings else self.vocab_size * self.dim
        return self.embedding_params() + self.n_layers * self.block_params() + self.dim + output

    def train_flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token: 6N over the matmul weights plus the attention term.

        N leaves out the embedding lookup (a gather, not a matmul) but keeps the output
        projection, tied or not. The attention term 12 * n_layers * dim * seq_len counts the
        QK^T and AV matmuls of forward and backward without a causal discount, as the PaLM paper
        and torch's FLOP counter do. Recomputation (activation checkpointing) is not counted.
        """
        matmul_params = (
            self.n_layers * (self.block_params() - 2 * self.dim) + self.vocab_size * self.dim
        )
        return 6.0 * matmul_params + 12.0 * self.n_layers * self.dim * seq_len
