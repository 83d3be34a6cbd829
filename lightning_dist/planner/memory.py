"""Memory per device: model states, activations, FSDP buffers, the caching allocator's slack and
a framework reserve.

All counts are for one rank of the worst pipeline stage (the first holds the embedding and the
most in-flight microbatches, the last holds the output projection and the logits). `model` is
anything with the `ModelArgs` attributes (dim, n_layers, n_heads, kv_heads, hidden_dim,
vocab_size, tie_embeddings, block_params()); it is duck-typed so that this module never imports
the model package (and through it torch).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from lightning_dist.layout import Layout
from lightning_dist.planner.activations import (
    checkpointed_layer_bytes,
    context_parallel_layer_bytes,
    layer_activation_bytes,
    loss_bytes_per_logit,
    recomputed_layer_bytes,
)
from lightning_dist.planner.experts import expert_degree
from lightning_dist.planner.pipeline_buffers import (  # noqa: F401 (re-exported)
    inflight_microbatches,
    pipeline_bytes,
)
from lightning_dist.planner.settings import (
    RESERVE_BYTES,
    TrainSettings,
    state_bytes,
)
from lightning_dist.planner.stage_shapes import StageShape, stage_shapes

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
    allocator: float = 0.0
    """Device memory the CUDA caching allocator holds at the peak beyond the live tensors
    (`allocator_bytes`; 0 on CPUs): with `tensors`, what torch.cuda.max_memory_reserved reads."""

    @property
    def tensors(self) -> float:
        """Predicted peak of live tensor bytes: what a tensor-level tracker (torch's MemTracker,
        `memory_by_category` in summary.json) measures, i.e. everything but the reserve."""
        return self.params + self.grads + self.optimizer + self.activations + self.buffers

    @property
    def reserved(self) -> float:
        """Predicted peak of the caching allocator's reserved memory: the live tensors and the
        allocator's slack (what torchtitan logs as its memory; no CUDA context)."""
        return self.tensors + self.allocator

    @property
    def total(self) -> float:
        """Predicted peak on the device (everything but `host`)."""
        return self.reserved + self.reserve

    def as_dict(self) -> dict[str, float]:
        """The JSON form: every category plus `total`, as whole bytes."""
        fields = asdict(self)
        order = (
            "params",
            "grads",
            "optimizer",
            "activations",
            "buffers",
            "allocator",
            "reserve",
            "host",
        )
        out = {k: round(fields[k]) for k in order}
        out["total"] = round(self.total)
        return out


def checkpointed_blocks(layout: Layout, settings: TrainSettings, shape: StageShape) -> int:
    """Blocks of one rank of a stage that activation checkpointing wraps: blocks 0, n, 2n, ...
    of each of its chunks (each chunk is checkpointed on its own, `parallel/parallelize.py`)."""
    choice = settings.activation_checkpointing
    return sum(choice.checkpointed(c) for c in shape.chunks)


