"""Time per step: compute, communication over the links each mesh dimension crosses, overlap
and the pipeline bubble.

The mesh is laid out in `MESH_DIMS` order (pp, dp_replicate, dp_shard, cp, tp), outermost first,
so the ranks of a tp group are consecutive, a cp group strides by tp, FSDP's shard group
(dp_shard x cp, flattened) by tp too, and so on; whether a group stays inside a node follows
from that stride and the devices per node.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lightning_dist.layout import Layout
from lightning_dist.planner.compute import (
    block_matmuls,
    microbatch_compute,
    recomputed_projections,
)
from lightning_dist.planner.experts import all_to_all_bytes, expert_degree, is_moe
from lightning_dist.planner.memory import (
    SHARDED_MODES,
    StageShape,
    checkpointed_blocks,
    stage_shapes,
)
from lightning_dist.planner.mixed import rank_groups, slowest
from lightning_dist.planner.settings import (
    COMPILE_SPEEDUP,
    DEFAULT_DP_OVERLAP,
    DEFAULT_EFFICIENCY,
    DEFAULT_OVERLAP_SLOWDOWN,
    HOST_LINK_GBYTES_PER_SEC,
    HOST_OPTIMIZER_PARAMS_PER_SEC,
    NOMINAL_LINK_GBYTES_PER_SEC,
    NOMINAL_PEAK_FLOPS,
    RING_STEP_LATENCY_S,
    SELECTIVE_RECOMPUTE_SHARE,
    TrainSettings,
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


def bubble_fraction(schedule: str, pp: int, microbatches: int, virtual_stages: int = 1) -> float:
    """Idle fraction of a pipeline step.

    GPipe and 1F1B idle for (p - 1) stage-times out of m + p - 1, i.e. (p-1)/(m+p-1).
    Interleaving with v chunks per rank shrinks the ramp to (p - 1)/v chunk-times, giving
    ((p-1)/v) / (m + (p-1)/v). The zero-bubble schedules fill the cool-down with deferred
    weight-gradient work but not the warm-up: each rank still waits p - 1 chunk forwards, out
    of 3 m v chunk-forward times of work (F : I : W = 1 : 1 : 1), i.e. (p-1)/(3mv + p-1).
    bench/schedules.py replays torch's own action tables and finds exactly these numbers.
    """
    if pp <= 1:
        return 0.0
    if schedule in ("InterleavedZeroBubble", "ZBVZeroBubble"):
        return (pp - 1) / (3 * microbatches * virtual_stages + pp - 1)
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
    cp_comm_seconds: float = 0.0
    """Context parallelism's key/value exchange (`cp_exchange`), exposed."""
    ep_comm_seconds: float = 0.0
    """Expert parallelism's all-to-alls (`ep_exchange`), exposed."""


def _stage_flops_per_token(
    model, layout: Layout, settings: TrainSettings, shape: StageShape
) -> tuple[float, float]:
    """(training FLOPs, recomputation FLOPs) per token of one rank of a stage.

    Same accounting as ModelArgs.train_flops_per_token, restricted to this stage's blocks. A
    block checkpointed in full replays its forward, a third of its training FLOPs; under 'op'
    it replays pointwise ops, counted as SELECTIVE_RECOMPUTE_SHARE of its training time, and
    the forward of the projections it does not keep (`compute.recomputed_projections`: under TP
    the row-parallel wo and w2, under op_alternate also wk, wo and w3).
    """
    d = model.dim
    if is_moe(model):  # the active path: a token's experts, not all of them
        per_layer = model.train_flops_per_token(settings.seq_len) / model.n_layers
    else:
        per_layer = 6.0 * (model.block_params() - 2 * d) + 12.0 * d * settings.seq_len
    output = 6.0 * model.vocab_size * d if shape.has_output else 0.0
    checkpointed = checkpointed_blocks(layout, settings, shape)
    choice = settings.activation_checkpointing
    if choice.mode == "full":
        return shape.layers * per_layer + output, checkpointed * per_layer / 3
    whole = block_matmuls(model, 1)
    again = recomputed_projections(layout.tp, choice.alternate_matmuls)
    replay = per_layer * SELECTIVE_RECOMPUTE_SHARE
    replay += sum(2.0 * whole[i][0] * whole[i][1] for i in again)
    return shape.layers * per_layer + output, checkpointed * replay


