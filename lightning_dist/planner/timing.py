"""Time per step: compute, communication over the links each mesh dimension crosses, overlap
and the pipeline bubble.

The mesh is laid out in `MESH_DIMS` order (pp, dp_replicate, dp_shard, cp, tp), outermost first,
so the ranks of a tp group are consecutive, a cp group strides by tp, FSDP's shard group
(dp_shard x cp, flattened) by tp too, and so on; whether a group stays inside a node follows
from that stride and the devices per node.
"""

from __future__ import annotations

from dataclasses import dataclass

from lightning_dist.layout import Layout
from lightning_dist.planner.compute import (
    block_matmuls,
    microbatch_compute,
    recomputed_projections,
)
from lightning_dist.planner.dp_time import dp_phases, mesh_links
from lightning_dist.planner.experts import expert_degree, is_moe
from lightning_dist.planner.memory import checkpointed_blocks
from lightning_dist.planner.mixed import rank_groups, slowest
from lightning_dist.planner.settings import (
    COMPILE_SPEEDUP,
    DEFAULT_DP_OVERLAP,
    DEFAULT_EFFICIENCY,
    DEFAULT_OVERLAP_SLOWDOWN,
    NOMINAL_PEAK_FLOPS,
    SELECTIVE_RECOMPUTE_SHARE,
    TrainSettings,
)
from lightning_dist.planner.stage_shapes import StageShape, stage_shapes
from lightning_dist.planner.traffic import (
    allreduce_volume,
    cp_exchange,
    ep_exchange,
    tp_calls,
)


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
    if is_moe(model):  # the active path: a token's experts, not all of them (output apart)
        whole = model.train_flops_per_token(settings.seq_len) - 6.0 * model.vocab_size * d
        per_layer = whole / model.n_layers
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


def _stage_compute(
    model, hardware, layout: Layout, settings: TrainSettings, shape: StageShape, peak: float
):
    """One microbatch of one rank of a stage, by planner/compute.py's model."""
    mode = settings.activation_checkpointing.mode
    return microbatch_compute(
        model,
        hardware,
        tp=layout.tp,
        layers=shape.layers,
        has_output=shape.has_output,
        checkpointed=checkpointed_blocks(layout, settings, shape),
        mode=mode,
        tokens=settings.rank_tokens(layout),
        seq_len=settings.seq_len,
        peak=peak,
        compiled=settings.compile and settings.compile_backend == "inductor",
        sequence_parallel=settings.sequence_parallel and layout.tp > 1,
        attention=settings.attention,
        block_ops=settings.block_ops,
        # a spec without a float8 peak times float8 projections as bf16 ones (estimate refuses
        # float8 on a GPU spec with datasheet figures but no float8 peak: an A100)
        float8_peak=hardware.peak_tflops_fp8 * 1e12
        if settings.float8 and hardware.peak_tflops_fp8
        else None,
        float8_weight_share=1 / layout.shard_size if settings.float8_all_gather else 1.0,
        masked=layout.cp > 1 and settings.cp_mode == "allgather",
        alternate=settings.activation_checkpointing.alternate_matmuls,
        moe_layers=shape.moe_layers,
        ep=expert_degree(layout),
    )


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
        efficiency is None
        and peak
        and hardware.memory_gbytes_per_sec
        and hardware.matmul_efficiency
    )
    if physical:  # matmuls by shape, attention, pointwise traffic: planner/compute.py
        specs = stage_hardware(hardware, layout, settings)
        stage = max(
            (
                _stage_compute(
                    model,
                    specs[sh.rank],
                    layout,
                    settings,
                    sh,
                    specs[sh.rank].peak_flops(settings.precision),
                )
                for sh in shapes
            ),
            key=lambda c: c.seconds,
        )
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
    link = mesh_links(hardware, layout)
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
    phases, offload = dp_phases(layout, settings, shapes, link, m, fwd, t_mb - fwd, model)
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
