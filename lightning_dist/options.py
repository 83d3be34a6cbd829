"""The strategy knobs: each declared once, as one field of one small option class.

The same classes are the Hydra schemas of `conf/strategy/*.yaml` (config.py flattens the groups
a strategy uses into its schema, so the override names stay `strategy.<knob>`), the strategies'
constructor input (keyword arguments from plain Lightning code are routed here by
`StrategyOptions.from_knobs`), the planner's input (`estimate` and `plan_layouts` take a
`StrategyOptions`) and `parallelize()`'s. A choice is parsed once, when its option is built
(`activation_checkpointing` becomes a `CheckpointChoice` here), and validated there with a
ValueError naming the knob.

A field's metadata holds its documentation (`doc`) and whether the planner models it
(`planner`); a field the planner has no use for says why in `planner_ignores`. Plain Python, no
torch and no Lightning: the planner reads it on a laptop.

Adding a knob: one field in the option class of the code it configures, plus its value in the
YAML presets that differ from the default. Every strategy whose `knob_groups` include the class
then accepts it, from the command line and from Python.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from lightning_dist.activation_checkpointing import CheckpointChoice, parse_activation_checkpointing
from lightning_dist.layout import Layout

DTYPE_NAMES = ("fp32", "float32", "bf16", "bfloat16", "fp16", "float16")
COMPILE_BACKENDS = ("inductor", "aot_eager", "eager")
STATE_DICT_TYPES = ("sharded", "full")
FSDP1_SHARDING = ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "_HYBRID_SHARD_ZERO2", "NO_SHARD")
FSDP1_HYBRID = ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2")
BACKWARD_PREFETCH = ("BACKWARD_PRE", "BACKWARD_POST", "none")


def knob(default: Any, doc: str, *, planner_ignores: str | None = None, hydra_type: Any = None):
    """A dataclass field that is a strategy knob: its default, its one documentation string,
    and, for a knob the planner does not model, the reason (`planner_ignores`). `hydra_type`
    is the type the Hydra schema gives it where the Python type is a union OmegaConf cannot
    hold (those become Any)."""
    meta = {"doc": doc, "planner": planner_ignores is None, "planner_ignores": planner_ignores,
            "hydra_type": hydra_type}  # fmt: skip
    if isinstance(default, list | dict):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def _dtype(value: str | None, name: str) -> str | None:
    if hasattr(value, "is_floating_point"):  # a torch.dtype, as plain Lightning code may pass
        value = str(value).removeprefix("torch.")
    if value is not None and str(value).lower() not in DTYPE_NAMES:
        raise ValueError(f"strategy.{name}={value!r} is not one of fp32, bf16, fp16 (or null)")
    return None if value is None else str(value).lower()


def _count(value: Any, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"strategy.{name}={value!r} must be 0 or a number of blocks")


def _flag(value: Any, name: str) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"strategy.{name}={value!r} must be true or false")


@dataclass(frozen=True, kw_only=True)
class CompileOptions:
    """Per-block torch.compile (regional compilation; `parallel/compile.py`)."""

    compile: bool = knob(False, "torch.compile each block, after activation checkpointing and "
                         "before FSDP wraps the model.")  # fmt: skip
    compile_backend: str = knob("inductor", "inductor (needs a C compiler on CPUs), aot_eager (no "
                                "code generation) or eager.")  # fmt: skip

    def __post_init__(self) -> None:
        _flag(self.compile, "compile")
        if self.compile_backend not in COMPILE_BACKENDS:
            raise ValueError(
                f"strategy.compile_backend={self.compile_backend!r} is not one of "
                f"{', '.join(COMPILE_BACKENDS)}"
            )

    @property
    def backend(self) -> str | None:
        """The backend each block is compiled with; None when compilation is off."""
        return self.compile_backend if self.compile else None


@dataclass(frozen=True, kw_only=True)
class CheckpointingOptions:
    """Activation checkpointing (`parallel/activation_checkpoint.py` applies it)."""

    activation_checkpointing: CheckpointChoice = knob(
        0, "0: off; n: every n-th block in full (1: every block); full (= 1); op or selective: "
        "every block, saving matmul/attention outputs and recomputing the pointwise ops.",
        hydra_type=Any,
    )  # fmt: skip

    def __post_init__(self) -> None:
        choice = parse_activation_checkpointing(
            self.activation_checkpointing, "strategy.activation_checkpointing"
        )
        object.__setattr__(self, "activation_checkpointing", choice)


@dataclass(frozen=True, kw_only=True)
class PrecisionOptions:
    """FSDP's mixed-precision policy (FSDP1 and FSDP2)."""

    param_dtype: str | None = knob(
        None, "fp32, bf16 or fp16; null follows trainer.precision on GPUs and stays fp32 on CPUs.",
        planner_ignores="the planner models trainer.precision",
    )  # fmt: skip
    reduce_dtype: str | None = knob(
        "fp32", "dtype of the gradient reduction (fp32, bf16 or fp16).",
        planner_ignores="gradient traffic is modelled in the compute dtype",
    )  # fmt: skip

    def __post_init__(self) -> None:
        object.__setattr__(self, "param_dtype", _dtype(self.param_dtype, "param_dtype"))
        object.__setattr__(self, "reduce_dtype", _dtype(self.reduce_dtype, "reduce_dtype"))