def _stage_compute(model, hardware, layout: Layout, settings: TrainSettings, shape: StageShape,
                   peak: float):  # fmt: skip
    """One microbatch of one rank of a stage, by planner/compute.py's model."""
    mode = settings.activation_checkpointing.mode
    return microbatch_compute(
        model, hardware, tp=layout.tp, layers=shape.layers, has_output=shape.has_output,
        checkpointed=checkpointed_blocks(layout, settings, shape), mode=mode,
        tokens=settings.rank_tokens(layout), seq_len=settings.seq_len,
        peak=peak, compiled=settings.compile and settings.compile_backend == "inductor",
        sequence_parallel=settings.sequence_parallel and layout.tp > 1,
        attention=settings.attention,
        # a spec without a float8 peak times float8 projections as bf16 ones (estimate refuses
        # float8 on a GPU spec with datasheet figures but no float8 peak: an A100)
        float8_peak=hardware.peak_tflops_fp8 * 1e12
        if settings.float8 and hardware.peak_tflops_fp8 else None,
        float8_weight_share=1 / layout.shard_size if settings.float8_all_gather else 1.0,
        masked=layout.cp > 1 and settings.cp_mode == "allgather",
        alternate=settings.activation_checkpointing.alternate_matmuls,
        moe_layers=shape.moe_layers, ep=expert_degree(layout),
    )  # fmt: skip


def exposed_seconds(phases: list[tuple[float, float]], overlap: float, slowdown: float) -> float:
    """Time DP traffic adds to a step, given (comm, compute it can run under) per phase.

    Communication hides under at most `overlap` x the compute of its phase; the excess is
    exposed, and the hidden part still slows that compute by `slowdown` (NCCL kernels take SMs
    and memory bandwidth from the matmuls).
    """
    total = 0.0
    for comm, compute in phases:
        hidden = min(comm, overlap * compute)
        total += comm - hidden + slowdown * hidden
    return total


