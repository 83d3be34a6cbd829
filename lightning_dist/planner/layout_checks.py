"""What can keep a layout from existing on a model and hardware, before any cost is counted: each
check returns why (a line naming the numbers) or None, and `check_layout` raises the first
(`estimate` and the search ask them; train.py's strategies share them through `mesh/checks.py`).
`fit_problem` says why predicted memory does not fit. Torch-free, as the whole planner.
"""

from __future__ import annotations

from lightning_dist.layout import Layout, tp_split_problem, ulysses_heads_problem
from lightning_dist.options.optimizer_sharding import shard_optimizer_problem
from lightning_dist.planner.memory import SHARDED_MODES, MemoryBreakdown
from lightning_dist.planner.mixed import mixed_problem
from lightning_dist.planner.settings import GIB, HOST_MEMORY_GIB_PER_DEVICE, TrainSettings


def tp_problem(model, devices_per_node: int, tp: int) -> str | None:
    """Why `tp` cannot split this model inside one node, or None."""
    if tp > devices_per_node:
        return f"tp={tp} crosses the node boundary ({devices_per_node} devices per node)"
    if devices_per_node % tp:
        return f"tp={tp} does not divide the {devices_per_node} devices per node"
    return tp_split_problem(model, tp)


def float8_problem(recipe: str, tp: int, hardware=None) -> str | None:
    """Why float8 `recipe` cannot run with `tp` (parallel/float8.py: rowwise is untested under
    TP) or on `hardware` (a GPU whose datasheet figures have no float8 peak: no float8
    matmuls), or None."""
    if recipe == "none":
        return None
    if tp > 1 and recipe != "tensorwise":
        return (
            f"strategy.float8={recipe} with tp={tp} is not supported yet (tensorwise is); set "
            "strategy.float8=tensorwise or none, or tp=1"
        )
    lacking = [
        f"{k} ({g.name})"
        for k, g in getattr(hardware, "groups", {}).items()
        if g.peak_tflops_fp8 is None
    ]
    if lacking:
        return (
            f"strategy.float8={recipe}: node group {lacking[0]} of {hardware.name} has no float8 "
            "matmuls (A100s and older have none); set strategy.float8=none"
        )
    if (
        hardware is not None
        and hardware.accelerator == "gpu"
        and hardware.peak_tflops_bf16 is not None
        and hardware.peak_tflops_fp8 is None
    ):
        return (
            f"strategy.float8={recipe}: {hardware.name} has no float8 matmuls (its spec sets no "
            "hardware.peak_tflops_fp8; A100s and older have none); set strategy.float8=none"
        )
    return None


EXTRA_CHUNKS = 2
"""Pipeline chunks the planner allows beyond one per layer: one that holds only the embedding
and one that holds only the final norm, the output and the loss (Megatron-LM's
account_for_embedding/loss_in_pipeline_split). torch's schedules run any module as a stage;
our pipeline code gives every stage at least one block, so such layouts are planner only
(`planner_only`)."""


def pp_problem(model, pp: int, virtual_stages: int = 1) -> str | None:
    """Why `pp` stages (of `virtual_stages` chunks each) cannot split the layers, or None:
    more chunks than the layers, and with several chunks a rank (interleaving) more than the
    layers and the EXTRA_CHUNKS."""
    chunks = pp * (virtual_stages if pp > 1 else 1)
    if chunks > model.n_layers + (EXTRA_CHUNKS if chunks > pp else 0):
        extra = f" x virtual_stages={virtual_stages}" if virtual_stages > 1 else ""
        ends = f" + {EXTRA_CHUNKS} (an embedding-only and a loss-only chunk)" if extra else ""
        return f"pp={pp}{extra} exceeds n_layers={model.n_layers}{ends}"
    return None


def planner_only(model, layout: Layout, settings: TrainSettings) -> str | None:
    """Why train.py cannot run this layout yet though the planner models it, or None:
    ZeRO-1 (`sharding=SHARD_OPTIMIZER`, `strategy.shard_optimizer`) where the code refuses it
    (under DiLoCo: `options.optimizer_sharding`), and more pipeline chunks
    than layers (the pipeline code puts at least one block in every chunk: they would need an
    embedding-only or loss-only one)."""
    if settings.sharding == "SHARD_OPTIMIZER":
        options = settings.options.with_knobs(shard_optimizer=True)
        problem = shard_optimizer_problem(layout, options)
        if problem:
            return problem
    if layout.pp > 1 and layout.num_stages > model.n_layers:
        return (
            f"pp={layout.pp} x virtual_stages={layout.virtual_stages} = {layout.num_stages} "
            f"chunks exceed n_layers={model.n_layers}: the pipeline code has no embedding-only "
            "or loss-only chunk yet"
        )
    return None