@dataclass(frozen=True, kw_only=True)
class ShardingOptions:
    """What FSDP (1 or 2) shards one by one, and where the shards live."""

    auto_wrap: list[str] | None = knob(
        None, "Block class names to shard one by one; null detects them ([] under FSDP1: the "
        "root only).", planner_ignores="the planner shards each transformer block",
    )  # fmt: skip
    cpu_offload: bool = knob(False, "Parameters, gradients and optimizer state in host memory "
                             "(the optimizer step then runs on the CPU).")  # fmt: skip

    def __post_init__(self) -> None:
        _flag(self.cpu_offload, "cpu_offload")
        if self.auto_wrap is not None:
            object.__setattr__(self, "auto_wrap", list(self.auto_wrap))


@dataclass(frozen=True, kw_only=True)
class FSDP2Options:
    """FSDP2 (`fully_shard`) over the data-parallel ranks of a mesh strategy."""

    reshard_after_forward: Any = knob(
        True, "true (free gathered weights after forward), false (keep them until backward: "
        "ZeRO-2), or an int above 1 (reshard to groups of that size).",
    )  # fmt: skip
    prefetch_forward: int = knob(
        1,
        "Blocks whose all-gather is issued ahead in forward.",
        planner_ignores="the planner assumes one block of overlap",
    )
    prefetch_backward: int = knob(
        1,
        "Blocks whose all-gather is issued ahead in backward.",
        planner_ignores="the planner assumes one block of overlap",
    )
    init_sharded: bool = knob(
        False, "Each rank initialises only its own shards (no full copy; the init then "
        "differs from a single process's); false materialises whole, then shards.",
        planner_ignores="initialisation is outside the step",
    )  # fmt: skip

    def __post_init__(self) -> None:
        n = self.reshard_after_forward
        if not isinstance(n, bool) and (not isinstance(n, int) or n < 2):
            raise ValueError(
                f"reshard_after_forward={n!r} must be true, false or an integer above 1 that "
                "divides the shard group size None"
            )
        _count(self.prefetch_forward, "prefetch_forward")
        _count(self.prefetch_backward, "prefetch_backward")
        _flag(self.init_sharded, "init_sharded")

    @property
    def keeps_gathered(self) -> bool:
        """Gathered parameters stay until backward (ZeRO-2, the planner's SHARD_GRAD_OP)."""
        return self.reshard_after_forward is False


