"""Time per step: compute, communication over the links each mesh dimension crosses, overlap
and the pipeline bubble.

The mesh is laid out in `MESH_DIMS` order (pp, dp_replicate, dp_shard, tp), outermost first,
so the ranks of a tp group are consecutive, a dp_shard group strides by tp, and so on; whether a
group stays inside a node follows from that stride and the devices per node.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lightning_dist.parallel.layout import Layout
from lightning_dist.planner.memory import SHARDED_MODES, StageShape, stage_shapes
from lightning_dist.planner.settings import (
    DEFAULT_DP_OVERLAP,
    DEFAULT_EFFICIENCY,
    HOST_LINK_GBYTES_PER_SEC,
    HOST_OPTIMIZER_PARAMS_PER_SEC,
    NOMINAL_LINK_GBYTES_PER_SEC,
    NOMINAL_PEAK_FLOPS,
    RING_STEP_LATENCY_S,
    TrainSettings,
    state_bytes,
)

DDP_BUCKET_BYTES = 25e6  # DDP's default bucket_cap_mb


def allreduce_volume(nbytes: float, n: int) -> float:
    """Bytes each rank sends in a ring all-reduce of an `nbytes` tensor: 2(n-1)/n x nbytes."""
    return 2 * (n - 1) / n * nbytes


def allgather_volume(nbytes: float, n: int) -> float:
    """Bytes each rank receives in a ring all-gather whose output is `nbytes`: (n-1)/n x nbytes."""
    return (n - 1) / n * nbytes


def reduce_scatter_volume(nbytes: float, n: int) -> float:
    """Bytes each rank sends in a ring reduce-scatter of an `nbytes` input: (n-1)/n x nbytes."""
    return (n - 1) / n * nbytes


def bubble_fraction(schedule: str, pp: int, microbatches: int, virtual_stages: int = 1) -> float:
    """Idle fraction of a pipeline step.

    GPipe and 1F1B idle for (p - 1) stage-times out of m + p - 1, i.e. (p-1)/(m+p-1).
    Interleaving with v chunks per rank shrinks the ramp to (p - 1)/v chunk-times, giving
    ((p-1)/v) / (m + (p-1)/v). The zero-bubble schedules fill the ramp with weight-gradient
    work, so we count their bubble as zero.
    """
    if pp <= 1:
        return 0.0
    if schedule in ("InterleavedZeroBubble", "ZBVZeroBubble"):
        return 0.0
    ramp = (pp - 1) / (virtual_stages if schedule == "Interleaved1F1B" else 1)
    return ramp / (microbatches + ramp)


def group_span(inner: int, size: int, devices_per_node: int) -> tuple[bool, int]:
    """(crosses nodes, members per node) of a mesh group of `size` ranks strided by `inner`."""
    span = inner * size
    if size == 1 or devices_per_node % span == 0:
        return False, size
    if inner >= devices_per_node:
        return True, 1
    return True, max(1, min(size, devices_per_node // inner))


def link_bandwidth(hardware, crosses_nodes: bool, members_per_node: int) -> float:
    """Bytes/s per rank for a collective over a group.

    Inside a node: the NVLink/PCIe figure. Across nodes the k members of a node share k NICs,
    so a ring (NCCL runs one per NIC) moves k x the per-device network figure, capped by the
    intra-node link it also crosses.
    """
    intra = (hardware.intra_node_gbytes_per_sec or NOMINAL_LINK_GBYTES_PER_SEC) * 1e9
    if not crosses_nodes:
        return intra
    inter = (hardware.inter_node_gbytes_per_sec or NOMINAL_LINK_GBYTES_PER_SEC) * 1e9
    return min(intra, members_per_node * inter)


@dataclass(frozen=True)
class StepTime:
    """Predicted time of one optimizer step on the slowest rank, in seconds."""

    compute_seconds: float
    """Matmul time of every microbatch, recomputation included, without the bubble."""
    pipeline_seconds: float
    """Compute plus the pipeline bubble."""
    tp_comm_seconds: float
    dp_comm_seconds: float
    pp_comm_seconds: float
    offload_seconds: float
    exposed_comm_seconds: float
    step_seconds: float
    tokens_per_sec: float
    mfu: float | None
    comm_compute_ratio: float
    bubble_fraction: float


def _stage_flops_per_token(model, shape: StageShape, seq_len: int, recompute: bool) -> float:
    # Same accounting as ModelArgs.train_flops_per_token, restricted to this stage's blocks;
    # recomputation replays each block's forward, a third of its training FLOPs.
    per_layer = 6.0 * (model.block_params() - 2 * model.dim) + 12.0 * model.dim * seq_len
    if recompute:
        per_layer *= 4 / 3
    output = 6.0 * model.vocab_size * model.dim if shape.has_output else 0.0
    return shape.layers * per_layer + output


def step_time(
    model,
    hardware,
    layout: Layout,
    settings: TrainSettings,
    *,
    efficiency: float | None = None,
    overlap: float = DEFAULT_DP_OVERLAP,
) -> StepTime:
    """Time one step of `layout` (resolved) on `hardware`.

    - compute: the busiest stage's FLOPs per token x tokens per microbatch / tp, over
      peak x efficiency, for each of the m = (global_batch / dp) / micro_batch microbatches;
    - pipeline: m + (p-1)/v stage-times for GPipe/1F1B/interleaved, m for zero-bubble;
    - TP: 4 all-reduce-equivalents of b x s x dim activations per block per microbatch (2 in
      forward, 2 in backward; 6 with recomputation), inside the tp group's link, exposed;
    - PP: one activation forward and one gradient backward per microbatch and chunk, exposed;
    - DP: DDP all-reduces gradients once per step; FSDP all-gathers twice and reduce-scatters
      once per microbatch (FULL_SHARD; SHARD_GRAD_OP gathers once), or once per step under PP;
      HSDP adds an all-reduce of the gradient shard over dp_replicate. DP traffic hides behind
      `overlap` x the compute it can run under (the whole step for FSDP, the last backward for
      DDP, one microbatch under PP); the rest is exposed;
    - offload: host copies of the shards and a CPU optimizer step, exposed;
    - ring latency: (n-1) steps per ring all-gather/reduce-scatter, 2 log2 n per all-reduce.
    """
    tp, pp, dp = layout.tp, layout.pp, layout.dp
    per_node = hardware.resolved_devices()
    b, s = settings.micro_batch_size, settings.seq_len
    tokens_mb = b * s
    m = max(settings.global_batch_size // dp // b, 1)
    accel = hardware.accelerator
    eff = efficiency if efficiency is not None else DEFAULT_EFFICIENCY.get(accel, 0.5)
    peak = hardware.peak_flops(settings.precision)
    flops_rate = (peak or NOMINAL_PEAK_FLOPS) * eff
    shapes = [shape for _, shape in stage_shapes(model, layout)]
    ac = settings.activation_checkpointing
    stage_flops = max(_stage_flops_per_token(model, sh, s, ac) for sh in shapes)
    t_mb = stage_flops * tokens_mb / tp / flops_rate
    compute = m * t_mb
    bubble = bubble_fraction(layout.schedule, pp, m, layout.virtual_stages)
    pipeline = compute / (1 - bubble)
    layers = max(sh.layers for sh in shapes)
    psi = max(sh.params for sh in shapes)
    units = max(sh.layers + len(sh.roots) for sh in shapes)
    w = 4 if settings.precision == "32-true" else 2
    alpha = RING_STEP_LATENCY_S

    def link(inner: int, size: int) -> tuple[float, float]:
        crosses, members = group_span(inner, size, per_node)
        return link_bandwidth(hardware, crosses, members), alpha["inter" if crosses else "intra"]

    tp_comm = 0.0
    if tp > 1:
        bw, lat = link(1, tp)
        calls = m * layers * (6 if ac else 4)
        tp_comm = calls * (allreduce_volume(tokens_mb * model.dim * w, tp) / bw + 2 * (tp - 1) * lat)

    pp_comm = 0.0
    if pp > 1:
        bw, lat = link(layout.dp * tp, pp)
        sp = tp if settings.sequence_parallel else 1
        v = layout.virtual_stages
        pp_comm = m * v * 2 * (tokens_mb * model.dim * w / sp / bw + lat)

    p_b, g_b, _ = state_bytes(settings.precision, settings.optimizer)
    p_b, g_b = min(p_b, w), min(g_b, w)  # collectives run in the compute dtype
    sharded = settings.sharding in SHARDED_MODES and layout.dp_shard > 1
    dp_comm = offload = 0.0
    if not sharded and dp > 1:
        bw, lat = link(tp, dp)
        buckets = math.ceil(g_b * psi / DDP_BUCKET_BYTES)
        dp_comm = allreduce_volume(g_b * psi, dp) / bw + buckets * 2 * math.log2(dp) * lat
        hideable = t_mb * 2 / 3
    elif sharded:
        n, r = layout.dp_shard, layout.dp_replicate
        bw, lat = link(tp, n)
        gathers = 2 if (pp == 1 and settings.sharding != "SHARD_GRAD_OP") else 1
        rounds = m if pp == 1 else 1
        per_round = (gathers * allgather_volume(p_b * psi, n) + reduce_scatter_volume(g_b * psi, n)) / bw
        per_round += units * (gathers + 1) * (n - 1) * lat
        if r > 1:
            bw_r, lat_r = link(tp * n, r)
            per_round += allreduce_volume(g_b * psi / n, r) / bw_r + units * 2 * math.log2(r) * lat_r
        dp_comm = rounds * per_round
        hideable = compute if pp == 1 else t_mb
        if settings.offload:
            copies = rounds * (gathers * p_b + g_b) * psi / n / (HOST_LINK_GBYTES_PER_SEC * 1e9)
            offload = copies + psi / n / HOST_OPTIMIZER_PARAMS_PER_SEC
    else:
        hideable = 0.0
    exposed_dp = max(0.0, dp_comm - overlap * hideable)
    exposed = tp_comm + pp_comm + exposed_dp
    step = pipeline + exposed + offload
    tokens = settings.global_batch_size * s
    tokens_per_sec = tokens / step
    mfu = None
    if peak:
        mfu = model.train_flops_per_token(s) * tokens_per_sec / (layout.world_size * peak)
    ratio = (tp_comm + pp_comm + dp_comm) / compute
    return StepTime(
        compute, pipeline, tp_comm, dp_comm, pp_comm, offload, exposed, step, tokens_per_sec, mfu,
        ratio, bubble,
    )
