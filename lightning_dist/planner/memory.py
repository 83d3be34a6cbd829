"""Memory per device: model states, activations, FSDP buffers and a framework reserve.

All counts are for one rank of the worst pipeline stage (the first holds the embedding and the
most in-flight microbatches, the last holds the output projection and the logits). `model` is
anything with the `ModelArgs` attributes (dim, n_layers, n_heads, kv_heads, hidden_dim,
vocab_size, tie_embeddings, block_params()); it is duck-typed so that this module never imports
the model package (and through it torch).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from lightning_dist.parallel.layout import Layout
from lightning_dist.planner.settings import (
    FRAGMENTATION,
    RESERVE_BYTES,
    TrainSettings,
    state_bytes,
)

SHARDED_MODES = ("SHARD_GRAD_OP", "FULL_SHARD", "HYBRID_SHARD")


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes on one device by category; `host` is what CPU offload keeps in host memory."""

    params: float
    grads: float
    optimizer: float
    activations: float
    buffers: float
    reserve: float
    host: float = 0.0
    stage: str = "only"

    @property
    def total(self) -> float:
        """Predicted peak on the device (everything but `host`)."""
        return (
            self.params
            + self.grads
            + self.optimizer
            + self.activations
            + self.buffers
            + self.reserve
        )

    def as_dict(self) -> dict[str, float]:
        """The JSON form: every category plus `total`, as whole bytes."""
        out = {k: round(v) for k, v in asdict(self).items() if k != "stage"}
        out["total"] = round(self.total)
        return out


@dataclass(frozen=True)
class StageShape:
    """Parameters held by one rank of one pipeline stage (already divided by tp)."""

    layers: int
    params: float
    block: float
    """Parameters of one block: one FSDP unit."""
    roots: tuple[float, ...]
    """The other FSDP units of the stage: the embedding, the final norm with the output."""
    has_embedding: bool
    has_output: bool

    def units(self) -> list[float]:
        """Every FSDP unit of the stage, largest first."""
        return sorted([*self.roots, *[self.block] * self.layers], reverse=True)


def stage_layers(n_layers: int, layout: Layout) -> int:
    """Blocks on the busiest pipeline rank: v chunks of ceil(L / (pp * v)) blocks.

    Uneven splits are allowed (Llama 3 405B has 126 layers, which no pp > 2 power of two
    divides); the busiest rank sets the pace and the memory.
    """
    v = layout.virtual_stages if layout.pp > 1 else 1
    return v * math.ceil(n_layers / (layout.pp * v))


def stage_shapes(model, layout: Layout) -> list[tuple[str, StageShape]]:
    """The stage positions worth checking: ('only',) without PP, else ('first', 'last').

    Under TP the projections and the vocab-parallel embedding/output divide by tp; the norm
    scales are replicated. The schedule ZBVZeroBubble folds the pipeline into a V, so its first
    rank also holds the output.
    """
    tp, d = layout.tp, model.dim
    block = (model.block_params() - 2 * d) / tp + 2 * d
    vocab = model.vocab_size * d / tp
    layers = stage_layers(model.n_layers, layout)

    def shape(first: bool, last: bool) -> StageShape:
        roots = []
        if first:
            roots.append(vocab)
        if last:
            # A tied output shares the embedding's weight only when both live on this rank.
            roots.append((0.0 if (model.tie_embeddings and first) else vocab) + d)
        return StageShape(layers, layers * block + sum(roots), block, tuple(roots), first, last)

    if layout.pp == 1:
        return [("only", shape(True, True))]
    if layout.schedule == "ZBVZeroBubble":
        return [("first", shape(True, True)), ("last", shape(False, False))]
    return [("first", shape(True, False)), ("last", shape(False, True))]


def inflight_microbatches(layout: Layout, stage: str, microbatches: int) -> float:
    """Microbatches whose activations one stage holds at its peak.

    Without PP one (gradient accumulation runs them one after another). GPipe runs every forward
    before any backward, so all m. 1F1B's first stage holds pp (stage i holds pp - i), its last
    one. Interleaved schedules add the factor 1 + (pp - 1) / (pp * v) of Narayanan et al. (2021);
    we apply it to every stage, which slightly overstates the last. ZB-V matches 1F1B.
    """
    pp, m = layout.pp, microbatches
    if pp == 1:
        return 1.0
    if layout.schedule == "GPipe":
        return float(m)
    first = float(min(m, pp))
    if layout.schedule in ("Interleaved1F1B", "InterleavedZeroBubble"):
        v = layout.virtual_stages
        return first * (1 + (pp - 1) / (pp * v))
    return first if stage in ("first", "only") else 1.0