@dataclass(frozen=True, kw_only=True)
class FSDP1Options:
    """FSDP1 (`strategy=fsdp`, `fsdp_tuned`), the tuned recipe's knobs (docs/FSDP.md)."""

    sharding_strategy: str | None = knob(
        None, "FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD, _HYBRID_SHARD_ZERO2 or NO_SHARD; null "
        "picks SHARD_GRAD_OP on one node and HYBRID_SHARD across nodes (or with "
        "hybrid_shard_size).",
    )  # fmt: skip
    hybrid_shard_size: int | None = knob(None, "Ranks per shard group under HYBRID_SHARD; null "
                                         "means one node.")  # fmt: skip
    forward_prefetch: bool = knob(
        True,
        "Issue the next unit's all-gather during forward.",
        planner_ignores="the planner assumes one block of overlap",
    )
    backward_prefetch: str | None = knob(
        "BACKWARD_PRE", "BACKWARD_PRE, BACKWARD_POST or none.",
        planner_ignores="the planner assumes one block of overlap",
    )  # fmt: skip
    limit_all_gathers: bool = knob(True, "At most two units' gathered parameters in flight.")
    buffer_dtype: str | None = knob(
        "fp32",
        "dtype of the buffers (fp32, bf16 or fp16).",
        planner_ignores="buffers are negligible",
    )
    use_orig_params: bool = knob(True, "Passed to FSDP.", planner_ignores="no memory or time cost")
    sync_module_states: bool = knob(
        False, "Passed to FSDP.", planner_ignores="initialisation is outside the step"
    )

    def __post_init__(self) -> None:
        choice = self.sharding_strategy
        if choice is not None:
            choice = str(choice).upper()
            if choice not in FSDP1_SHARDING:
                raise ValueError(
                    f"strategy.sharding_strategy={self.sharding_strategy!r} is not one of "
                    f"{', '.join(FSDP1_SHARDING)} (or null for the tuned default)"
                )
            object.__setattr__(self, "sharding_strategy", choice)
        size = self.hybrid_shard_size
        if size is not None:
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise ValueError(f"strategy.hybrid_shard_size={size!r} must be a positive integer")
            if choice not in (None, *FSDP1_HYBRID):
                raise ValueError(
                    f"strategy.hybrid_shard_size={size} needs a hybrid sharding strategy, not "
                    f"{choice}; set strategy.sharding_strategy=HYBRID_SHARD"
                )
        prefetch = self.backward_prefetch
        if prefetch is None or str(prefetch).lower() == "none":
            prefetch = None
        elif str(prefetch).upper() in BACKWARD_PREFETCH:
            prefetch = str(prefetch).upper()
        else:
            raise ValueError(
                f"strategy.backward_prefetch={self.backward_prefetch!r} is not one of "
                f"{', '.join(BACKWARD_PREFETCH)}"
            )
        object.__setattr__(self, "backward_prefetch", prefetch)
        object.__setattr__(self, "buffer_dtype", _dtype(self.buffer_dtype, "buffer_dtype"))

    def resolved_sharding(self, num_nodes: int) -> str:
        """The sharding strategy on `num_nodes` nodes."""
        if self.sharding_strategy is not None:
            return self.sharding_strategy
        return "HYBRID_SHARD" if num_nodes > 1 or self.hybrid_shard_size else "SHARD_GRAD_OP"


