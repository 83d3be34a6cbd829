"""The strategy knobs: each declared once, as one field of one small option class.

The same classes are the Hydra schemas of `lightning_dist/conf/strategy/*.yaml`
(config/schemas.py flattens the groups a strategy uses into its schema, so the override names
stay `strategy.<knob>`), the strategies'
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

from lightning_dist.options.knobs import (
    BACKWARD_PREFETCH,
    COMPILE_BACKENDS,
    CP_MODES,
    DTYPE_NAMES,
    FSDP1_HYBRID,
    FSDP1_SHARDING,
    STATE_DICT_TYPES,
    CheckpointFormatOptions,
    CheckpointingOptions,
    CompileOptions,
    ContextParallelOptions,
    DDPOptions,
    FSDP1Options,
    FSDP2Options,
    PipelineOptions,
    PrecisionOptions,
    ProcessOptions,
    ReplicaGroupOptions,
    ShardingOptions,
    TensorParallelOptions,
    knob,
)
from lightning_dist.options.optimizer_sharding import OptimizerShardingOptions
from lightning_dist.options.presets import (
    GROUPS,
    KNOB_GROUP,
    MESH_GROUPS,
    PRESETS,
    Preset,
    StrategyOptions,
    group_knobs,
    knob_doc,
    knob_reference,
    planner_ignores,
)
from lightning_dist.options.speed import (
    GRAD_COMPRESSIONS,
    DataShareOptions,
    GradientSyncOptions,
    SimulationOptions,
)

__all__ = [
    "BACKWARD_PREFETCH", "COMPILE_BACKENDS", "DTYPE_NAMES", "FSDP1_HYBRID", "FSDP1_SHARDING",
    "GROUPS", "KNOB_GROUP", "MESH_GROUPS", "PRESETS", "STATE_DICT_TYPES",
    "CheckpointFormatOptions", "CheckpointingOptions", "CompileOptions", "ContextParallelOptions",
    "CP_MODES", "DDPOptions", "DataShareOptions", "GRAD_COMPRESSIONS", "GradientSyncOptions",
    "SimulationOptions",
    "FSDP1Options", "FSDP2Options", "OptimizerShardingOptions", "PipelineOptions", "PrecisionOptions", "Preset",
    "ProcessOptions", "ReplicaGroupOptions", "ShardingOptions", "StrategyOptions", "TensorParallelOptions", "group_knobs",
    "knob", "knob_doc", "knob_reference", "planner_ignores",
]  # fmt: skip