def step_time(
    model,
    hardware,
    layout: Layout,
    settings: TrainSettings,
    *,
    efficiency: float | None = None,
    overlap: float = DEFAULT_DP_OVERLAP,
    slowdown: float = DEFAULT_OVERLAP_SLOWDOWN,
    compile_speedup: float | None = None,
) -> StepTime:
    """Time one step of `layout` (resolved) on `hardware`.

    - compute, for each of the m = (global_batch / dp) / micro_batch microbatches (of
      micro_batch x seq_len / cp tokens on a rank: `TrainSettings.rank_tokens`): on a device
      whose spec has `memory_gbytes_per_sec` and `matmul_efficiency` (and without an explicit
      `efficiency`), the busiest stage's matmuls by shape, attention and pointwise traffic
      (planner/compute.py); otherwise its FLOPs per token (recomputation included: a third more
      for each block checkpointed in full, SELECTIVE_RECOMPUTE_SHARE more under 'op') x tokens
      per microbatch / tp, over peak x efficiency, under `settings.compile` divided by
      `compile_speedup` (default COMPILE_SPEEDUP of the backend);
    - pipeline: m + (p-1)/v stage-times for GPipe/1F1B/interleaved, m for zero-bubble;
    - TP: `tp_calls` all-reduce-equivalents of b x s x dim activations per microbatch (4 per
      block, 2 in forward and 2 in backward, 6 for a block checkpointed in full, whose
      recomputed forward communicates again, 5 under SP; one for the embedding and one for the
      output projection), over the tp group's link, exposed;
    - PP: one activation forward and one gradient backward per microbatch and chunk, exposed;
    - CP: the key/value exchange of every block (`cp_exchange`) over the cp group, exposed
      (the attention step waits for it);
    - DP: see `dp_phases`; it hides under compute as `exposed_seconds` describes;
    - offload: host copies of the shards and a CPU optimizer step, exposed;
    - ring latency: (n-1) steps per ring all-gather/reduce-scatter, 2 log2 n per all-reduce.
    """
    tp, pp = layout.tp, layout.pp
    s = settings.seq_len
    m = settings.microbatches(layout.dp)
    eff = (
        efficiency if efficiency is not None else DEFAULT_EFFICIENCY.get(hardware.accelerator, 0.5)
    )
    peak = hardware.peak_flops(settings.precision)
    split_points = settings.options.pipeline.split_points
    shapes = [shape for _, shape in stage_shapes(model, layout, split_points)]
    physical = (
        efficiency is None and peak and hardware.memory_gbytes_per_sec
        and hardware.matmul_efficiency
    )  # fmt: skip
    if physical:  # matmuls by shape, attention, pointwise traffic: planner/compute.py
        specs = stage_hardware(hardware, layout, settings)
        stage = max(
            (_stage_compute(model, specs[sh.rank], layout, settings, sh,
                            specs[sh.rank].peak_flops(settings.precision)) for sh in shapes),
            key=lambda c: c.seconds,
        )  # fmt: skip
        # Compilation is in the pointwise term; an explicit `compile_speedup` still divides.
        t_mb = stage.seconds / (compile_speedup or 1.0)
        fwd = stage.train_seconds / 3 / (compile_speedup or 1.0)
    else:
        if compile_speedup is None:
            compile_speedup = COMPILE_SPEEDUP[settings.compile_backend] if settings.compile else 1.0
        train, recompute = max(
            (_stage_flops_per_token(model, layout, settings, sh) for sh in shapes), key=sum
        )
        speed = (peak or NOMINAL_PEAK_FLOPS) * eff * compile_speedup
        t_mb = (train + recompute) * settings.rank_tokens(layout) / tp / speed
        # Forward is a third of the training FLOPs, less once backward recomputes some of it.
        fwd = t_mb * train / 3 / (train + recompute)
    compute = m * t_mb
    bubble = bubble_fraction(layout.schedule, pp, m, layout.virtual_stages)
    pipeline = compute / (1 - bubble)
    link = _links(hardware, layout)
    w = settings.matmul_bytes
    act_bytes = settings.rank_tokens(layout) * model.dim * w  # one microbatch's hidden states

    tp_comm = 0.0
    if tp > 1:
        bw, lat = link(1, tp)
        calls = m * max(tp_calls(layout, settings, sh) for sh in shapes)
        tp_comm = calls * (allreduce_volume(act_bytes, tp) / bw + 2 * (tp - 1) * lat)
    pp_comm = 0.0
    if pp > 1:
        bw, lat = link(layout.dp * tp, pp)
        sp = tp if settings.sequence_parallel else 1
        pp_comm = m * layout.virtual_stages * 2 * (act_bytes / sp / bw + lat)
    cp_comm = 0.0
    if layout.cp > 1:
        bw, lat = link(tp, layout.cp)
        volume, steps = max(cp_exchange(model, layout, settings, sh) for sh in shapes)
        cp_comm = m * (volume / bw + steps * lat)
    ep_comm = 0.0
    if expert_degree(layout) > 1:
        ep = expert_degree(layout)
        bw, lat = link(tp, ep)
        volume, calls = max(ep_exchange(model, layout, settings, sh) for sh in shapes)
        ep_comm = m * (volume / bw + calls * (ep - 1) * lat)
    phases, offload = dp_phases(layout, settings, shapes, link, m, fwd, t_mb - fwd)
    dp_comm = sum(comm for comm, _ in phases)
    exposed = tp_comm + pp_comm + cp_comm + ep_comm + exposed_seconds(phases, overlap, slowdown)
    step = pipeline + exposed + offload
    tokens_per_sec = settings.global_batch_size * s / step
    mfu = None
    if peak:
        mfu = model.train_flops_per_token(s) * tokens_per_sec / (layout.world_size * peak)
    ratio = (tp_comm + pp_comm + cp_comm + ep_comm + dp_comm) / compute
    return StepTime(
        compute,
        pipeline,
        tp_comm,
        dp_comm,
        pp_comm,
        offload,
        exposed,
        step,
        tokens_per_sec,
        mfu,
        ratio,
        bubble,
        cp_comm,
        ep_comm,
    )


