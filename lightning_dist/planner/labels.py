"""The planner's words: a layout's label in the names users type (`strategy=ddp`, `fsdp2`,
`3d`, ...), FSDP modes only where FSDP runs, a rank's batch and a predicted time, the same in
`python -m lightning_dist.plan`, train.py's `plan.only` and every message that names a layout.
Plain text over the planner's inputs, like the rest of planner/."""

from __future__ import annotations

from lightning_dist.layout import Layout
from lightning_dist.planner.settings import TrainSettings

COMMAND_STRATEGIES = ("single", "ddp", "fsdp2", "tp", "pp", "3d")
"""The `strategy=` names a planner row's train.py command uses (`plan.train_command`): the
simplest preset that runs the layout; the mesh strategy (`3d`) runs every layout."""


def strategy_name(layout: Layout, settings: TrainSettings) -> str:
    """The `strategy=` name users type for this layout and settings: the strategy the options
    belong to (`fsdp` for FSDP1's, `ddp` for DDP's, `ft_hsdp`), else the simplest of
    COMMAND_STRATEGIES that runs it. `single` and `ddp` have no activation checkpointing (nor
    `ddp` float8), so such a layout runs under `fsdp2` (data parallelism alone) or a mesh preset."""
    options = settings.options
    if options.fsdp1 is not None:
        return "fsdp"
    if options.ddp is not None:
        return "ddp"
    if options.replicas is not None:
        return "ft_hsdp"
    lay = layout
    checkpointed = settings.activation_checkpointing.enabled
    if lay.cp > 1 or lay.ep > 1:
        return "3d"  # the mesh strategy is the one with context and expert parallelism
    if lay.tp == 1 and lay.pp == 1:
        if lay.dp_shard == 1 and not checkpointed and not settings.offload:
            if lay.dp_replicate == 1:
                return "single"
            if not settings.float8:  # DDP's knobs have no float8
                return "ddp"
        return "fsdp2"
    if lay.dp == 1 and lay.pp == 1:
        return "tp"
    if lay.dp == 1 and lay.tp == 1:
        return "pp"
    return "3d"


def runs_fsdp(layout: Layout, settings: TrainSettings) -> bool:
    """Does FSDP shard (or, FSDP1, wrap) the model on this layout? Only then has it a mode.
    It shards over dp_shard x cp (`Layout.shard_size`)."""
    return layout.shard_size > 1 or settings.options.fsdp1 is not None


def describe(layout: Layout, settings: TrainSettings, strategy: str | None = None) -> str:
    """A short human label of a layout and its settings, in the words users type: the
    strategy (`strategy`, else `strategy_name`), the degrees above 1, the pipeline schedule,
    the context-parallel mode where cp > 1, the FSDP mode only where FSDP runs, e.g.
    'ddp dp_replicate=8 mbs=2', '3d pp=4 dp_shard=16 tp=8 1F1B FULL_SHARD mbs=1 ac=op' or
    '3d cp=4 tp=8 ulysses FULL_SHARD mbs=1 ac=full'."""
    parts = [strategy or strategy_name(layout, settings)]
    parts += [f"{k}={v}" for k, v in layout.degrees().items() if v > 1]
    if layout.ep > 1:
        parts.append(f"ep={layout.ep}")
    if layout.cp > 1:
        parts.append(settings.cp_mode)
    if layout.pp > 1:
        v = layout.virtual_stages
        parts.append(layout.schedule + (f"(v={v})" if v > 1 else ""))
    if runs_fsdp(layout, settings) or settings.sharding == "SHARD_OPTIMIZER":
        parts.append(settings.sharding)
    parts.append(f"mbs={settings.micro_batch_size}")
    if settings.activation_checkpointing.enabled:
        # The strategy's own value: ac=full, ac=op, ac=2 (every 2nd block).
        parts.append(f"ac={settings.activation_checkpointing.setting}")
    if settings.compile:
        backend = settings.compile_backend
        parts.append("compile" if backend == "inductor" else f"compile={backend}")
    parts += ["offload"] * settings.offload
    return " ".join(parts)


def format_seconds(seconds: float) -> str:
    """A predicted time with three significant digits in s, ms or µs: '12.3 s', '4.56 ms',
    '186 µs' (a tiny model's step is no '0.000 s')."""
    if seconds >= 100:
        return f"{seconds:,.0f} s"
    for unit, scale in (("s", 1.0), ("ms", 1e-3)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-6:.3g} µs"


def batch_line(candidate) -> str:
    """The batch one rank runs in a candidate (`planner.Candidate`): the same words in train.py's
    plan.only and under the planner's choice."""
    lay, st = candidate.layout, candidate.settings
    per_rank = st.global_batch_size // lay.dp
    n, mbs = candidate.grad_accumulation, st.micro_batch_size
    if lay.pp > 1:
        split = f"{n} pipeline microbatches of {mbs}"
    elif n > 1:
        split = f"{n} accumulated micro-batches of {mbs}"
    else:
        split = "one forward"
    tokens = f"{st.seq_len} tokens"
    if lay.cp > 1:
        tokens += f", {st.seq_len // lay.cp} on each of cp={lay.cp} ranks"
    return (
        f"per-rank batch: {_count(per_rank, 'sequence')} x {tokens} ({split}); "
        f"global batch {st.global_batch_size} over {_count(lay.dp, 'data-parallel rank')}"
    )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def stage_lines(candidate, hardware, n_layers: int) -> list[str]:
    """One line per pipeline rank on mixed hardware: its nodes, node group and blocks, e.g.
    'pipeline rank 0: nodes 0-1 (h100: dgx_h100), blocks 0-49 (50)'; none elsewhere."""
    lay = candidate.layout
    if not hardware.mixed:
        return []
    if lay.pp == 1:
        groups = ", ".join(f"{k} {g.num_nodes} x {g.name}" for k, g in hardware.groups.items())
        return [
            f"no pipeline: every rank does the same work on {groups}, at the slowest group's pace"
        ]
    points = list(candidate.settings.options.pipeline.split_points or [])
    bounds = list(zip([0, *points], [*points, n_layers], strict=True))
    devices, per_rank = hardware.resolved_devices(), hardware.world_size // lay.pp
    lines = []
    for r in range(lay.pp):
        first, last = r * per_rank // devices, ((r + 1) * per_rank - 1) // devices
        name, group = hardware.node_group(first)
        nodes = f"node {first}" if first == last else f"nodes {first}-{last}"
        held = [bounds[s] for s in lay.stage_ids(r) if s < len(bounds)]
        blocks = ", ".join(f"blocks {a}-{b - 1} ({b - a})" for a, b in held)
        lines.append(f"pipeline rank {r}: {nodes} ({name}: {group.name}), {blocks}")
    return lines