def layer_activation_bytes(model, tp: int, settings: TrainSettings) -> float:
    """Bytes one block saves for backward, per token, on one TP rank.

    Derived from the ops of `lightning_dist.models.llama`, with d = dim, h = hidden_dim and
    w = bytes of a matmul input (4 in 32-true, else 2):

    - each RMSNorm saves its fp32 input and fp32 normalised output: 2 norms x 8d bytes
      (divided by tp under sequence parallelism, where norms run on a sequence shard);
    - the projections' inputs: under bf16-mixed autocast casts the norm output once per linear
      (3 x 2d for wq/wk/wv, 2 x 2d for w1/w3 = 10d); in 32-true the five share one 4d tensor
      per norm (8d); in bf16-true 2d per norm (4d). Under TP these are the all-gathered inputs
      of the column-parallel linears, so they do not divide by tp;
    - SDPA saves q, the head-repeated k and v, and its output: 4d x w over the heads, so
      divided by tp (`wo`'s input is a view of that output: SDPA lays it out as [b, s, h, hd]);
    - SwiGLU saves w1's output, silu's output, w3's output and their product: 4h x w / tp;
    - RoPE saves nothing but its constant tables; flash / memory-efficient SDPA keeps only a
      per-head log-sum-exp, while the math path adds the softmax and score matrices,
      2 x n_heads x s x w per token, divided by tp.

    Checked with saved-tensor hooks on a one-block model: exact in 32-true; bf16-mixed adds
    autocast's bf16 weight copies, which `buffer_bytes` counts.
    """
    d, h = model.dim, model.hidden_dim
    precision = settings.precision
    w = 4 if precision == "32-true" else 2
    linear_inputs = {"32-true": 8 * d, "bf16-mixed": 10 * d, "bf16-true": 4 * d}[precision]
    norms = 16 * d / (tp if settings.sequence_parallel else 1)
    heads = (4 * d * w + 4 * h * w) / tp
    if settings.attention == "math":
        heads += 2 * model.n_heads * settings.seq_len * w / tp
    return norms + linear_inputs + heads


def activation_bytes(
    model, layout: Layout, settings: TrainSettings, shape: StageShape, stage: str, microbatches: int
) -> float:
    """Peak activation bytes of one rank of one stage.

    tokens = micro_batch_size x seq_len per microbatch; n = in-flight microbatches.

    - without checkpointing: n x layers x per-layer bytes;
    - with full activation checkpointing: each block keeps only its input (residual dtype, split
      by tp under SP), n x layers x d x r, plus one block's recomputed activations while its
      backward runs;
    - the last stage adds its final norm and the logits, b x s x V / tp elements held as the
      matmul output, its fp32 copy for the loss and the log-softmax (w + 8 bytes each). With
      checkpointing the logits are freed before the blocks' backward, so the peak is the larger
      of the logits and one recomputed block, not their sum.
    """
    tokens = settings.micro_batch_size * settings.seq_len
    tp, d = layout.tp, model.dim
    sp = tp if settings.sequence_parallel else 1
    residual = 2 if settings.precision == "bf16-true" else 4
    w = 4 if settings.precision == "32-true" else 2
    per_layer = layer_activation_bytes(model, tp, settings) * tokens
    inflight = inflight_microbatches(layout, stage, microbatches)
    logits = 0.0
    if shape.has_output:
        logits = tokens * (model.vocab_size / tp * (w + 8) + 8 * d / sp + w * d)
    if settings.activation_checkpointing:
        kept = inflight * shape.layers * tokens * d * residual / sp
        return kept + max(per_layer, logits)
    return inflight * shape.layers * per_layer + logits


