"""Activation bytes one transformer block saves for backward, per token: what our
implementation keeps (`layer_activation_bytes`, the planner's number) and the minimum the math
needs (`analytic_layer_activation_bytes`, Korthikanti et al. 2022). docs/PLANNER.md derives
both and compares them with MemTracker's measurement.
"""

from __future__ import annotations

from lightning_dist.planner.settings import TrainSettings


def layer_activation_bytes(model, tp: int, settings: TrainSettings) -> float:
    """Bytes one block saves for backward, per token, on one TP rank.

    Derived from the ops of `lightning_dist.models.llama`, with d = dim, h = hidden_dim and
    w = bytes of a matmul input (4 in 32-true, else 2); sp = tp under sequence parallelism,
    else 1:

    - each RMSNorm saves its input (the residual stream, r = 2 bytes in bf16-true, else 4) and
      recomputes the normalised x in backward: 2 norms x r x d / sp bytes;
    - the projections' inputs: under bf16-mixed autocast casts the norm output once per linear
      (3 x 2d for wq/wk/wv, 2 x 2d for w1/w3 = 10d); in 32-true the five share one 4d tensor
      per norm (8d); in bf16-true 2d per norm (4d). Under TP without SP each rank keeps the
      whole (replicated) input. Under SP the input is all-gathered before the projections,
      but only the sequence shard is saved and backward gathers it again
      (`parallel/sequence_parallel.py`); under autocast the shard is cast before the gather,
      so the projections share one bf16 copy per sub-block: 4d. All divided by sp;
    - SDPA saves q, the head-repeated k and v, and its output: 4d x w over the heads, so
      divided by tp (`wo`'s input is a view of that output: SDPA lays it out as [b, s, h, hd]);
    - SwiGLU saves w1's output, silu's output, w3's output and their product: 4h x w / tp;
    - RoPE saves nothing but its constant tables; flash / memory-efficient SDPA keeps only a
      per-head log-sum-exp, while the math path adds the softmax and score matrices,
      2 x n_heads x s x w per token, divided by tp.

    Checked with saved-tensor hooks on a one-block model: exact in 32-true; bf16-mixed adds
    autocast's bf16 weight copies, which `buffer_bytes` counts. `analytic_layer_activation_bytes`
    is the minimum the math needs, for comparison.
    """
    d, h = model.dim, model.hidden_dim
    precision = settings.precision
    sp = tp if settings.sequence_parallel else 1
    w = 4 if precision == "32-true" else 2
    linear_inputs = {"32-true": 8 * d, "bf16-mixed": 10 * d, "bf16-true": 4 * d}[precision]
    if sp > 1:
        linear_inputs = (4 * d if precision == "bf16-mixed" else linear_inputs) / sp
    r = 2 if precision == "bf16-true" else 4
    norms = 2 * r * d / sp
    heads = (4 * d * w + 4 * h * w) / tp
    if settings.attention == "math":
        heads += 2 * model.n_heads * settings.seq_len * w / tp
    return norms + linear_inputs + heads


def analytic_layer_activation_bytes(model, tp: int, settings: TrainSettings) -> float:
    """The activation bytes per token of one block that backward cannot do without, on one TP
    rank: Korthikanti et al. (2022)'s count for a block of RMSNorm, grouped-query attention
    (flash), SwiGLU and no dropout (docs/PLANNER.md derives it). With r the residual stream's
    bytes (2 in bf16-true, else 4), w a matmul input's and kv = n_kv_heads x head_dim:

    - each norm's input (the residual stream), 2 x r x d, and output, the input of the
      projections, 2 x w x d, both split by the sequence under SP;
    - q, k and v as SDPA reads them (k and v not repeated over the query heads) and its
      output, which is `wo`'s input: w x (2d + 2kv) / tp;
    - SwiGLU: the two projections' outputs, silu's output and the product: 4 x w x h / tp.
    """
    d, h = model.dim, model.hidden_dim
    kv = model.dim // model.n_heads * (model.n_kv_heads or model.n_heads)
    w = 4 if settings.precision == "32-true" else 2
    r = 2 if settings.precision == "bf16-true" else 4
    sp = tp if settings.sequence_parallel else 1
    return (2 * r * d + 2 * w * d) / sp + (w * (2 * d + 2 * kv) + 4 * w * h) / tp