def stage_hardware(hardware, layout: Layout, settings: TrainSettings) -> list:
    """The spec each pipeline rank computes on: the spec itself, or on mixed hardware its
    group's (`planner/mixed.py`); without PP, mixed groups run at the slowest one's speed."""
    if not hardware.mixed:
        return [hardware] * layout.pp
    groups = rank_groups(hardware, layout)
    if groups is None or layout.pp == 1:
        return [slowest(list(hardware.groups.values()), settings.precision)] * layout.pp
    return groups


def _links(hardware, layout: Layout):
    per_node = hardware.resolved_devices()

    def link(inner: int, size: int) -> tuple[float, float]:
        """(bytes/s, seconds per ring step) of a group of `size` ranks strided by `inner`; on
        mixed hardware, one whose ranks span node groups (the first such group, from rank 0)
        is capped by the link between the groups (`site_link_*`)."""
        crosses, members = group_span(inner, size, per_node)
        latency = RING_STEP_LATENCY_S["inter" if crosses else "intra"]
        bandwidth = link_bandwidth(hardware, crosses, members)
        if hardware.mixed and crosses:
            names = {hardware.node_group(r * inner // per_node)[0] for r in range(size)}
            if len(names) > 1:
                site = hardware.site_link_gbytes_per_sec
                if site is not None:
                    bandwidth = min(bandwidth, members * site * 1e9)
                if hardware.site_link_latency_ms is not None:
                    latency = max(latency, hardware.site_link_latency_ms / 1e3)
        return bandwidth, latency

    return link


def dp_phases(layout, settings, shapes, link, m, fwd, bwd):
    """Data-parallel traffic as [(comm seconds, compute seconds it may hide under)], plus the
    offload seconds.

    DDP all-reduces the gradients once per step, under the last microbatch's backward. FSDP
    FULL_SHARD all-gathers in forward, all-gathers again and reduce-scatters in backward, for
    every microbatch (FSDP does not skip gradient sync while accumulating) over its shard
    group, dp_shard x cp (context-parallel ranks shard and reduce too), all but the last
    block (`parallel.fsdp.apply_fsdp` keeps it gathered); SHARD_GRAD_OP keeps the forward gather
    for backward. Under PP the stage stays gathered for the whole step: one
    all-gather under the first forward, one reduce-scatter under the last backward. HSDP adds an
    all-reduce of the gradient shard over dp_replicate after each reduce-scatter.
    """
    shape = max(shapes, key=lambda sh: sh.params)
    psi = shape.params
    units = max(sh.layers + len(sh.roots) for sh in shapes)
    p_b, g_b = settings.gathered_param_bytes, settings.gradient_reduce_bytes
    tp, dp, n, r = layout.tp, layout.dp, layout.shard_size, layout.dp_replicate
    if dp * layout.cp == 1:
        return [], 0.0
    volume = dp_volumes(layout, settings, shape)
    if settings.sharding not in SHARDED_MODES or n == 1:
        bw, lat = link(tp, dp)
        buckets = math.ceil(g_b * psi / DDP_BUCKET_BYTES)
        comm = volume.all_reduce / bw + buckets * 2 * math.log2(dp) * lat
        return [(comm, bwd)], 0.0
    bw, lat = link(tp, n)
    gather = volume.gather / bw + units * (n - 1) * lat
    regather = volume.regather / bw + (units - 1) * (n - 1) * lat if volume.regather else 0.0
    scatter = volume.reduce_scatter / bw + units * (n - 1) * lat
    if r > 1:
        bw_r, lat_r = link(tp * n, r)
        scatter += volume.replicate_all_reduce / bw_r + units * 2 * math.log2(r) * lat_r
    full = volume.regather > 0
    rounds = volume.rounds
    phases = [(gather, fwd), (scatter + regather, bwd)] * rounds
    offload = 0.0
    if settings.offload:
        copied = rounds * ((2 if full else 1) * p_b + g_b) * psi / n
        offload = (
            copied / (HOST_LINK_GBYTES_PER_SEC * 1e9) + psi / n / HOST_OPTIMIZER_PARAMS_PER_SEC
        )
    return phases, offload


def cp_exchange(model, layout: Layout, settings: TrainSettings,
                shape: StageShape) -> tuple[float, int]:  # fmt: skip
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


def ep_exchange(model, layout: Layout, settings: TrainSettings,
                shape: StageShape) -> tuple[float, int]:  # fmt: skip
    """(bytes, all-to-alls) one rank of the stage `shape` sends over its ep group in one
    microbatch: four all-to-alls per MoE block (dispatch and combine, forward and backward),
    two more for a block checkpointed in full (its forward runs again; op-level checkpointing
    keeps both outputs), each of `experts.all_to_all_bytes` (an MoE block routes this rank's
    sequence shard under SP)."""
    ep = expert_degree(layout)
    sp = layout.tp if settings.sequence_parallel else 1
    tokens = settings.rank_tokens(layout) / sp
    replayed = (
        checkpointed_blocks(layout, settings, shape)
        if settings.activation_checkpointing.mode == "full"
        else 0
    )
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
    """
    mode = settings.activation_checkpointing.mode
    regather = 1 if settings.sequence_parallel else 0
    replayed = {"full": 2, "op": regather}.get(mode, 0)
    checkpointed = checkpointed_blocks(layout, settings, shape)
    ends = int(shape.has_embedding) + int(shape.has_output)
    return (4 + regather) * shape.layers + (replayed - regather) * checkpointed + ends


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


def dp_volumes(layout: Layout, settings: TrainSettings, shape: StageShape) -> DPVolumes:
    """The data-parallel traffic of one rank of the stage `shape`; see `dp_phases`."""
    m = settings.microbatches(layout.dp)
    p_b, g_b = settings.gathered_param_bytes, settings.gradient_reduce_bytes
    n, r, psi = layout.shard_size, layout.dp_replicate, shape.params
    if settings.sharding not in SHARDED_MODES or n == 1:
        return DPVolumes(0.0, 0.0, 0.0, 0.0, allreduce_volume(g_b * psi, layout.dp), 1)
    full = layout.pp == 1 and settings.sharding != "SHARD_GRAD_OP"
    kept = shape.block if shape.layers else 0.0
    # Under the float8 all-gather the blocks' linear weights travel as one byte each.
    fp8 = (p_b - 1) * shape.block_linear if settings.float8_all_gather else 0.0
    gathered = p_b * psi - fp8 * shape.layers
    regathered = p_b * (psi - kept) - fp8 * max(shape.layers - 1, 0)
    # A mixture of experts: the routed experts (1/ep of them here) shard over n / ep ranks,
    # the rest over n; each volume splits by the experts' share of the stage's parameters.
    n_e, e = max(n // expert_degree(layout), 1), shape.experts / psi if psi else 0.0

    def gather(nbytes: float) -> float:
        return allgather_volume((1 - e) * nbytes, n) + allgather_volume(e * nbytes, n_e)

    def scatter(nbytes: float) -> float:
        return reduce_scatter_volume((1 - e) * nbytes, n) + reduce_scatter_volume(e * nbytes, n_e)

    shard = g_b * psi * ((1 - e) / n + e / n_e)
    return DPVolumes(
        gather=gather(gathered),
        regather=gather(regathered) if full else 0.0,
        reduce_scatter=scatter(g_b * psi),
        replicate_all_reduce=allreduce_volume(shard, r) if r > 1 else 0.0,
        all_reduce=0.0,
        rounds=m if layout.pp == 1 else 1,
    )


def traffic_by_dim(model, layout: Layout, settings: TrainSettings,
                   shape: StageShape) -> dict[str, float]:  # fmt: skip
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
        v = dp_volumes(layout, settings, shape)
        if v.all_reduce:
            out["dp"] = v.all_reduce
        else:
            shard_dim = "dp_shard_cp" if layout.cp > 1 else "dp_shard"
            out[shard_dim] = v.rounds * (v.gather + v.regather + v.reduce_scatter)
            if v.replicate_all_reduce:
                out["dp_replicate"] = v.rounds * v.replicate_all_reduce
    return out