def batch_problem(layout: Layout, settings: TrainSettings) -> str | None:
    """Why the global batch cannot be split over this layout's dp ranks and microbatches."""
    gbs, dp, pp = settings.global_batch_size, layout.dp, layout.pp
    if gbs % dp:
        verb = "is smaller than" if gbs < dp else "is not divisible by"
        return f"global_batch_size={gbs} {verb} dp={dp}"
    per_rank = gbs // dp
    if per_rank % settings.micro_batch_size:
        return (
            f"micro_batch_size={settings.micro_batch_size} does not divide the per-rank batch "
            f"{per_rank} (global_batch_size={gbs} / dp={dp})"
        )
    m = per_rank // settings.micro_batch_size
    if pp > 1 and layout.schedule != "GPipe" and m < pp:
        return (
            f"schedule={layout.schedule} needs at least pp={pp} microbatches, the per-rank "
            f"batch of {per_rank} gives {m}"
        )
    rounds = max(1, m // pp)
    if pp > 1 and layout.schedule.startswith("Interleaved") and m % rounds:
        # torch's interleaved schedules run m microbatches in max(1, m // pp) equal rounds
        # (m = 10 on pp = 4: two rounds of 5), not only m divisible by pp.
        return (
            f"schedule={layout.schedule} needs microbatches={m} to be a multiple of "
            f"microbatches // pp = {rounds} (pp={pp})"
        )
    return None


def cp_problem(model, layout: Layout, settings: TrainSettings) -> str | None:
    """Why context parallelism of the layout's cp cannot split this model's sequences, or
    None: the sequence must cut into 2 x cp equal chunks, Ulysses must split the heads of a tp
    rank (`layout.ulysses_heads_problem`), and FSDP must shard (the code shards over
    dp_shard x cp whenever cp > 1)."""
    if layout.cp == 1:
        return None
    if settings.seq_len % (2 * layout.cp):
        return f"seq_len={settings.seq_len} does not split into 2 x cp = {2 * layout.cp} chunks"
    if settings.sharding not in SHARDED_MODES:
        return f"cp={layout.cp} shards parameters over dp_shard x cp; sharding={settings.sharding} does not"
    if settings.cp_mode == "ulysses":
        return ulysses_heads_problem(model.n_heads, model.kv_heads, layout.cp, layout.tp)
    return None


def check_layout(model, hardware, layout: Layout, settings: TrainSettings) -> None:
    """Raise ValueError naming the numbers when `layout` cannot exist on `hardware`."""
    problem = (
        tp_problem(model, hardware.resolved_devices(), layout.tp)
        or float8_problem(settings.options.float8.float8, layout.tp, hardware)
        or pp_problem(model, layout.pp, layout.virtual_stages)
        or mixed_problem(hardware, layout.pp)
        or layout.experts_problem(model)
        or batch_problem(layout, settings)
        or cp_problem(model, layout, settings)
    )
    max_seq = getattr(model, "max_seq_len", None)
    if problem is None and max_seq is not None and settings.seq_len > max_seq:
        problem = f"seq_len={settings.seq_len} exceeds the model's max_seq_len={max_seq}"
    if problem is None and settings.sharding == "SHARD_OPTIMIZER" and layout.shard_size > 1:
        problem = (
            f"sharding=SHARD_OPTIMIZER (ZeRO-1) shards the optimizer over dp_replicate with the "
            f"parameters whole; dp_shard x cp = {layout.shard_size} must be 1"
        )
    if problem is None and settings.loss == "compiled" and (layout.tp > 1 or layout.pp > 1):
        problem = (
            f"loss='compiled' is modelled on one rank's whole vocabulary without PP; "
            f"tp={layout.tp}, pp={layout.pp} must be 1"
        )
    if (
        problem is None
        and settings.offload
        and not (settings.sharding in SHARDED_MODES and layout.shard_size > 1)
    ):
        problem = "offload needs a sharded FSDP mode with dp_shard x cp > 1"
    if problem:
        raise ValueError(problem)


def fit_problem(memory: MemoryBreakdown, hardware, headroom: float) -> str | None:
    """Why `memory` does not fit on `hardware` with `headroom`, or None if it fits.

    Device memory unknown (CPU ranks share the host) means anything fits. Offloaded state must
    fit in host memory: `hardware.host_memory_gib` per node when the spec has it, else
    HOST_MEMORY_GIB_PER_DEVICE per device.
    """
    if hardware.memory_gib is not None:
        usable = hardware.memory_gib * GIB * headroom
        if memory.total > usable:
            return (
                f"needs {memory.total / GIB:.1f} GiB/device, has {hardware.memory_gib:g} "
                f"({usable / GIB:.1f} usable at {headroom:.0%})"
            )
    if memory.host:
        host_gib = getattr(hardware, "host_memory_gib", None)
        per_device = (
            host_gib / hardware.resolved_devices() if host_gib else HOST_MEMORY_GIB_PER_DEVICE
        )
        if memory.host > per_device * GIB * headroom:
            return (
                f"offload needs {memory.host / GIB:.1f} GiB of host memory per device, "
                f"has about {per_device:g}"
            )
    return None
