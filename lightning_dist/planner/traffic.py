"""Bytes each mesh dimension moves per step: ring volumes of the collectives, tensor-parallel
calls, the context- and expert-parallel exchanges, data-parallel traffic by FSDP mode
(`step_time` in planner/timing.py times them; the dry run measures the same bytes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lightning_dist.layout import Layout
from lightning_dist.planner.experts import all_to_all_bytes, expert_degree
from lightning_dist.planner.memory import SHARDED_MODES, checkpointed_blocks
from lightning_dist.planner.settings import TrainSettings, state_bytes
from lightning_dist.planner.stage_shapes import StageShape


def allreduce_volume(nbytes: float, n: int) -> float:
    """Bytes each rank sends in a ring all-reduce of an `nbytes` tensor: 2(n-1)/n x nbytes."""
    return 2 * (n - 1) / n * nbytes


def allgather_volume(nbytes: float, n: int) -> float:
    """Bytes each rank receives in a ring all-gather whose output is `nbytes`: (n-1)/n x nbytes."""
    return (n - 1) / n * nbytes


def reduce_scatter_volume(nbytes: float, n: int) -> float:
    """Bytes each rank sends in a ring reduce-scatter of an `nbytes` input: (n-1)/n x nbytes."""
    return (n - 1) / n * nbytes


def ring_volume(kind: str, nbytes: float, n: int) -> float:
    """Bytes each rank moves in one collective of `kind` over `n` ranks whose full tensor is
    `nbytes` (all_gather, reduce_scatter, all_reduce as above; all_to_all (n-1)/n; send and
    broadcast the whole tensor)."""
    if kind == "all_gather":
        return allgather_volume(nbytes, n)
    if kind == "reduce_scatter":
        return reduce_scatter_volume(nbytes, n)
    if kind == "all_reduce":
        return allreduce_volume(nbytes, n)
    return nbytes if kind in ("send", "broadcast") else (n - 1) / n * nbytes


def cp_exchange(
    model, layout: Layout, settings: TrainSettings, shape: StageShape
) -> tuple[float, int]:
    """(ring bytes, ring steps) one rank of the stage `shape` moves over its cp group in one
    microbatch, by the ops of `parallel/context_parallel.py`, with w, kv = n_kv_heads x
    head_dim per tp rank and b x s / cp tokens on a rank:

    - allgather: each block all-gathers its keys and values in forward (2 x b x s x kv x w
      gathered: (cp - 1) / cp of it received; two all-gathers, cp - 1 ring steps each) and
      all-reduces their gradients in backward (twice that, two all-reduces of 2 log2 cp steps;
      gloo has no reduce-scatter, so the code all-reduces on every backend);
    - ulysses: four all-to-alls a block in forward (queries, keys, values, the output) and four
      in backward, each moving (cp - 1) / cp of this rank's tensor: b x s / cp tokens of d / tp
      (queries, output) or of max(kv_heads / tp, cp) heads (keys and values, repeated up to cp);
    - a checkpointed block's forward exchange runs again in its backward (full or op: the
      op policy keeps no all-gather or all-to-all output).
    """
    cp, tp, w = layout.cp, layout.tp, settings.matmul_bytes
    b, s, d = settings.micro_batch_size, settings.seq_len, model.dim
    hd = d // model.n_heads
    kv_heads = (model.n_kv_heads or model.n_heads) // tp
    replayed = checkpointed_blocks(layout, settings, shape)
    if settings.cp_mode == "ulysses":
        local = b * s / cp * w * (2 * d / tp + 2 * max(kv_heads, cp) * hd)
        forward = (cp - 1) / cp * local
        volume = shape.layers * 2 * forward + replayed * forward
        return volume, (shape.layers * 8 + replayed * 4) * (cp - 1)
    gathered = 2 * b * s * kv_heads * hd * w
    forward = allgather_volume(gathered, cp)
    backward = allreduce_volume(gathered, cp)
    volume = shape.layers * (forward + backward) + replayed * forward
    steps = shape.layers * 2 * (cp - 1 + 2 * math.ceil(math.log2(cp))) + replayed * 2 * (cp - 1)
    return volume, steps


def ep_exchange(
    model, layout: Layout, settings: TrainSettings, shape: StageShape
) -> tuple[float, int]:
    """(bytes, all-to-alls) one rank of the stage `shape` sends over its ep group in one
    microbatch: four all-to-alls per MoE block (dispatch and combine, forward and backward),
    two more for a checkpointed block, in full or op-level (its forward runs again, and the
    op policies save only functional collectives, not c10d's `all_to_all_single`:
    `experts.moe_mlp_kept_bytes`), each of `experts.all_to_all_bytes` over the microbatch's
    tokens (every tp rank routes the whole sequence: the layer is replicated over tp)."""
    ep = expert_degree(layout)
    tokens = settings.rank_tokens(layout)
    replayed = checkpointed_blocks(layout, settings, shape)
    calls = 4 * shape.moe_layers + 2 * min(replayed, shape.moe_layers)
    return calls * all_to_all_bytes(model, settings, tokens, ep), calls


def tp_calls(layout: Layout, settings: TrainSettings, shape: StageShape) -> int:
    """All-reduce equivalents of b x s x dim activations per microbatch of one stage rank.

    Per block: 2 in forward, 2 in backward. Under SP a plain block's backward gathers the
    projections' inputs again (2 all-gathers, half an all-reduce each:
    `parallel/sequence_parallel.py`); a checkpointed block does not, but replays its forward's:
    all 2 under full, the gathers alone under op. The vocab-parallel embedding adds one (its
    output's all-reduce, or under SP its reduce-scatter and its gradient's all-gather), and so
    does the output projection (its input's gradient, or under SP a gather each way).

    An MoE block's feed-forward part is replicated over tp and runs whole on every tp rank
    (`parallel/expert_parallel.py`): without SP it communicates nothing (2 calls less), under SP
    it gathers the sequence in forward and its gradient's share in backward (1 less).
    """
    mode = settings.activation_checkpointing.mode
    regather = 1 if settings.sequence_parallel else 0
    replayed = {"full": 2, "op": regather}.get(mode, 0)
    checkpointed = checkpointed_blocks(layout, settings, shape)
    ends = int(shape.has_embedding) + int(shape.has_output)
    moe = shape.moe_layers * (1 if settings.sequence_parallel else 2)
    return (4 + regather) * shape.layers - moe + (replayed - regather) * checkpointed + ends


@dataclass(frozen=True)
class DPVolumes:
    """Ring bytes per rank of one round of data-parallel traffic (one microbatch without PP,
    the whole step under PP), and how many rounds a step has."""

    gather: float
    """FSDP's all-gather of the parameters in forward."""
    regather: float
    """Its all-gather again in backward (FULL_SHARD without PP): all but the last block."""
    reduce_scatter: float
    replicate_all_reduce: float
    """HSDP's all-reduce of the gradient shard over dp_replicate."""
    all_reduce: float
    """DDP (no sharding): the gradients' all-reduce, once per step."""
    rounds: int
    expert_gather: float = 0.0
    """A mixture of experts under ep: the routed experts' share of `gather`, `regather` and
    `reduce_scatter` (in these three, not in those), over their own FSDP group of
    shard_size / ep ranks (`parallel/expert_parallel.experts_fsdp_mesh`), which strides
    tp x ep."""
    expert_regather: float = 0.0
    expert_reduce_scatter: float = 0.0

    @property
    def sharded(self) -> float:
        """FSDP's bytes of one round, experts included."""
        return (
            self.gather
            + self.regather
            + self.reduce_scatter
            + self.expert_gather
            + self.expert_regather
            + self.expert_reduce_scatter
        )


def dp_volumes(layout: Layout, settings: TrainSettings, shape: StageShape, model=None) -> DPVolumes:
    """The data-parallel traffic of one rank of the stage `shape`; see `dp_phases`. Without
    sharding (DDP) the gradients' all-reduce is `ddp_gradient_bytes`' (`model` is needed for
    PowerSGD's matrix shapes)."""
    m = settings.microbatches(layout.dp)
    p_b, g_b = settings.gathered_param_bytes, settings.gradient_reduce_bytes
    n, r, psi = layout.shard_size, layout.dp_replicate, shape.params
    if settings.sharding == "SHARD_OPTIMIZER":
        # ZeRO-1 as parallel/sharded_optimizer.py runs it: the gradients (in the parameters'
        # dtype) reduce-scattered over the replicas, each rank updating its slice of the
        # parameters and all-gathering them: the bytes of one all-reduce, no all-reduce.
        rest = state_bytes(settings.precision, settings.optimizer)[0]
        return DPVolumes(
            gather=allgather_volume(rest * psi, layout.dp),
            regather=0.0,
            reduce_scatter=reduce_scatter_volume(rest * psi, layout.dp),
            replicate_all_reduce=0.0,
            all_reduce=0.0,
            rounds=1,
        )
    if settings.sharding not in SHARDED_MODES or n == 1:
        volume = allreduce_volume(ddp_gradient_bytes(settings, shape, model, layout.tp), layout.dp)
        return DPVolumes(0.0, 0.0, 0.0, 0.0, volume, 1)
    full = layout.pp == 1 and settings.sharding != "SHARD_GRAD_OP"
    kept = shape.block if shape.layers else 0.0
    # Under the float8 all-gather the blocks' linear weights travel as one byte each.
    fp8 = (p_b - 1) * shape.block_linear if settings.float8_all_gather else 0.0
    gathered = p_b * psi - fp8 * shape.layers
    regathered = p_b * (psi - kept) - fp8 * max(shape.layers - 1, 0)
    # A mixture of experts: the routed experts (1/ep of them here) shard over n / ep ranks,
    # the rest over n; each volume splits by the experts' share of the stage's parameters.
    # Every layer's experts reshard after forward, the last block's too
    # (`parallel.expert_parallel.apply_expert_fsdp`): backward gathers them all again.
    n_e, e = max(n // expert_degree(layout), 1), shape.experts / psi if psi else 0.0
    shard = g_b * psi * ((1 - e) / n + e / n_e)
    return DPVolumes(
        gather=allgather_volume((1 - e) * gathered, n),
        regather=allgather_volume((1 - e) * regathered, n) if full else 0.0,
        reduce_scatter=reduce_scatter_volume((1 - e) * g_b * psi, n),
        replicate_all_reduce=allreduce_volume(shard, r) if r > 1 else 0.0,
        all_reduce=0.0,
        rounds=m if layout.pp == 1 else 1,
        expert_gather=allgather_volume(e * gathered, n_e),
        expert_regather=allgather_volume(e * gathered, n_e) if full else 0.0,
        expert_reduce_scatter=reduce_scatter_volume(e * g_b * psi, n_e),
    )


def ddp_gradient_bytes(settings: TrainSettings, shape: StageShape, model, tp: int) -> float:
    """Bytes DDP all-reduces per optimizer step for one rank of the stage `shape`
    (`strategy.grad_compression`, `strategy.diloco_inner_steps`; `cluster/grad_sync.py`,
    `cluster/diloco.py`):

    - none: every gradient in the parameters' dtype; bf16, fp16: 2 bytes each;
    - powersgd (rank r): each weight matrix [m, n] as its two factors P [m, r] and Q [n, r] in
      fp32 (steady state, past `powersgd_start_step`), the vectors (norm scales) whole;
    - DiLoCo (H inner steps): no gradient all-reduce; every H steps one all-reduce of the
      fp32 parameter change: 4 bytes a parameter over H steps."""
    sync, psi = settings.options.grad_sync, shape.params
    if sync.diloco_inner_steps:
        return 4 * psi / sync.diloco_inner_steps
    if sync.grad_compression == "powersgd" and model is not None:
        from lightning_dist.planner.compute import block_matmuls

        rank, d = sync.powersgd_rank, model.dim
        block = sum(n + k for n, k in block_matmuls(model, tp)) * rank
        vocab = (model.vocab_size / tp + d) * rank * len(shape.roots)
        vectors = 2 * d * shape.layers + d * shape.has_output
        return 4 * (block * shape.layers + vocab + vectors)
    return settings.gradient_reduce_bytes * psi


def traffic_by_dim(
    model, layout: Layout, settings: TrainSettings, shape: StageShape
) -> dict[str, float]:
    """Ring bytes one rank of the stage `shape` moves in one optimizer step, by mesh dimension
    (what `step_time` times; the dry run measures the same quantity). Pipeline traffic is what
    the rank sends: each microbatch's activations forward and gradients backward, for each of
    its chunks but the model's first and last ends."""
    m = settings.microbatches(layout.dp)
    act_bytes = settings.rank_tokens(layout) * model.dim * settings.matmul_bytes
    out: dict[str, float] = {}
    if layout.tp > 1:
        out["tp"] = m * tp_calls(layout, settings, shape) * allreduce_volume(act_bytes, layout.tp)
    if layout.pp > 1:
        sp = layout.tp if settings.sequence_parallel else 1
        sends = 2 * layout.virtual_stages - shape.has_embedding - shape.has_output
        out["pp"] = m * sends * act_bytes / sp
    if layout.cp > 1:
        out["cp"] = m * cp_exchange(model, layout, settings, shape)[0]
    if expert_degree(layout) > 1:
        out["ep"] = m * ep_exchange(model, layout, settings, shape)[0]
    if layout.dp * layout.cp > 1:
        v = dp_volumes(layout, settings, shape, model)
        if settings.sharding == "SHARD_OPTIMIZER":  # ZeRO-1's reduce-scatter and all-gather
            out["dp_replicate"] = v.reduce_scatter + v.gather
        elif v.all_reduce:  # DDP over the replicas
            out["dp_replicate"] = v.all_reduce
        else:
            shard_dim = "dp_shard_cp" if layout.cp > 1 else "dp_shard"
            out[shard_dim] = v.rounds * v.sharded
            if v.replicate_all_reduce:
                out["dp_replicate"] = v.rounds * v.replicate_all_reduce
    return out