def model_state_bytes(
    layout: Layout, settings: TrainSettings, shape: StageShape
) -> tuple[float, float, float, float]:
    """(params, grads, optimizer, host) bytes of one rank under the settings' sharding.

    ZeRO accounting over the shard group N = dp_shard (NO_SHARD: N = 1):

    - NO_SHARD (DDP): everything replicated;
    - SHARD_GRAD_OP (ZeRO-2): params replicated, grads and optimizer state / N;
    - FULL_SHARD / HYBRID_SHARD (ZeRO-3): all three / N (HSDP replicates over dp_replicate);
    - under PP a sharded stage stays gathered with unsharded grads across the microbatches of
      a step (torch.distributed.pipelining disables resharding and gradient sync until the last
      backward), so only the optimizer state divides by N (ZeRO-1);
    - offload moves every sharded state to host memory.
    """
    p_b, g_b, o_b = state_bytes(settings.precision, settings.optimizer)
    psi = shape.params
    n = layout.dp_shard if settings.sharding in SHARDED_MODES else 1
    if settings.sharding == "NO_SHARD" or n == 1:
        sharded = (False, False, False)
    elif layout.pp > 1:
        sharded = (False, False, True)
    elif settings.sharding == "SHARD_GRAD_OP":
        sharded = (False, True, True)
    else:
        sharded = (True, True, True)
    device, host = [], 0.0
    for nbytes, is_sharded in zip((p_b, g_b, o_b), sharded, strict=True):
        amount = nbytes * psi / n if is_sharded else nbytes * psi
        if is_sharded and settings.offload:
            host += amount
            amount = 0.0
        device.append(amount)
    return device[0], device[1], device[2], host


def buffer_bytes(layout: Layout, settings: TrainSettings, shape: StageShape) -> float:
    """FSDP communication buffers of one rank.

    FULL_SHARD gathers one unit (a block, the embedding, the output) at a time; with
    limit_all_gathers the rate limiter allows two gathered units in flight (the current one and
    the prefetched next). Without it the CPU can run ahead of the GPU and issue the all-gathers
    of every unit of the stage, so we budget for that worst case. Each sharded mode also holds
    one unit's unsharded gradient before its reduce-scatter. DDP's buckets are views of the
    gradients (gradient_as_bucket_view=True, as conf/strategy/ddp.yaml sets) and cost nothing;
    but without FSDP's bf16 parameters, bf16-mixed autocast saves a bf16 copy of every weight
    for backward: 2 bytes per parameter of the stage.
    """
    n = layout.dp_shard if settings.sharding in SHARDED_MODES else 1
    p_b, g_b, _ = state_bytes(settings.precision, settings.optimizer)
    if n == 1:
        return 2.0 * shape.params if settings.precision == "bf16-mixed" else 0.0
    units = shape.units()
    gathered = 0.0
    if layout.pp == 1 and settings.sharding != "SHARD_GRAD_OP":
        depth = 2 if settings.limit_all_gathers else len(units)
        gathered = p_b * sum(units[:depth])
    return gathered + g_b * units[0]


def memory_per_device(
    model, layout: Layout, settings: TrainSettings, *, accelerator: str = "gpu"
) -> MemoryBreakdown:
    """Predicted peak bytes on one device of the worst stage, by category.

    `layout` must be resolved; the number of microbatches per step is the per-rank batch
    (global_batch_size / dp) over micro_batch_size. The reserve is a fixed runtime cost
    (RESERVE_BYTES) plus FRAGMENTATION of everything else.
    """
    microbatches = max(settings.global_batch_size // layout.dp // settings.micro_batch_size, 1)
    worst = None
    for stage, shape in stage_shapes(model, layout):
        params, grads, optimizer, host = model_state_bytes(layout, settings, shape)
        acts = activation_bytes(model, layout, settings, shape, stage, microbatches)
        buffers = buffer_bytes(layout, settings, shape)
        subtotal = params + grads + optimizer + acts + buffers
        reserve = RESERVE_BYTES.get(accelerator, RESERVE_BYTES["gpu"]) + FRAGMENTATION * subtotal
        mem = MemoryBreakdown(params, grads, optimizer, acts, buffers, reserve, host, stage)
        if worst is None or mem.total > worst.total:
            worst = mem
    return worst
