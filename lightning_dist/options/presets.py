"""`StrategyOptions` (every option class of a strategy, built once) and `PRESETS` (which classes
each strategy uses, and where its defaults differ); plain Python like the classes."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from lightning_dist.layout import Layout
from lightning_dist.options.knobs import (
    CheckpointFormatOptions,
    CheckpointingOptions,
    CompileOptions,
    ContextParallelOptions,
    DDPOptions,
    Float8Options,
    FSDP1Options,
    FSDP2Options,
    PipelineOptions,
    PrecisionOptions,
    ProcessOptions,
    ReplicaGroupOptions,
    ShardingOptions,
    TensorParallelOptions,
)
from lightning_dist.options.optimizer_sharding import OptimizerShardingOptions
from lightning_dist.options.speed import DataShareOptions, GradientSyncOptions, SimulationOptions

GROUPS: dict[str, type] = {
    "layout": Layout,
    "fsdp": FSDP2Options,
    "fsdp1": FSDP1Options,
    "ddp": DDPOptions,
    "sharding": ShardingOptions,
    "precision": PrecisionOptions,
    "tp": TensorParallelOptions,
    "cp": ContextParallelOptions,
    "pipeline": PipelineOptions,
    "checkpointing": CheckpointingOptions,
    "compile": CompileOptions,
    "float8": Float8Options,
    "process": ProcessOptions,
    "checkpoint_format": CheckpointFormatOptions,
    "replicas": ReplicaGroupOptions,
    "shares": DataShareOptions,
    "grad_sync": GradientSyncOptions,
    "simulate": SimulationOptions,
    "optimizer_sharding": OptimizerShardingOptions,
}
"""Every option class, by its attribute name in `StrategyOptions`."""


def group_knobs(group: str) -> tuple[dataclasses.Field, ...]:
    """The knob fields of one option class, in declaration order."""
    return dataclasses.fields(GROUPS[group])


def knob_doc(group: str, f: dataclasses.Field) -> str:
    return f.metadata["doc"]


LAYOUT_PLANNER_IGNORES: dict[str, str] = {}
"""The `Layout` knobs the planner does not model, and why."""


def planner_ignores(group: str, name: str) -> str | None:
    """Why the planner does not model knob `name` of `group`, or None when it does."""
    if group == "layout":
        return LAYOUT_PLANNER_IGNORES.get(name)
    f = next(f for f in group_knobs(group) if f.name == name)
    return f.metadata["planner_ignores"]


KNOB_GROUP: dict[str, str] = {f.name: g for g in GROUPS for f in group_knobs(g)}
"""The option class of each knob name (the names are unique across classes)."""
assert len(KNOB_GROUP) == sum(len(group_knobs(g)) for g in GROUPS), "a knob name is declared twice"


@dataclass(frozen=True, kw_only=True)
class StrategyOptions:
    """Every option class of a strategy, built and validated once.

    `layout` is the declared layout (one degree may be -1); `replica_per_node` says that
    `dp_replicate` was null (one replica group per node, resolved when the node count is
    known). Groups a strategy does not use keep their defaults (`fsdp1`, `ddp` and `replicas`
    are None unless the strategy runs them)."""

    layout: Layout = field(default_factory=Layout)
    replica_per_node: bool = False
    fsdp: FSDP2Options = field(default_factory=FSDP2Options)
    fsdp1: FSDP1Options | None = None
    ddp: DDPOptions | None = None
    sharding: ShardingOptions = field(default_factory=ShardingOptions)
    precision: PrecisionOptions = field(default_factory=PrecisionOptions)
    tp: TensorParallelOptions = field(default_factory=TensorParallelOptions)
    cp: ContextParallelOptions = field(default_factory=ContextParallelOptions)
    pipeline: PipelineOptions = field(default_factory=PipelineOptions)
    checkpointing: CheckpointingOptions = field(default_factory=CheckpointingOptions)
    compile: CompileOptions = field(default_factory=CompileOptions)
    float8: Float8Options = field(default_factory=Float8Options)
    process: ProcessOptions = field(default_factory=ProcessOptions)
    checkpoint_format: CheckpointFormatOptions = field(default_factory=CheckpointFormatOptions)
    replicas: ReplicaGroupOptions | None = None
    shares: DataShareOptions = field(default_factory=DataShareOptions)
    grad_sync: GradientSyncOptions = field(default_factory=GradientSyncOptions)
    simulate: SimulationOptions = field(default_factory=SimulationOptions)
    optimizer_sharding: OptimizerShardingOptions = field(default_factory=OptimizerShardingOptions)

    @classmethod
    def from_knobs(
        cls, groups: tuple[str, ...], knobs: dict[str, Any], owner: str = "strategy"
    ) -> StrategyOptions:
        """Route flat knob names (`tp=2`, `activation_checkpointing="op"`) to their option
        classes; only the classes in `groups` may be set. TypeError for a name no class of
        `groups` declares (naming the ones that exist), ValueError for a bad value."""
        routed: dict[str, dict[str, Any]] = {g: {} for g in groups}
        for name, value in knobs.items():
            group = KNOB_GROUP.get(name)
            if group not in routed:
                known = ", ".join(f.name for g in groups for f in group_knobs(g))
                raise TypeError(f"{owner} has no knob {name!r}; its knobs are: {known}")
            routed[group][name] = value
        built: dict[str, Any] = {}
        layout = routed.pop("layout", None)
        if layout is not None:
            per_node = "dp_replicate" in layout and layout["dp_replicate"] is None
            if per_node:
                layout["dp_replicate"] = 1  # resolved to the node count by `declared_layout`
            built["layout"], built["replica_per_node"] = Layout(**layout), per_node
        for group, values in routed.items():
            built[group] = GROUPS[group](**values)
        return cls(**built)

    def declared_layout(self, num_nodes: int) -> Layout:
        """The layout as configured on `num_nodes` nodes (one degree may still be -1)."""
        if self.replica_per_node:
            return dataclasses.replace(self.layout, dp_replicate=num_nodes)
        return self.layout

    def knobs(self) -> dict[str, Any]:
        """Every knob of the groups set, by its flat name (the inverse of `from_knobs`)."""
        out: dict[str, Any] = {}
        for group in GROUPS:
            value = getattr(self, group)
            if value is None:
                continue
            for f in dataclasses.fields(value):
                out[f.name] = getattr(value, f.name)
        if self.replica_per_node:
            out["dp_replicate"] = None
        return out

    def with_knobs(self, **knobs: Any) -> StrategyOptions:
        """A copy with some knobs changed (validated as at construction)."""
        changes: dict[str, Any] = {}
        for name, value in knobs.items():
            group = KNOB_GROUP.get(name)
            if group is None:
                raise TypeError(f"no knob {name!r}; the knobs are: {', '.join(KNOB_GROUP)}")
            current = changes.get(group) or getattr(self, group) or GROUPS[group]()
            changes[group] = dataclasses.replace(current, **{name: value})
        return dataclasses.replace(self, **changes)

    def planner_sharding(self, layout: Layout) -> str:
        """The planner's FSDP mode of `layout` under these options: NO_SHARD without dp_shard or cp,
        SHARD_GRAD_OP when gathered parameters stay until backward (ZeRO-2), else FULL_SHARD,
        or HYBRID_SHARD when shard groups are replicated; SHARD_OPTIMIZER (ZeRO-1) under
        `shard_optimizer` with replicas only."""
        if layout.shard_size == 1:  # dp_shard x cp: context-parallel ranks shard too
            return "SHARD_OPTIMIZER" if self.optimizer_sharding.shard_optimizer else "NO_SHARD"
        if self.fsdp1 is not None:
            name = self.fsdp1.resolved_sharding(2 if layout.dp_replicate > 1 else 1)
            zero2 = name in ("SHARD_GRAD_OP", "_HYBRID_SHARD_ZERO2")
        else:
            zero2 = self.fsdp.keeps_gathered
        if zero2:
            return "SHARD_GRAD_OP"
        return "HYBRID_SHARD" if layout.dp_replicate > 1 else "FULL_SHARD"


@dataclass(frozen=True)
class Preset:
    """A strategy's knob groups and the defaults in which it differs from the option classes.

    The strategy class and its Hydra schema (config/schemas.py) both read this, so a plain-Lightning
    `Parallel3DStrategy()` and `strategy=3d` start from the same values."""

    groups: tuple[str, ...]
    defaults: dict[str, Any] = field(default_factory=dict)

    def build(self, knobs: dict[str, Any], owner: str) -> StrategyOptions:
        return StrategyOptions.from_knobs(self.groups, {**self.defaults, **knobs}, owner)

    def default(self, f: dataclasses.Field) -> Any:
        if f.name in self.defaults:
            return self.defaults[f.name]
        if f.default is not dataclasses.MISSING:
            return f.default
        return f.default_factory()


MESH_GROUPS = ("layout", "fsdp", "sharding", "precision", "tp", "cp", "pipeline",
               "checkpointing", "compile", "float8", "process", "checkpoint_format",
               "simulate", "optimizer_sharding")  # fmt: skip
"""The groups of the mesh strategy (fsdp2, tp, pp, 3d are presets of it)."""

PRESETS: dict[str, Preset] = {
    "single": Preset(("compile", "float8")),
    "ddp": Preset(
        ("ddp", "compile", "process", "shares", "grad_sync", "simulate", "optimizer_sharding")
    ),
    "fsdp": Preset(
        (
            "fsdp1",
            "sharding",
            "precision",
            "checkpointing",
            "compile",
            "process",
            "checkpoint_format",
        )
    ),
    "fsdp2": Preset(MESH_GROUPS, {"dp_shard": -1, "dp_replicate": None}),
    "3d": Preset(MESH_GROUPS, {"dp_shard": -1}),
    # Not ZeRO-1: a replica group has dp_replicate = 1 (torchft replicates across groups).
    "ft_hsdp": Preset(
        (*(g for g in MESH_GROUPS if g != "optimizer_sharding"), "replicas"), {"dp_shard": -1}
    ),
    "auto": Preset(("process",)),
}
"""Each strategy's knobs, by the name of its schema (`conf/strategy/<file>.yaml` extends
`/schema_<name>`); `tp` and `pp` are YAML presets of `3d`, `auto` lets the planner set the
layout and runs the 3d strategy."""


def presets_with_knob(name: str) -> list[str]:
    """The strategy presets that take the knob `name` (`strategy.<name>`), in PRESETS' order:
    for the line that refuses it under another strategy."""
    return [
        preset
        for preset, spec in PRESETS.items()
        if any(name in {f.name for f in dataclasses.fields(GROUPS[g])} for g in spec.groups)
    ]


def knob_reference(preset: str) -> str:
    """A docstring section listing a preset's knobs: name, default and documentation, from the
    option classes themselves (strategies append it to their class docstring)."""
    spec = PRESETS[preset]
    lines = ["", "Knobs (lightning_dist/options/; the same names as `strategy.<knob>`):", ""]
    for group in spec.groups:
        for f in group_knobs(group):
            lines.append(f"    {f.name} = {spec.default(f)!r}: {knob_doc(group, f)}")
    return "\n".join(lines)