@dataclass(frozen=True, kw_only=True)
class TensorParallelOptions:
    """Tensor parallelism over the `tp` ranks (`parallel/tp.py`)."""

    tp_plan: Any = knob(
        None, "{module pattern: style}; null uses the model's own plan. On the command line a key "
        "cannot hold `*`: name modules exactly there, or write the plan in a YAML file.",
        planner_ignores="the planner models the Megatron plan of a Llama block",
    )  # fmt: skip
    sequence_parallel: bool = knob(False, "Split norms and the residual stream along the sequence "
                                   "between tensor-parallel regions (tp > 1).")  # fmt: skip
    loss_parallel: bool = knob(
        True, "Keep the logits split along the vocabulary for the cross-entropy (tp > 1).",
        planner_ignores="the planner counts vocabulary-split logits",
    )  # fmt: skip

    def __post_init__(self) -> None:
        _flag(self.sequence_parallel, "sequence_parallel")
        _flag(self.loss_parallel, "loss_parallel")
        plan = self.tp_plan
        if plan is not None and not isinstance(plan, dict):
            raise ValueError(f"strategy.tp_plan={plan!r} must be a mapping of module patterns")
        object.__setattr__(self, "tp_plan", dict(plan) if plan else None)


@dataclass(frozen=True, kw_only=True)
class PipelineOptions:
    """How the model is cut into pipeline stages (the schedule and counts are in `Layout`)."""

    split_points: list[int] | None = knob(
        None, "First layer index of each stage after the first (pp x virtual_stages - 1 of "
        "them); null balances stages by cost.",
        planner_ignores="the planner cuts stages evenly",
    )  # fmt: skip

    def __post_init__(self) -> None:
        if self.split_points is not None:
            object.__setattr__(self, "split_points", [int(p) for p in self.split_points])


@dataclass(frozen=True, kw_only=True)
class DDPOptions:
    """Lightning's DDPStrategy arguments (`strategy=ddp`)."""

    find_unused_parameters: bool = knob(
        False, "Passed to DDP.", planner_ignores="no memory or time cost modelled"
    )
    gradient_as_bucket_view: bool = knob(
        True, "Passed to DDP.", planner_ignores="no memory or time cost modelled"
    )
    static_graph: bool = knob(
        False, "Passed to DDP.", planner_ignores="no memory or time cost modelled"
    )
    broadcast_buffers: bool = knob(
        False, "Re-broadcast buffers every forward; off, since our buffers (RoPE tables) never "
        "change.", planner_ignores="buffers are negligible",
    )  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class ProcessOptions:
    """The process group."""

    process_group_backend: str | None = knob(
        None, "torch.distributed backend; null takes the hardware's (gloo on CPUs, nccl on GPUs).",
        planner_ignores="the hardware spec gives the links",
    )  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class CheckpointFormatOptions:
    """How the strategy writes checkpoints (always the one format of docs/CHECKPOINTS.md)."""

    state_dict_type: str = knob(
        "sharded", "Checkpoint format: sharded (a torch.distributed.checkpoint folder) or full "
        "(one file).", planner_ignores="checkpoints are outside the step",
    )  # fmt: skip

    def __post_init__(self) -> None:
        if self.state_dict_type not in STATE_DICT_TYPES:
            raise ValueError(
                f"strategy.state_dict_type={self.state_dict_type!r} is not one of "
                f"{', '.join(STATE_DICT_TYPES)}"
            )


LAYOUT_DOCS = {
    "pp": "Pipeline-parallel ranks (outermost); -1 means the remaining ranks.",
    "dp_replicate": "Data-parallel replica groups (HSDP across them); null means one per node.",
    "dp_shard": "Data-parallel ranks sharding parameters (FSDP2); -1 means the remaining ranks.",
    "tp": "Tensor-parallel ranks (innermost: keep within a node); -1 means the remaining ranks.",
    "schedule": "GPipe, 1F1B, Interleaved1F1B, InterleavedZeroBubble or ZBVZeroBubble.",
    "microbatches": "Pipeline microbatches per step; null means 2 x pp.",
    "virtual_stages": "Stages per pipeline rank (2+ for the interleaved schedules, 2 for "
    "ZBVZeroBubble).",
}
"""The documentation of the `Layout` fields as strategy knobs (`Layout` itself is the class)."""

