"""The one description of a Llama-style model: its shape, parameter count and training FLOPs;
`MoEShape` adds the mixture of experts (total and active parameters, FLOPs of the active path).

The model builder, the planner and the FLOP counter (MFU) all read this shape (as `ModelArgs`
and `MoEArgs`, `args.py`, which add `build()`), so a flavor described here is described
everywhere. Nothing in this file allocates a tensor, and it imports nothing of the package:
`llama.py` and `moe.py` annotate with the shapes and `args.py` builds their models, with no
import circle between them.
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


SCORE_FUNCS = ("softmax", "sigmoid")
"""How a router turns its logits into expert scores (`MoEShape.score_func`)."""


@dataclass(kw_only=True)
class MoEShape(LlamaShape):
    """Shape of a mixture-of-experts decoder: `LlamaShape` whose feed-forward networks (after
    the first `first_k_dense` layers) are routed SwiGLU experts (`lightning_dist.models.moe`).

    Routing is dropless: every token reaches its `top_k` experts, however uneven the load (no
    capacity factor, no dropped tokens). The fields below are the MoE options; the counts
    (`num_params`, `active_params`, ...) and FLOPs follow, as `LlamaShape`'s do.
    """

    num_experts: int = 8
    """Routed experts in each MoE layer (Mixtral 8, DeepSeek-V3 256)."""
    top_k: int = 2
    """Experts each token is routed to, from 1 to `num_experts` (Mixtral 2, DeepSeek-V3 8)."""
    expert_hidden_size: int | None = None
    """Width of each routed expert's SwiGLU MLP (DeepSeek-V3 2048); None: `hidden_dim`, the dense
    MLP's width (Mixtral, whose experts are whole Mistral MLPs)."""
    n_shared_experts: int = 0
    """Shared experts, which every token goes through beside its routed ones (DeepSeek-V3 1);
    they run as one SwiGLU MLP `n_shared_experts x expert_hidden_size` wide."""
    first_k_dense: int = 0
    """The first layers keep a dense SwiGLU MLP `hidden_dim` wide (DeepSeek-V3's
    `first_k_dense_replace`, 3); the others are MoE layers."""
    score_func: str = "softmax"
    """Router scores from its float32 logits: `softmax` over the experts (Mixtral) or an
    independent `sigmoid` per expert (DeepSeek-V3)."""
    route_norm: bool = True
    """Rescale each token's top-k scores to sum to 1 before they weight the experts' outputs
    (Mixtral's softmax over its top-2 logits; DeepSeek-V3's `norm_topk_prob`)."""
    route_scale: float = 1.0
    """Factor on the routing weights (DeepSeek-V3's `routed_scaling_factor`, 2.5)."""
    aux_loss_coeff: float = 0.0
    """Weight of the load-balancing loss added to the LM loss; 0 turns it off.

    The statistic is per sequence (DeepSeek-V3's sequence-wise balance loss), so that it is the
    same whatever the layout: for each sequence b of T tokens and each layer,
    L_b = sum_i f_bi * P_bi, where f_bi = E / (k T) x (tokens of b routed to expert i) and P_bi
    is the mean over b's tokens of expert i's score (scores rescaled to sum to 1 per token);
    L_b = 1 when the load is balanced. A micro-batch's loss is aux_loss_coeff x the mean of L_b
    over its sequences, summed over the MoE layers. Every micro-batch (data-parallel rank,
    gradient-accumulation step, pipeline microbatch) holds whole sequences and as many of them,
    so the mean over micro-batches, taken exactly like that of the token-mean LM loss, is the
    mean over the global batch's sequences: one device's value. Only a layout that splits a
    sequence (context parallelism) must add up the sequence's sums across ranks, through the
    `MoE.sequence_sum` seam. A batch-level statistic (Switch/Mixtral) would instead depend on
    how the batch is cut into micro-batches."""
    bias_update_rate: float = 0.0
    """Rate of DeepSeek-V3's auxiliary-loss-free balancing; 0 turns it off (DeepSeek-V3 1e-3).
    Each MoE layer keeps a per-expert bias (buffer `router.expert_bias`, saved in checkpoints)
    that is added to the scores to choose the top-k experts, never to weight their outputs.
    After every optimizer step it moves by this rate towards balance: +rate for each expert that
    got fewer tokens than the mean over experts in the whole step (every micro-batch on every
    rank), -rate for each that got more."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_experts < 1:
            raise ValueError(f"model.num_experts={self.num_experts} must be 1 or more")
        if not 1 <= self.top_k <= self.num_experts:
            raise ValueError(
                f"model.top_k={self.top_k} must be from 1 to model.num_experts={self.num_experts}"
                f" (each token's experts are distinct); set model.top_k<={self.num_experts}"
            )
        if self.score_func not in SCORE_FUNCS:
            raise ValueError(
                f"model.score_func={self.score_func!r} is not one of {', '.join(SCORE_FUNCS)}"
            )
        if not 0 <= self.first_k_dense < self.n_layers:
            raise ValueError(
                f"model.first_k_dense={self.first_k_dense} must be from 0 to model.n_layers - 1 = "
                f"{self.n_layers - 1}, so that at least one layer is an MoE layer"
            )
        if self.expert_hidden_size is not None and self.expert_hidden_size <= 0:
            raise ValueError(
                f"model.expert_hidden_size={self.expert_hidden_size} must be positive (or null: "
                "the dense MLP's width)"
            )
        for name in ("n_shared_experts", "aux_loss_coeff", "bias_update_rate"):
            if getattr(self, name) < 0:
                raise ValueError(f"model.{name}={getattr(self, name)} must be 0 (off) or more")
        if self.route_scale <= 0:
            raise ValueError(f"model.route_scale={self.route_scale} must be positive")

    @property
    def expert_dim(self) -> int:
        """Width of each routed expert's SwiGLU MLP (`expert_hidden_size`, else `hidden_dim`)."""
        return self.expert_hidden_size or self.hidden_dim

    @property
    def moe_layers(self) -> range:
        """Indices of the MoE layers (the others have a dense MLP)."""
        return range(self.first_k_dense, self.n_layers)

    # --- counts -----------------------------------------------------------------------------

    def expert_params(self) -> int:
        """Parameters of one routed expert (w1, w3, w2 of a SwiGLU MLP `expert_dim` wide)."""
        return 3 * self.dim * self.expert_dim

    def moe_layer_params(self) -> int:
        """Parameters of one MoE layer's feed-forward part: router, routed and shared experts."""
        shared = self.n_shared_experts * self.expert_params()
        return self.dim * self.num_experts + self.num_experts * self.expert_params() + shared

    def layer_params(self, layer: int) -> int:
        """Parameters of block `layer`: dense blocks as `LlamaShape.block_params()`."""
        dense = super().block_params()
        if layer not in self.moe_layers:
            return dense
        return dense - 3 * self.dim * self.hidden_dim + self.moe_layer_params()

    def block_params(self) -> int:
        """Parameters of one MoE block (attention, router, experts, norms). The first
        `first_k_dense` blocks are dense and smaller: `layer_params(i)` counts each."""
        return self.layer_params(self.first_k_dense)

    def active_layer_params(self, layer: int) -> int:
        """Parameters block `layer` applies to one token: an MoE block's router, its `top_k`
        routed experts and the shared ones (the other experts' weights never see the token)."""
        if layer not in self.moe_layers:
            return self.layer_params(layer)
        idle = (self.num_experts - self.top_k) * self.expert_params()
        return self.layer_params(layer) - idle

    def num_params(self) -> int:
        """Total trainable parameters, as a meta-device model reports them."""
        return self._count(self.layer_params)

    def active_params(self) -> int:
        """Parameters that act on each token (embedding and output included, as the published
        Mixtral 12.9B and DeepSeek-V3 37B count them)."""
        return self._count(self.active_layer_params)

    def _count(self, per_layer) -> int:
        output = 0 if self.tie_embeddings else self.vocab_size * self.dim
        layers = sum(per_layer(i) for i in range(self.n_layers))
        return self.embedding_params() + layers + self.dim + output

    def train_flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token of the active path: 6 x the active matmul weights (the
        router, the token's `top_k` routed experts and the shared ones, attention and the output
        projection; no norms, no embedding lookup) plus `LlamaShape`'s attention term. MFU from
        it is MFU from active parameters (6 x active N per token); the grouped matmul's idle
        experts cost nothing and are not counted."""
        matmul = sum(self.active_layer_params(i) - 2 * self.dim for i in range(self.n_layers))
        matmul += self.vocab_size * self.dim
        return 6.0 * matmul + 12.0 * self.n_layers * self.dim * seq_len