def activation_bytes(
    model, layout: Layout, settings: TrainSettings, shape: StageShape, microbatches: int
) -> float:
    """Peak activation bytes of one rank of one stage.

    tokens = micro_batch_size x seq_len / cp per microbatch (`TrainSettings.rank_tokens`); n =
    in-flight microbatches. Each block
    keeps, per token, `layer_activation_bytes` without checkpointing and
    `checkpointed_layer_bytes` when checkpointed (its input in full; its matmul, attention and
    collective outputs under 'op'), and under context parallelism a block that is not
    checkpointed (and the recomputed one) also `context_parallel_layer_bytes`; with every n-th block, a chunk of c blocks checkpoints
    ceil(c / n) of them. The peak is the larger of:

    - the turn from forward to backward: n x the stage's kept bytes, plus the logits;
    - the first recomputation in backward, of the last checkpointed block of the rank's last
      chunk: the blocks before it still keep theirs, the ones after it and the logits are
      freed, and it adds `recomputed_layer_bytes` (other in-flight microbatches keep all).

    The last stage adds its final norm (its input, r x d / sp, and its output, the output
    projection's input, w x d) and the logits, b x s x V / tp elements, at the cross-entropy's
    peak in its backward (`loss_bytes_per_logit`: 12 bytes each, 16 under TP's loss
    parallelism, 2 w with the compiled loss). With the chunked loss (`model.loss_chunk_tokens`, c) only one chunk's logits
    exist at a time, min(c, b x s) rows of them, and none are kept for backward.
    """
    tokens = settings.rank_tokens(layout)
    tp, d = layout.tp, model.dim
    sp = tp if settings.sequence_parallel else 1
    residual, w = settings.residual_bytes, settings.matmul_bytes
    exchange = context_parallel_layer_bytes(model, tp, layout.cp, settings)
    # A block's bytes: a mixture of experts has dense and MoE blocks; each stage's mean block.
    moe_share = shape.moe_layers / shape.layers if shape.layers else 0.0
    ep = expert_degree(layout)

    def per_block(count, **moe) -> float:
        dense = count(model, tp, settings)
        if not moe_share:
            return dense
        return dense + moe_share * (count(model, tp, settings, True, **moe) - dense)

    plain = (per_block(layer_activation_bytes) + exchange) * tokens
    kept = per_block(checkpointed_layer_bytes, ep=ep) * tokens
    inflight = inflight_microbatches(layout, shape.rank, microbatches)
    logits = 0.0
    if shape.has_output:
        per_vocab = loss_bytes_per_logit(tp, settings.loss == "compiled", w)
        chunk = getattr(model, "loss_chunk_tokens", 0)
        rows = min(chunk, tokens) if chunk else tokens
        logits = rows * model.vocab_size / tp * per_vocab + tokens * (residual * d / sp + w * d)
    choice = settings.activation_checkpointing

    def chunk_kept(blocks: int) -> float:
        checkpointed = choice.checkpointed(blocks)
        return (blocks - checkpointed) * plain + checkpointed * kept

    chunks = shape.chunks
    stage_kept = sum(chunk_kept(c) for c in chunks)
    peak = stage_kept + logits
    last = choice.last_checkpointed(chunks[-1])
    if last is not None:
        # Blocks 0..last of the last chunk: last // n + 1 of them checkpointed.
        ahead = last // choice.every_n + 1
        before = stage_kept - chunk_kept(chunks[-1]) + ahead * kept + (last + 1 - ahead) * plain
        moe = shape.moe_layers > 0  # the last block recomputed: an MoE one where there are
        recompute = (recomputed_layer_bytes(model, tp, settings, moe) + exchange) * tokens
        peak = max(peak, before + recompute)
    return (inflight - 1) * stage_kept + peak