GROUPS: dict[str, type] = {
    "layout": Layout,
    "fsdp": FSDP2Options,
    "fsdp1": FSDP1Options,
    "ddp": DDPOptions,
    "sharding": ShardingOptions,
    "precision": PrecisionOptions,
    "tp": TensorParallelOptions,
    "pipeline": PipelineOptions,
    "checkpointing": CheckpointingOptions,
    "compile": CompileOptions,
    "process": ProcessOptions,
    "checkpoint_format": CheckpointFormatOptions,
}
"""Every option class, by its attribute name in `StrategyOptions`."""


def group_knobs(group: str) -> tuple[dataclasses.Field, ...]:
    """The knob fields of one option class, in declaration order."""
    return dataclasses.fields(GROUPS[group])


def knob_doc(group: str, f: dataclasses.Field) -> str:
    return LAYOUT_DOCS[f.name] if group == "layout" else f.metadata["doc"]


def planner_ignores(group: str, name: str) -> str | None:
    """Why the planner does not model knob `name` of `group`, or None when it does."""
    if group == "layout":
        return None
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
    known). Groups a strategy does not use keep their defaults (`fsdp1` and `ddp` are None
    unless the strategy runs them)."""

    layout: Layout = field(default_factory=Layout)
    replica_per_node: bool = False
    fsdp: FSDP2Options = field(default_factory=FSDP2Options)
    fsdp1: FSDP1Options | None = None
    ddp: DDPOptions | None = None
    sharding: ShardingOptions = field(default_factory=ShardingOptions)
    precision: PrecisionOptions = field(default_factory=PrecisionOptions)
    tp: TensorParallelOptions = field(default_factory=TensorParallelOptions)
    pipeline: PipelineOptions = field(default_factory=PipelineOptions)
    checkpointing: CheckpointingOptions = field(default_factory=CheckpointingOptions)
    compile: CompileOptions = field(default_factory=CompileOptions)
    process: ProcessOptions = field(default_factory=ProcessOptions)
    checkpoint_format: CheckpointFormatOptions = field(default_factory=CheckpointFormatOptions)

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
        """The planner's FSDP mode of `layout` under these options: NO_SHARD without dp_shard,
        SHARD_GRAD_OP when gathered parameters stay until backward (ZeRO-2), else FULL_SHARD,
        or HYBRID_SHARD when shard groups are replicated."""
        if layout.dp_shard == 1:
            return "NO_SHARD"
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

    The strategy class and its Hydra schema (config.py) both read this, so a plain-Lightning
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


MESH_GROUPS = ("layout", "fsdp", "sharding", "precision", "tp", "pipeline", "checkpointing",
               "compile", "process", "checkpoint_format")  # fmt: skip
"""The groups of the mesh strategy (fsdp2, tp, pp, 3d are presets of it)."""

PRESETS: dict[str, Preset] = {
    "single": Preset(("compile",)),
    "ddp": Preset(("ddp", "compile", "process")),
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
    ),  # fmt: skip
    "fsdp2": Preset(MESH_GROUPS, {"dp_shard": -1, "dp_replicate": None}),
    "3d": Preset(MESH_GROUPS, {"dp_shard": -1}),
    "auto": Preset(("process",)),
}
"""Each strategy's knobs, by the name of its schema (`conf/strategy/<file>.yaml` extends
`/schema_<name>`); `tp` and `pp` are YAML presets of `3d`, `auto` lets the planner set the
layout and runs the 3d strategy."""


def knob_reference(preset: str) -> str:
    """A docstring section listing a preset's knobs: name, default and documentation, from the
    option classes themselves (strategies append it to their class docstring)."""
    spec = PRESETS[preset]
    lines = ["", "Knobs (lightning_dist/options.py; the same names as `strategy.<knob>`):", ""]
    for group in spec.groups:
        for f in group_knobs(group):
            lines.append(f"    {f.name} = {spec.default(f)!r}: {knob_doc(group, f)}")
    return "\n".join(lines)
