"""Activation bytes one transformer block saves for backward, per token: what our
implementation keeps (`layer_activation_bytes`, the planner's number) and the minimum the math
needs (`analytic_layer_activation_bytes`, Korthikanti et al. 2022). docs/PLANNER.md derives
both and compares them with MemTracker's measurement.

Under activation checkpointing a checkpointed block keeps less (`checkpointed_layer_bytes`:
its input, or under op-level checkpointing `selective_layer_bytes`) and recomputes the rest
while its backward runs (`recomputed_layer_bytes`).
"""

from __future__ import annotations

from lightning_dist.planner.experts import moe_mlp_bytes, moe_mlp_kept_bytes
from lightning_dist.planner.settings import TrainSettings


def layer_activation_bytes(model, tp: int, settings: TrainSettings, moe: bool = False) -> float:
    """Bytes one block saves for backward, per token, on one TP rank.

    Derived from the ops of `lightning_dist.models.llama`, with d = dim, h = hidden_dim and
    w = bytes of a matmul input (4 in 32-true, else 2); sp = tp under sequence parallelism,
    else 1:

    - each RMSNorm saves its input (the residual stream, r = `settings.residual_bytes`: 2 in
      bf16-true and under FSDP's bf16 parameters, else 4) and
      recomputes the normalised x in backward: 2 norms x r x d / sp bytes;
    - the projections' inputs, the norm outputs: the projections of a sub-block share one
      tensor per norm, 4d in 32-true, 2d in bf16-true and under bf16-mixed, where the norm
      returns the autocast dtype so that the linears do not cast one copy each (8d or 4d for
      the two norms). Under TP without SP each rank keeps the whole (replicated) input. Under
      SP the input is all-gathered before the projections, but only the sequence shard is
      saved and backward gathers it again (`parallel/sequence_parallel.py`). All divided by sp;
    - SDPA saves q, k and v (grouped-query attention runs in the kernel, so k and v are not
      repeated over the query heads: kv = n_kv_heads x head_dim each) and its output:
      (2d + 2kv) x w over the heads, so divided by tp (`wo`'s input is a view of that output:
      SDPA lays it out as [b, s, h, hd]);
    - SwiGLU saves w1's and w3's outputs (its product recomputes silu in backward) and w2
      saves its input, the product: 3h x w / tp;
    - RoPE saves nothing but its constant tables; flash / memory-efficient SDPA keeps only a
      per-head log-sum-exp, while the math path adds the softmax and score matrices,
      2 x n_heads x s x w per token, divided by tp.

    Checked with saved-tensor hooks on a one-block model: exact in 32-true; bf16-mixed adds
    autocast's bf16 weight copies, which `buffer_bytes` counts. `analytic_layer_activation_bytes`
    is the minimum the math needs, for comparison.
    """
    d, h = model.dim, model.hidden_dim
    sp = tp if settings.sequence_parallel else 1
    w, r = settings.matmul_bytes, settings.residual_bytes
    linear_inputs = 2 * w * d / sp
    kv = d // model.n_heads * (model.n_kv_heads or model.n_heads)
    norms = 2 * r * d / sp
    heads = ((2 * d + 2 * kv) * w + 3 * h * w) / tp
    if settings.attention == "math":
        heads += 2 * model.n_heads * settings.seq_len * w / tp
    if moe:  # an MoE block's feed-forward part instead of SwiGLU's (planner/experts.py)
        heads += moe_mlp_bytes(model, settings) - 3 * h * w / tp
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
    - SwiGLU: the two projections' outputs (silu's output is one pointwise op away from the
      gate, so it is not counted) and the product, which is `w2`'s input: 3 x w x h / tp.
    """
    d, h = model.dim, model.hidden_dim
    kv = model.dim // model.n_heads * (model.n_kv_heads or model.n_heads)
    w, r = settings.matmul_bytes, settings.residual_bytes
    sp = tp if settings.sequence_parallel else 1
    return (2 * r * d + 2 * w * d) / sp + (w * (2 * d + 2 * kv) + 3 * w * h) / tp


def analytic_checkpointed_layer_bytes(model, tp: int, settings: TrainSettings) -> float:
    """The analytic count under the settings' checkpointing: without it,
    `analytic_layer_activation_bytes`; under full, the block's input, r x d / sp; under op, the
    tensors its policy is defined to keep (the block's input, the outputs of the matmuls that
    are not partial sums, SDPA's output and log-sum-exp, and the reduced outputs of wo and w2:
    `selective_layer_bytes` derives them), so that a measurement above it shows the code
    keeping more than it means to."""
    mode = settings.activation_checkpointing.mode
    if mode == "none":
        return analytic_layer_activation_bytes(model, tp, settings)
    return checkpointed_layer_bytes(model, tp, settings)


def checkpointed_layer_bytes(
    model, tp: int, settings: TrainSettings, moe: bool = False, ep: int = 1
) -> float:
    """Bytes one block keeps per token on one TP rank under the settings' checkpointing, from
    its forward until its backward (recomputation not included; see `recomputed_layer_bytes`).

    - full (and every n-th block): only the block's input, the residual stream, r x d / sp;
    - op: `selective_layer_bytes`;
    - none: `layer_activation_bytes`.
    """
    mode = settings.activation_checkpointing.mode
    if mode == "full":
        sp = tp if settings.sequence_parallel else 1
        return settings.residual_bytes * model.dim / sp
    if mode == "op":
        return selective_layer_bytes(model, tp, settings, moe, ep)
    return layer_activation_bytes(model, tp, settings, moe)


def selective_layer_bytes(
    model, tp: int, settings: TrainSettings, moe: bool = False, ep: int = 1
) -> float:
    """Bytes one block keeps per token on one TP rank under op-level checkpointing.

    The op policy (`parallel/activation_checkpoint.py`, `SelectivePolicy`) caches the outputs
    of the block's matmuls, SDPA kernels and reducing collectives, except the matmuls of
    row-parallel linears; the checkpoint keeps the block's input. With r, w, sp and
    kv = n_kv_heads x head_dim as in `layer_activation_bytes`:

    - the block's input, the residual stream: r x d / sp;
    - wq, wk, wv's outputs and SDPA's output: w x (2d + 2kv) / tp, and SDPA's log-sum-exp, one
      float per query head: 4 x n_heads / tp (the math path instead keeps its scores, a bmm
      output, n_heads x s x w / tp, and no log-sum-exp);
    - w1 and w3's outputs: 2h x w / tp;
    - without TP, wo and w2's outputs: 2d x w. Under TP their matmuls are recomputed (their
      outputs are partial sums as large as the unsplit activations) and the collectives that
      reduce them are kept instead: the two all-reduces' outputs without SP, 2d x w, the two
      reduce-scatters' under SP, 2d x w / tp. Under SP the all-gathers (the norm outputs over
      the whole sequence) run again in backward.

    Under op_alternate only the odd matmuls of the block keep their outputs (wq, wv, w1 and,
    without TP, w2; under the math path the second score bmm, whose output is the attention's,
    replaces SDPA's): w x (d + kv + h + d) / tp beside the input, the reductions under TP as
    above, and no scores.

    Compiled blocks (`strategy.compile`) keep one d-sized tensor less: the partitioner saves
    only what backward reads, and nothing reads w2's output (or, under TP, its reduction): the
    block's output is a residual add (`tests/unit/test_activation_memory.py` reads the saved
    tensors of a compiled block).

    Everything else (norm outputs, RoPE, SiLU, the product, the residual adds) is recomputed.
    It keeps less than no checkpointing in every layout; docs/PLANNER.md has the numbers.

    An MoE block (`moe`) keeps the attention's share of this and, for its feed-forward part,
    `planner.experts.moe_mlp_kept_bytes`: whole on every tp rank (an MoE layer is replicated
    over tp and runs the gathered sequence, `parallel/expert_parallel.py`).
    """
    d, h = model.dim, model.hidden_dim
    kv = d // model.n_heads * (model.n_kv_heads or model.n_heads)
    w, r = settings.matmul_bytes, settings.residual_bytes
    sp = tp if settings.sequence_parallel else 1
    alternate = settings.activation_checkpointing.alternate_matmuls
    column = d + kv + h if alternate else 2 * kv + 2 * h + d
    # wo's and w2's outputs without TP (op_alternate keeps w2's alone), their reductions with it
    outputs = 1 if alternate and tp == 1 else 2
    compiled = settings.compile and settings.compile_backend != "eager"  # eager: no partitioner
    if compiled:
        outputs -= 1
    kept = r * d / sp + w * (column + d) / tp + outputs * d * w / sp
    if moe:  # the MLP's outputs above (w1, w3 or w1 alone, and w2's) give way to the MoE's
        mlp = (h if alternate else 2 * h) * w / tp + (0 if compiled else d * w / sp)
        kept += moe_mlp_kept_bytes(model, settings, ep) - mlp
    if settings.attention == "math":
        kept += 0 if alternate else model.n_heads * settings.seq_len * w / tp
    else:
        kept += 4 * model.n_heads / tp
    return kept


def recomputed_layer_bytes(model, tp: int, settings: TrainSettings, moe: bool = False) -> float:
    """Bytes per token one checkpointed block's recomputation adds while its backward runs,
    beyond what it keeps (`checkpointed_layer_bytes`), on one TP rank. Inside a checkpoint
    the sequence-parallel projections save their gathered, full-sequence input (the shard
    hooks of `parallel/sequence_parallel.py` stand aside there), 2 x w x d for the two.

    - full: everything `layer_activation_bytes` counts but the block's input, which is kept,
      with the projections' inputs full-sequence;
    - op: what it recomputes and backward reads: the mid-block residual, r x d / sp, the
      projections' inputs, 2 x w x d, q and k after RoPE, w x (d + kv) / tp, and SwiGLU's
      product, w x h / tp (under the math path also one of the two score matrices). The
      partial sums of wo and w2 under TP live only until their cached reduction replaces them.
      op_alternate also recomputes w3's output, which SwiGLU's backward reads: w x h / tp.

    An MoE block recomputes its routed experts under op (the grouped matmuls are not in the
    policy's list): in place of SwiGLU's product (and w3's output) its whole feed-forward count,
    `planner.experts.moe_mlp_bytes`.
    """
    mode = settings.activation_checkpointing.mode
    if mode == "none":
        return 0.0
    d, h = model.dim, model.hidden_dim
    kv = d // model.n_heads * (model.n_kv_heads or model.n_heads)
    w, r = settings.matmul_bytes, settings.residual_bytes
    sp = tp if settings.sequence_parallel else 1
    gathered_inputs = 2 * w * d
    if mode == "full":
        plain = layer_activation_bytes(model, tp, settings, moe) - r * d / sp - 2 * w * d / sp
        return plain + gathered_inputs
    recomputed = r * d / sp + gathered_inputs + w * (d + kv + h) / tp
    if settings.activation_checkpointing.alternate_matmuls:
        recomputed += w * h / tp
    if moe:
        mlp = w * h / tp * (2 if settings.activation_checkpointing.alternate_matmuls else 1)
        recomputed += moe_mlp_bytes(model, settings) - mlp
    if settings.attention == "math":
        recomputed += model.n_heads * settings.seq_len * w / tp
    return recomputed


def context_parallel_layer_bytes(model, tp: int, cp: int, settings: TrainSettings) -> float:
    """Bytes per token one block keeps for backward under context parallelism of degree `cp`
    beyond `layer_activation_bytes`, on one rank (a token of its 1/cp of the sequence; 0 when
    cp = 1). From the ops of `parallel/context_parallel.py`, with w, kv = n_kv_heads x
    head_dim and hd = head_dim:

    - allgather: SDPA keeps the gathered keys and values of the whole sequence, cp times this
      rank's share: 2 x kv x w x (cp - 1) / tp more, and the boolean mask of this rank's
      queries against every key, one byte per (query, key) pair of the sequence, shared by the
      micro-batch's sequences: seq_len / micro_batch_size bytes per token (a new mask in each
      block; on a GPU the memory-efficient kernel takes it as an additive bias in the compute
      dtype, never measured; packed documents' masks, one per sequence, are not counted);
    - ulysses: `wo` reads the all-to-all's output, a tensor of its own (not a view of SDPA's
      output), d x w / tp; key/value heads fewer than cp on a tp rank are repeated up to cp
      before the exchange: 2 x (cp - kv_heads / tp) x hd x w more.

    A block under activation checkpointing keeps none of this (its forward runs again in
    backward, exchange included: `planner/timing.py` counts that traffic)."""
    if cp == 1:
        return 0.0
    w, hd = settings.matmul_bytes, model.dim // model.n_heads
    kv_heads = model.n_kv_heads or model.n_heads
    if settings.cp_mode == "ulysses":
        repeated = max(0, cp - kv_heads // tp)
        return w * model.dim / tp + 2 * repeated * hd * w
    return 2 * kv_heads * hd * w * (cp - 1) / tp + settings.seq_len / settings.micro_batch_size


def loss_bytes_per_logit(tp: int, compiled: bool = False, w: int = 2) -> float:
    """Bytes per logit (a token x vocabulary entry of this rank) the cross-entropy holds at its
    peak, which comes in backward (MemTracker on this CPU: `tests/unit/test_activation_memory.py`):

    - one rank's whole vocabulary (`lm/module.py`: `F.cross_entropy(logits.float(), ...)`):
      forward keeps the logits in the matmul dtype, their fp32 copy and the log-softmax,
      w + 8 (8 in 32-true, where the copy is the logits); backward holds three fp32 tensors at
      once, the loss's gradient, the saved log-softmax and its gradient: 12, the peak;
    - under TP the logits stay split along the vocabulary (`strategy.loss_parallel`, torch's
      `loss_parallel`): its log-softmax also keeps the shifted logits, w + 12 in forward, and
      its fused backward holds four fp32 tensors (the saved log-softmax, the one-hot, its exp
      and their sum) beside the product: 16;
    - the same loss under torch.compile (`compiled`, whole vocabulary only): inductor's
      partitioner saves the logits themselves (w) and two fp32 numbers a row, and its backward
      is one kernel that writes the logits' gradient in their dtype (w): 2 w at the peak, no
      fp32 tensor of the logits' size in either pass (`bench/compiled_loss_memory.py`).
    """
    if compiled:
        return 2.0 * w
    return 16.0 if tp > 1 else 12.0