def model_state_bytes(
    layout: Layout, settings: TrainSettings, shape: StageShape
) -> tuple[float, float, float, float]:
    """(params, grads, optimizer, host) bytes of one rank that persist between steps.

    ZeRO accounting of the bytes per parameter, over the shard group N = dp_shard x cp
    (`Layout.shard_size`: context-parallel ranks shard too; NO_SHARD, DDP: N = 1, everything
    replicated). Every sharded mode keeps all three states sharded at
    rest (HSDP replicates them over dp_replicate); the modes differ in how long the gathered
    parameters and unsharded gradients live within a step, which `buffer_bytes` counts:
    FSDP's SHARD_GRAD_OP reshards after backward, so unlike DeepSpeed's ZeRO-2 it holds no
    replicated parameters between steps. Offload moves the sharded states to host memory.
    DiLoCo (`strategy.diloco_inner_steps`, DDP) adds its outer optimizer's state to the
    optimizer's: the anchor and, with momentum, the momentum buffer, 4 bytes a parameter each
    (`cluster/diloco.py`). ZeRO-1 (SHARD_OPTIMIZER) keeps the parameters and gradients whole
    and 1/dp of the optimizer states, as `parallel/sharded_optimizer.py` holds them, beside the
    flat slice of the parameters the wrapped optimizer steps (1/dp of them in their dtype,
    counted with the optimizer's bytes; its gradient lives only within the step). An uneven
    last shard's padding, under dp elements a group, is not counted; nor are the step's
    all-gather buffer, at most `GATHER_ELEMENTS` elements, and the whole states a save gathers.
    """
    p_b, g_b, o_b = state_bytes(settings.precision, settings.optimizer)
    n = layout.shard_size if settings.sharding in SHARDED_MODES else 1
    # Routed experts (1/ep of them here) shard over the shard group's other n / ep ranks.
    n_experts = max(n // expert_degree(layout), 1)
    sharded = (shape.params - shape.experts) / n + shape.experts / n_experts
    device = [nbytes * sharded for nbytes in (p_b, g_b, o_b)]
    sync = settings.options.grad_sync
    if settings.sharding == "SHARD_OPTIMIZER":
        device[2] = (device[2] + device[0]) / layout.dp  # the states and the parameters' slice
    if n == 1 and sync.diloco_inner_steps:  # DiLoCo's anchor and outer momentum, fp32
        device[2] += (4 + (4 if sync.diloco_outer_momentum else 0)) * shape.params
    if n > 1 and settings.offload:
        return 0.0, 0.0, 0.0, sum(device)
    return device[0], device[1], device[2], 0.0


def buffer_bytes(
    model, layout: Layout, settings: TrainSettings, shape: StageShape, microbatches: int
) -> float:
    """Bytes of one rank that live only within a step, beside the activations at their peak.

    The peak is the turn from forward to backward, where every activation is alive:

    - FULL_SHARD / HYBRID_SHARD: the root unit (embedding, final norm, output) stays gathered
      from forward into backward (FSDP does not reshard the root, backward starts with it),
      and so does one block (FSDP2 keeps the last one; FSDP1 prefetches it for backward).
      Without limit_all_gathers the CPU can run ahead and gather every unit: the worst case.
      A unit's unsharded gradient appears only in backward, after the logits' activations
      (larger than any unit) are freed, so none is counted;
    - SHARD_GRAD_OP: every unit stays gathered from its forward until its backward;
    - under PP a sharded stage stays gathered from its first forward to its last backward
      (`parallel.parallelize` keeps it so), with unsharded grads from its first backward
      (torch.distributed.pipelining defers the reduce-scatter to the last). FSDP2 accumulates
      those in the reduce dtype (`FSDPParam.to_accumulated_grad_if_needed`): under
      bf16-mixed with fp32 reduction, 4 bytes a parameter beside the 2 of the gathered one;
    - without sharding, bf16-mixed autocast saves a bf16 copy of every weight for backward
      (FSDP's bf16 parameters make it unnecessary). DDP's buckets are views of the gradients
      (gradient_as_bucket_view=True) and cost nothing; PowerSGD
      (`strategy.grad_compression=powersgd`) keeps each bucket's error feedback, an fp32 copy
      of the gradients, from step to step;
    - a pipeline stage keeps what its in-flight microbatches need beside their blocks'
      activations (`pipeline_bytes`).
    """
    n = layout.shard_size if settings.sharding in SHARDED_MODES else 1
    # Gathered parameters and unsharded gradients are in the compute dtype.
    w = settings.gathered_param_bytes
    if n == 1:
        gathered = 2.0 * shape.params if settings.precision == "bf16-mixed" else 0.0
        if settings.options.grad_sync.grad_compression == "powersgd":
            gathered += 4.0 * shape.params
    elif layout.pp > 1:
        gathered = (w + settings.gradient_reduce_bytes) * shape.params
    elif settings.sharding == "SHARD_GRAD_OP" or not settings.limit_all_gathers:
        gathered = w * shape.params
    else:
        gathered = w * (sum(shape.roots) + (shape.block if shape.layers else 0.0))
    p2p = pipeline_bytes(model, layout, settings, shape, microbatches) if layout.pp > 1 else 0.0
    return gathered + p2p


def allocator_bytes(model, layout: Layout, settings: TrainSettings, shape: StageShape) -> float:
    """Bytes the CUDA caching allocator holds at the step's peak that no live tensor uses (0
    off GPUs: a CPU's allocator returns large blocks to the system). The allocator caches
    freed blocks per stream and never hands one stream's blocks to another, and it places
    each new block in a free one or past the end, so three things stay reserved:

    - FSDP2's all-gather buffers come from their own stream (`all_gather_copy_in` runs on a
      side stream; the gathered parameters are then copied out into tensors of the compute
      stream): that stream keeps the largest unit's gathered bytes (FSDP1 gathers into the
      parameters themselves, counted in `buffer_bytes`);
    - the reduce-scatter outputs, on the reduce-scatter stream: the largest unit's gradient
      shard in the reduce dtype;
    - the logits' gap: the logits in bf16 (w = 2) and their fp32 copy, freed when forward
      ends, leave 6 bytes a logit free; backward's first fp32 tensor of that size reuses 4 of
      them and the others go past the end, so 2 bytes a logit stay free at the peak (none in
      32-true: the logits are the fp32 tensor; none with the chunked loss; none with the
      compiled loss, which frees no tensor of that size in forward).

    Derived from torch 2.13's FSDP2 (`_fsdp_collectives.py`) and the op order of the loss,
    never measured on a GPU; the published torchtitan rows check it (docs/PLANNER.md).
    """
    if settings.accelerator != "gpu":
        return 0.0
    slack = 0.0
    n = layout.shard_size if settings.sharding in SHARDED_MODES else 1
    if n > 1:
        w = settings.gathered_param_bytes
        linear = 1 if settings.float8_all_gather else w
        block = shape.block_linear * linear + (shape.block - shape.block_linear) * w
        units = [sum(shape.roots) * w, block if shape.layers else 0.0]
        if settings.options.fsdp1 is None:
            slack += max(units)
        largest = max(sum(shape.roots), shape.block if shape.layers else 0.0)
        slack += largest * settings.gradient_reduce_bytes / n
    w = settings.matmul_bytes
    eager_loss = settings.loss == "eager" and not getattr(model, "loss_chunk_tokens", 0)
    if shape.has_output and w < 4 and eager_loss:
        slack += settings.rank_tokens(layout) * model.vocab_size / layout.tp * w
    return slack


def stage_memories(model, layout: Layout, settings: TrainSettings) -> list[MemoryBreakdown]:
    """Predicted peak bytes on one device of each pipeline rank, by category (`stage` names
    the rank: 'only', 'first', 'rank r', 'last'), in pipeline-rank order.

    `layout` must be resolved; the number of microbatches per step is the per-rank batch
    (global_batch_size / dp) over micro_batch_size. The reserve is the runtime's fixed cost
    (RESERVE_BYTES), not a tensor, so `MemoryBreakdown.tensors` leaves it out, and so is the
    caching allocator's slack (`allocator_bytes`); fragmentation beyond it is left to the fit
    test's one margin (DEFAULT_HEADROOM).
    """
    microbatches = settings.microbatches(layout.dp)
    out = []
    for stage, shape in stage_shapes(model, layout, settings.options.pipeline.split_points):
        params, grads, optimizer, host = model_state_bytes(layout, settings, shape)
        acts = activation_bytes(model, layout, settings, shape, microbatches)
        buffers = buffer_bytes(model, layout, settings, shape, microbatches)
        reserve = RESERVE_BYTES.get(settings.accelerator, RESERVE_BYTES["gpu"])
        slack = allocator_bytes(model, layout, settings, shape)
        out.append(
            MemoryBreakdown(params, grads, optimizer, acts, buffers, reserve, host, stage, slack)
        )
    return out


def memory_per_device(model, layout: Layout, settings: TrainSettings) -> MemoryBreakdown:
    """The worst pipeline rank's `stage_memories` (the largest total)."""
    return max(stage_memories(model, layout, settings), key=lambda m: m.total)
