"""Estimate one layout: validate it against the hardware, predict its memory and step time.

`estimate` is what an explicit strategy is checked with before launch; `plan_layouts`
(search.py) calls the same pieces for every layout it enumerates.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from lightning_dist.layout import Layout
from lightning_dist.options import StrategyOptions
from lightning_dist.planner.labels import describe, runs_fsdp, strategy_name
from lightning_dist.planner.layout_checks import (
    check_layout,
    fit_problem,
    planner_only,
)
from lightning_dist.planner.memory import (
    MemoryBreakdown,
    memory_per_device,
    stage_memories,
)
from lightning_dist.planner.mixed import speed_split, sustained_flops
from lightning_dist.planner.settings import (
    DEFAULT_DP_OVERLAP,
    DEFAULT_HEADROOM,
    GIB,
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
    """Why train.py cannot run it yet (`layout_checks.planner_only`), or None: such a candidate is
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
