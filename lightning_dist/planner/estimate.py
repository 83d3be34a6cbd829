"""Estimate one layout: validate it against the hardware, predict its memory and step time.

`estimate` is what an explicit strategy is checked with before launch; `plan_layouts`
(search.py) calls the same pieces for every layout it enumerates.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from lightning_dist.layout import Layout, tp_split_problem, ulysses_heads_problem
from lightning_dist.options import StrategyOptions
from lightning_dist.options.optimizer_sharding import shard_optimizer_problem
from lightning_dist.planner.labels import describe, runs_fsdp, strategy_name
from lightning_dist.planner.memory import (
    SHARDED_MODES,
    MemoryBreakdown,
    memory_per_device,
    stage_memories,
)
from lightning_dist.planner.mixed import mixed_problem, speed_split, sustained_flops
from lightning_dist.planner.settings import (
    DEFAULT_DP_OVERLAP,
    DEFAULT_HEADROOM,
    GIB,
    HOST_MEMORY_GIB_PER_DEVICE,
    PLANNER_OPTIONS,
    TrainSettings,
    with_knobs,
)
from lightning_dist.planner.timing import StepTime, stage_hardware, step_time


class NoLayoutFitsError(ValueError):
    """No enumerated layout fits in device memory; the message says what would help."""


@dataclass(frozen=True)
class Candidate:
    """One layout with its settings, predicted memory and time."""

    layout: Layout
    settings: TrainSettings
    memory: MemoryBreakdown
    time: StepTime
    fits: bool
    reason: str | None = None
    """Why it does not fit, with the numbers; None when it fits."""
    planner_only: str | None = None
    """Why train.py cannot run it yet (`estimate.planner_only`), or None: such a candidate is
    ranked and shown but never chosen, and has no train.py command."""

    @property
    def grad_accumulation(self) -> int:
        """Microbatches per step on each rank (gradient accumulation steps when pp == 1)."""
        return self.settings.global_batch_size // self.layout.dp // self.settings.micro_batch_size

    @property
    def strategy(self) -> str:
        """The `strategy=` name that runs this candidate (`strategy_name`)."""
        return strategy_name(self.layout, self.settings)

    def describe(self, strategy: str | None = None) -> str:
        """A short human label, e.g. '3d pp=4 dp_shard=16 tp=8 1F1B FULL_SHARD mbs=1 ac=op';
        `strategy` names the strategy that runs it when it is not `strategy_name`'s (a user's
        configured one)."""
        return describe(self.layout, self.settings, strategy)

    def as_dict(self) -> dict:
        """The JSON form used by `python -m lightning_dist.plan --json`."""
        lay, st, t = self.layout, self.settings, self.time
        return {
            "layout": {
                **lay.degrees(),
                "schedule": lay.schedule if lay.pp > 1 else None,
                "microbatches": self.grad_accumulation if lay.pp > 1 else None,
                "virtual_stages": lay.virtual_stages,
            },
            "memory_bytes": self.memory.as_dict(),
            "fits": self.fits,
            "reason": self.reason,
            "planner_only": self.planner_only,
            "step_seconds": t.step_seconds,
            "tokens_per_sec": t.tokens_per_sec,
            "mfu": t.mfu,
            "comm_compute_ratio": t.comm_compute_ratio,
            "bubble_fraction": t.bubble_fraction,
            "strategy": self.strategy,
            "sharding": st.sharding if runs_fsdp(lay, st) else None,
            "activation_checkpointing": st.activation_checkpointing.label,
            "compile": st.compile_backend if st.compile else None,
            "offload": st.offload,
            "micro_batch_size": st.micro_batch_size,
            "grad_accumulation": self.grad_accumulation if lay.pp == 1 else 1,
            "precision": st.precision,
            "label": self.describe(),
        }


def as_model_args(model):
    """Accept `ModelArgs` or anything with `.to_model_args()` (a Hugging Face spec)."""
    return model.to_model_args() if hasattr(model, "to_model_args") else model


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


def evaluate(
    model,
    hardware,
    layout,
    settings,
    *,
    headroom,
    efficiency=None,
    overlap=None,
    compile_speedup=None,
):
    """Memory, fit and time of a valid, resolved layout (no validation: see `estimate`). On
    mixed hardware each pipeline rank is checked against its own group's memory, and a
    pipeline without `strategy.split_points` gets the speed-balanced split (`speed_split_points`)."""
    if hardware.mixed:
        settings = mixed_split(model, hardware, layout, settings, headroom)
        memory, problem = mixed_fit(model, hardware, layout, settings, headroom)
    else:
        memory = memory_per_device(model, layout, settings)
        problem = fit_problem(memory, hardware, headroom)
    kwargs = {} if overlap is None else {"overlap": overlap}
    time = step_time(
        model,
        hardware,
        layout,
        settings,
        efficiency=efficiency,
        compile_speedup=compile_speedup,
        **kwargs,
    )
    return Candidate(
        layout,
        settings,
        memory,
        time,
        problem is None,
        problem,
        planner_only(model, layout, settings),
    )


def mixed_fit(model, hardware, layout, settings, headroom):
    """(the memory of the pipeline rank nearest its group's limit, why a rank does not fit or
    None) on mixed hardware."""
    groups = stage_hardware(hardware, layout, settings)
    if layout.pp == 1:  # every rank holds the same: it must fit the smallest group's devices
        specs = hardware.groups.values()
        groups = [min(specs, key=lambda g: g.memory_gib or float("inf"))]
    stages = stage_memories(model, layout, settings)
    ranked = []
    for group, memory in zip(groups, stages, strict=True):
        usable = (group.memory_gib or float("inf")) * GIB * headroom
        ranked.append((memory.total / usable, memory, fit_problem(memory, group, headroom), group))
    _, memory, problem, group = max(ranked, key=lambda r: r[0])
    if problem and layout.pp > 1:
        problem = f"pipeline rank {memory.stage} on {group.name}: {problem}"
    return memory, problem


def layer_costs(model, seq_len: int) -> tuple[list[float], float]:
    """Training FLOPs per token of each block (an MoE block's active path) and of the output
    projection: what a speed-balanced split weighs (the embedding lookup costs none)."""
    from lightning_dist.planner.experts import layer_is_moe

    d = model.dim
    attention = 12.0 * d * seq_len
    costs = []
    for i in range(model.n_layers):
        if layer_is_moe(model, i):
            costs.append(6.0 * (model.active_layer_params(i) - 2 * d) + attention)
        else:
            whole = (
                model.layer_params(i) if hasattr(model, "layer_params") else model.block_params()
            )
            costs.append(6.0 * (whole - 2 * d) + attention)
    return costs, 6.0 * model.vocab_size * d


def speed_split_points(model, hardware, layout, settings, caps=None) -> list[int]:
    """The first block of every pipeline stage but the first, each stage's blocks in proportion
    to the speed of its rank's node group (stage s runs on pipeline rank `Layout.stage_ids`
    assigns it), at most `caps[s]` blocks each (`planner/mixed.py`: `speed_split`)."""
    groups = stage_hardware(hardware, layout, settings)
    owner = {s: r for r in range(layout.pp) for s in layout.stage_ids(r)}
    speeds = [
        sustained_flops(groups[owner[s]], settings.precision) for s in range(layout.num_stages)
    ]
    costs, output = layer_costs(model, settings.seq_len)
    return speed_split(costs, speeds, last=output, caps=caps)


def mixed_split(model, hardware, layout, settings, headroom):
    """The settings with the speed-balanced `split_points` where a pipeline on mixed hardware
    has none; a rank over its group's memory gets a block fewer until every rank fits or no
    split is left (then the last fitting attempt is kept and the fit check says why)."""
    if layout.pp == 1 or settings.options.pipeline.split_points:
        return settings
    if (
        layout.num_stages > model.n_layers
    ):  # end chunks (`stage_shapes.end_chunk_sizes`): no speed split
        return settings
    stages = layout.num_stages
    caps = [model.n_layers] * stages
    owner = {s: r for r in range(layout.pp) for s in layout.stage_ids(r)}
    groups = stage_hardware(hardware, layout, settings)
    split = settings.with_knobs(split_points=speed_split_points(model, hardware, layout, settings))
    for _ in range(model.n_layers):
        memories = stage_memories(model, layout, split)
        points = list(split.options.pipeline.split_points)
        sizes = [b - a for a, b in zip([0, *points], [*points, model.n_layers], strict=True)]
        over = [
            s for s in range(stages) if fit_problem(memories[owner[s]], groups[owner[s]], headroom)
        ]
        if not over:
            return split
        for s in over:
            caps[s] = max(1, sizes[s] - 1)
        try:
            points = speed_split_points(model, hardware, layout, settings, caps)
        except ValueError:
            return split
        split = settings.with_knobs(split_points=points)
    return split


def estimate(
    model,
    hardware,
    layout: Layout,
    *,
    global_batch_size: int,
    seq_len: int,
    precision: str | None = None,
    optimizer: str = "adamw",
    sharding: str | None = None,
    micro_batch_size: int | None = None,
    options: StrategyOptions | None = None,
    attention: str = "flash",
    block_ops: str = "llama",
    loss: str = "eager",
    efficiency: float | None = None,
    overlap: float = DEFAULT_DP_OVERLAP,
    headroom: float = DEFAULT_HEADROOM,
    compile_speedup: float | None = None,
    **knobs,
) -> Candidate:
    """Predict memory and step time of ONE layout; `fits` says whether it fits with headroom.

    `layout` may hold one -1 degree; it is resolved against the hardware's world size.
    `options` are the strategy's knobs (lightning_dist/options/; a strategy's `.options`),
    PLANNER_OPTIONS when None; `knobs` change some of them by name (`activation_checkpointing
    ="op"`, `cpu_offload=True`). `sharding` defaults to the options' FSDP mode on this layout
    (`StrategyOptions.planner_sharding`). `micro_batch_size` defaults to the per-rank batch
    over the layout's microbatches under PP, and to the whole per-rank batch (no accumulation)
    without. `precision` defaults to the hardware's. `compile_speedup` overrides
    COMPILE_SPEEDUP. `block_ops` names the block code whose pointwise ops the time model counts
    (`TrainSettings.block_ops`); `loss` whose cross-entropy the memory model counts
    (`TrainSettings.loss`: 'compiled' without TP or PP only). Raises ValueError when the layout
    cannot exist on the hardware.
    """
    options = with_knobs(options or PLANNER_OPTIONS, knobs)
    model = as_model_args(model)
    layout = layout.resolve(hardware.world_size)
    if sharding is None:
        sharding = options.planner_sharding(layout)
    if global_batch_size % layout.dp:
        raise ValueError(
            f"global_batch_size={global_batch_size} is not divisible by dp={layout.dp}"
        )
    per_rank = global_batch_size // layout.dp
    if micro_batch_size is None:
        m = layout.num_microbatches if layout.pp > 1 else 1
        if per_rank % m:
            raise ValueError(
                f"microbatches={m} does not divide the per-rank batch {per_rank} "
                f"(global_batch_size={global_batch_size} / dp={layout.dp})"
            )
        micro_batch_size = per_rank // m
    elif layout.pp > 1 and layout.microbatches is not None:
        if per_rank != micro_batch_size * layout.microbatches:
            raise ValueError(
                f"microbatches={layout.microbatches} x micro_batch_size={micro_batch_size} "
                f"is not the per-rank batch {per_rank}"
            )
    settings = TrainSettings(
        global_batch_size=global_batch_size,
        seq_len=seq_len,
        precision=precision or hardware.precision,
        optimizer=optimizer,
        micro_batch_size=micro_batch_size,
        sharding=sharding,
        attention=attention,
        block_ops=block_ops,
        loss=loss,
        accelerator=hardware.accelerator,
        options=options,
    )
    check_layout(model, hardware, layout, settings)
    if layout.pp > 1:
        layout = replace(layout, microbatches=per_rank // micro_batch_size)
    return evaluate(
        model,
        hardware,
        layout,
        settings,
        headroom=headroom,
        efficiency=efficiency,
        overlap=overlap,
        compile_speedup=compile_speedup,
    )
