"""Compute time of one microbatch on one rank of a stage: matmuls, attention, pointwise ops.

On a device whose spec gives its memory bandwidth (`hardware.memory_gbytes_per_sec`) and the
fraction of its peak that large matmuls sustain (`hardware.matmul_efficiency`), three terms:

- **matmuls** (the projections and the output head): each at `matmul_efficiency` x
  `gemm_shape_factor(M, N, K, h)` of the peak, where M is the microbatch's tokens and N, K the
  per-rank weight's sizes (after TP), plus GEMM_KERNEL_SECONDS per kernel (three a projection
  in training). Small dimensions cost more: each one of size x costs x / (x + h) of the
  large-shape rate, h = GEMM_HALF_DIM scaled by the device's matmul rate over its memory
  bandwidth (`device_rates.gemm_half_dim`: to first order the penalty is proportional to
  the product's operand and result bytes over the bandwidth, about half of their time).
  GEMM_HALF_DIM and the kernel time are least squares over OpenXLA's measured H100 bf16
  matmul table (`device_rates.fit_gemm_shape`), not fitted to training runs;
- **attention** (SDPA): flash attention at FlashAttention-2's measured rate for the sequence
  length, head dim and masking (`device_rates.flash_attention_share`: published kernel
  figures, not fitted); the math path runs QK^T and AV whole at the matmul rate and moves the
  s x s scores through memory (MATH_SCORE_PASSES times, fp32 softmax included);
- **clock**: every compute rate scales with the clock the GPU sustains at its power limit
  (`hardware.power_w` against the datasheet power: `device_rates.sustained_clock_share`, read
  off Perseus's measured A100 clock-versus-draw profile, not fitted);
- **pointwise ops** (norms, residual adds, RoPE, SwiGLU's product, the loss): bytes moved
  over the memory bandwidth. Eager mode launches one kernel per op, each reading and writing
  whole tensors: POINTWISE_BYTES per element of the residual stream (d), of the attention
  projections (d + 2 kv) and of the MLP (h), counted from the ops of `models/llama.py`;
  `torch.compile` fuses them, leaving COMPILED_POINTWISE_SHARE of that traffic. The traffic
  moves at ACHIEVABLE_MEMORY_BANDWIDTH_SHARE of the bandwidth (torchao's roofline figure).
- **float8** (`strategy.float8`): the block projections run at the device's float8 peak
  (`hardware.peak_tflops_fp8`) with the same efficiency and shape factor as bf16 ones (torchao's
  roofline model assumes one achievable fraction for both); the output head stays in bf16.
  Each projection casts its input and its output gradient (per token) and its weight (per
  microbatch; only the local shard under the float8 all-gather): FLOAT8_CAST_BYTES per element,
  pointwise traffic like the rest (fused under compile, except the weights' casts).

Without those two fields (a CPU, an unknown device) compute is FLOPs over peak x efficiency,
as before this module. The constants' sources are in docs/PLANNER.md ("The time model"); the
only fitted ones are the hardware files' `matmul_efficiency` (published/holdout.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from lightning_dist.planner.device_rates import (
    ACHIEVABLE_MEMORY_BANDWIDTH_SHARE,
    FLASH2_FWD_BWD_FLOPS_PER_FORWARD,
    GEMM_KERNEL_SECONDS,
    flash_attention_share,
    gemm_half_dim,
    gemm_shape_factor,
    sustained_clock_share,
)

POINTWISE_SCALE = 1 / ACHIEVABLE_MEMORY_BANDWIDTH_SHARE
"""Seconds of pointwise traffic over the count below at the datasheet bandwidth: the kernels
reach ACHIEVABLE_MEMORY_BANDWIDTH_SHARE of it (torchao's measured share: device_rates.py)."""
COMPILED_POINTWISE_SHARE = 1 / 3
"""Pointwise traffic left once torch.compile fuses a block's ops: each tensor read and written
about once instead of once per op (an assumption: inductor's fusion of RMSNorm, RoPE and SwiGLU
into a few kernels; the torchtitan rows' compile speed-up is what it is checked against)."""
POINTWISE_BYTES = {
    "llama": {"residual": 244, "attention": 68, "mlp": 40},
    "mpt": {"residual": 48, "attention": 6, "mlp": 18},
}
"""Bytes moved per token per block by eager pointwise ops, per element of d (the residual
stream's), of d + 2 kv (the attention's) and of h (the MLP's), by the block code a run executes
(`TrainSettings.block_ops`), each op reading its inputs and writing its output:

- "llama", `models/llama.py` under bf16-mixed: two RMSNorms in fp32 and the two residual adds;
  RoPE on q and k and the layout copies around SDPA; SwiGLU's silu and product;
- "mpt", llm-foundry's MPT block as its 2023 benchmarks ran it (mosaicml/llm-foundry 061f2c7:
  `llmfoundry/models/layers/blocks.py`, `attention.py`, `ffn.py`, `norm.py`; bf16 parameters
  under autocast, so a bf16 residual stream). Per element of d: two LayerNorms in bf16
  (`low_precision_layernorm`, set by `scripts/train/benchmarking/submit_benchmarks.py`; 4
  bytes forward, 6 backward), the two adds (6 forward, 6 to sum the gradients backward) and
  the bias gradients of the output and down projections (2 each): 48. Per element of
  d + 2 kv: q, k and v are views of one fused projection that the Triton kernel reads in
  place, their gradients concatenated back (4) plus that projection's bias gradient (2): 6;
  no RoPE (learned positions). The MLP: GELU over its 4d width (4 forward, 6 backward) and the
  up projection's bias gradient (2), 12 per element of 4d, so 18 per element of the 8d/3
  width of the planner's stand-in model (`published/foundry.mpt_model`)."""
LOSS_BYTES_PER_LOGIT = 24
"""The loss's pointwise traffic per logit: fp32 softmax forward and backward (six passes of
four bytes)."""
FLOAT8_CAST_BYTES = 6
"""Bytes moved per element to cast a bf16 tensor to tensorwise float8 for a matmul: a pass
that reads it for its largest absolute value (2), the cast that reads it again (2) and writes
the float8 copy (1) and the transposed copy the other matmul of backward reads (1). Counted
from torchao's float8 linear (torchao/float8, tensorwise recipe), as its roofline model counts
them."""
MATH_SCORE_PASSES = 8
"""Passes over the s x s scores of the math attention path (bf16 scores, fp32 softmax, its
backward), per element: bytes = 2 x passes."""


@dataclass(frozen=True)
class MicrobatchCompute:
    """Seconds of one microbatch on one rank: the training compute and what recomputation adds."""

    train_seconds: float
    recompute_seconds: float

    @property
    def seconds(self) -> float:
        return self.train_seconds + self.recompute_seconds


TRAINING_KERNELS = 3
"""Matmul kernels a projection runs in training: forward, input gradient, weight gradient."""


def block_matmuls(model, tp: int) -> list[tuple[float, float]]:
    """(N, K) of each projection of one block on one rank of a tp group."""
    d, kv, h = model.dim, model.kv_heads * model.head_dim, model.hidden_dim
    return [
        (d / tp, d), (kv / tp, d), (kv / tp, d),  # wq, wk, wv: column-parallel
        (d, d / tp),  # wo: row-parallel
        (h / tp, d), (h / tp, d),  # w1, w3
        (d, h / tp),  # w2
    ]  # fmt: skip


ROW_PARALLEL = (3, 6)
"""wo and w2 in `block_matmuls`: the row-parallel projections."""
ALTERNATE = (1, 3, 5)
"""wk, wo and w3 in `block_matmuls`: the 2nd, 4th and 6th matmuls of a block in forward order,
which op_alternate checkpointing recomputes."""


def recomputed_projections(tp: int, alternate: bool) -> tuple[int, ...]:
    """Indices into `block_matmuls` of the projections an op-level checkpointed block runs again
    in backward: under TP the row-parallel wo and w2 (their partial sums are not kept), under
    op_alternate also wk, wo and w3 (`parallel/activation_checkpoint.py`)."""
    return tuple(sorted(set(ROW_PARALLEL if tp > 1 else ()) | set(ALTERNATE if alternate else ())))


def _matmul_seconds(shapes, tokens: float, speed: float, half_dim: float) -> float:
    """Training (forward + two backward) seconds of `shapes` over `tokens` at `speed` FLOP/s,
    with the device's shape penalty `half_dim` (`device_rates.gemm_half_dim`)."""
    kernels = TRAINING_KERNELS * GEMM_KERNEL_SECONDS * len(shapes)
    return kernels + sum(
        6.0 * tokens * n * k / (speed * gemm_shape_factor(tokens, n, k, half_dim))
        for n, k in shapes
    )


def microbatch_compute(
    model,
    hardware,
    *,
    tp: int,
    layers: int,
    has_output: bool,
    checkpointed: int,
    mode: str,
    tokens: float,
    seq_len: int,
    peak: float,
    compiled: bool,
    sequence_parallel: bool,
    attention: str,
    float8_peak: float | None = None,
    float8_weight_share: float = 1.0,
    block_ops: str = "llama",
    masked: bool = False,
    alternate: bool = False,
    moe_layers: int = 0,
    ep: int = 1,
) -> MicrobatchCompute:
    """Seconds of a microbatch of `tokens` through `layers` blocks (and the output head) on one
    rank of a tp group, `checkpointed` of them under AC `mode` ("full" or "op"; `alternate`:
    op_alternate, which recomputes every other projection too). With
    `float8_peak` (FLOP/s) the block projections run in float8, each rank casting
    `float8_weight_share` of each weight. `tokens` are this rank's (a 1/cp share of each
    sequence under context parallelism), each attending over up to `seq_len` keys; `masked`
    attention (an explicit mask: the all-gather mode of context parallelism) runs in a kernel
    that visits every key block instead of the causal half. `block_ops` names the block code
    whose pointwise ops are counted (POINTWISE_BYTES).

    `moe_layers` of the `layers` are mixture-of-experts blocks (`planner/experts.py`): their
    MLP is the router and a shared expert over every token (replicated over tp: every tp rank
    runs the whole sequence), plus the routed experts' grouped matmuls, each at the shape factor of its expert's
    rows (`expert_matmuls`, over `ep` ranks' tokens), in bf16 also under float8, and the
    permutation around them (MOE_PERMUTE_BYTES a routed element); under op-level checkpointing
    the grouped matmuls run again (the policy saves no grouped-matmul output)."""
    clock = sustained_clock_share(hardware.power_w, hardware.peak_tflops_bf16)
    speed = peak * hardware.matmul_efficiency * clock
    bandwidth = hardware.memory_gbytes_per_sec * 1e9
    # float8 matmuls keep the bf16 penalty: twice the rate, half the operand bytes
    half = gemm_half_dim(speed, bandwidth)
    d, kv, h = model.dim, model.kv_heads * model.head_dim, model.hidden_dim
    shapes = block_matmuls(model, tp)
    block_speed = speed if float8_peak is None else float8_peak * hardware.matmul_efficiency * clock
    head_dim = model.head_dim
    if attention == "flash":  # heads split over tp; FLOPs as FlashAttention-2's benchmark counts
        hopper = hardware.peak_tflops_fp8 is not None
        rate = peak * clock * flash_attention_share(seq_len, head_dim, not masked, hopper)
        forward = (4.0 if masked else 2.0) * tokens * seq_len * d / tp
        attn = FLASH2_FWD_BWD_FLOPS_PER_FORWARD * forward / rate
    else:
        factor = gemm_shape_factor(seq_len, seq_len, head_dim, half)
        attn = 12.0 * tokens * seq_len * d / tp / (speed * factor)
        attn += 2 * TRAINING_KERNELS * GEMM_KERNEL_SECONDS  # QK^T and AV, batched over heads
        attn += MATH_SCORE_PASSES * 2.0 * tokens * seq_len * model.n_heads / tp / bandwidth
    sp = tp if sequence_parallel else 1
    share = COMPILED_POINTWISE_SHARE if compiled else 1.0
    ops = POINTWISE_BYTES[block_ops]

    def pointwise_seconds(projections, mlp_bytes: float) -> float:
        """The block's pointwise traffic: the residual stream's, the attention's and the MLP's
        (`mlp_bytes` a token), and under float8 the casts of `projections`."""
        per_token = ops["residual"] * d / sp + ops["attention"] * (d + 2 * kv) / tp + mlp_bytes
        if float8_peak is not None:  # each projection's input and output gradient
            per_token += FLOAT8_CAST_BYTES * sum(n + k for n, k in projections)
        seconds = POINTWISE_SCALE * share * per_token * tokens / bandwidth
        if float8_peak is not None:  # and its weight, once a microbatch
            weights = sum(n * k for n, k in projections) * float8_weight_share
            seconds += POINTWISE_SCALE * FLOAT8_CAST_BYTES * weights / bandwidth
        return seconds

    gemm = _matmul_seconds(shapes, tokens, block_speed, half)
    pointwise = pointwise_seconds(shapes, ops["mlp"] * h / tp)
    block = gemm + attn + pointwise
    # Recomputation: a block in full replays its forward (a third of each term); under 'op'
    # the pointwise forward and the forward of the projections it does not keep.
    again = [shapes[i] for i in recomputed_projections(tp, alternate)]
    replay = _replay(mode, block, pointwise, _matmul_seconds(again, tokens, block_speed, half))
    train = (layers - moe_layers) * block
    recompute = (checkpointed - min(checkpointed, moe_layers)) * replay
    if moe_layers:
        from lightning_dist.planner.experts import (
            MOE_PERMUTE_BYTES,
            expert_matmuls,
            moe_extra_matmuls,
        )

        moe_tokens = tokens  # every tp rank runs an MoE layer on the whole (gathered) sequence
        attention_shapes = shapes[:4]
        extra = moe_extra_matmuls(model)
        experts = sum(  # one grouped kernel over the rank's experts a pass
            6.0 * m * n * k * model.num_experts / ep / (speed * gemm_shape_factor(m, n, k, half))
            + TRAINING_KERNELS * GEMM_KERNEL_SECONDS
            for m, n, k in expert_matmuls(model, moe_tokens, ep)
        )
        routed = model.top_k * (ops["mlp"] * model.expert_dim + MOE_PERMUTE_BYTES * d)
        shared = ops["mlp"] * model.n_shared_experts * model.expert_dim
        moe_pointwise = pointwise_seconds(attention_shapes + extra, routed + shared)
        moe_block = (
            _matmul_seconds(attention_shapes, tokens, block_speed, half)
            + _matmul_seconds(extra, moe_tokens, block_speed, half)
            + experts
            + attn
            + moe_pointwise
        )
        train += moe_layers * moe_block
        kept_attention = [shapes[i] for i in recomputed_projections(tp, alternate) if i < 4]
        moe_replay = _replay(
            mode,
            moe_block,
            moe_pointwise,
            _matmul_seconds(kept_attention, tokens, block_speed, half) + experts,
        )
        recompute += min(checkpointed, moe_layers) * moe_replay
    if has_output:
        output = _matmul_seconds([(model.vocab_size / tp, d)], tokens, speed, half)
        train += (
            output
            + POINTWISE_SCALE * LOSS_BYTES_PER_LOGIT * tokens * model.vocab_size / tp / bandwidth
        )
    return MicrobatchCompute(train, recompute)


def _replay(mode: str, block: float, pointwise: float, matmuls_again: float) -> float:
    """Seconds a checkpointed block's recomputation adds: its whole forward under full (a third
    of its training time), under op its pointwise forward and the forward of the matmuls it
    does not keep (`matmuls_again` is their training time)."""
    if mode == "full":
        return block / 3
    if mode == "op":
        return pointwise / 3 + matmuls_again / 3
    return 0.0
