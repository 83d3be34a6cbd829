"""The option classes: each strategy knob is one field of one of them, with its default, its
documentation (`doc`), and, for a knob the planner does not model, why (`planner_ignores`).

Each class validates its fields on construction and names the bad value as `strategy.<knob>`;
a choice is parsed here (`activation_checkpointing` becomes a `CheckpointChoice`). Plain
Python, no torch and no Lightning.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from lightning_dist.options.activation_checkpointing import (
    CheckpointChoice,
    parse_activation_checkpointing,
)

DTYPE_NAMES = ("fp32", "float32", "bf16", "bfloat16", "fp16", "float16")
COMPILE_BACKENDS = ("inductor", "aot_eager", "eager")
STATE_DICT_TYPES = ("sharded", "full")
FSDP1_SHARDING = ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "_HYBRID_SHARD_ZERO2", "NO_SHARD")
FSDP1_HYBRID = ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2")
BACKWARD_PREFETCH = ("BACKWARD_PRE", "BACKWARD_POST", "none")
FLOAT8_RECIPES = ("none", "tensorwise", "rowwise")
CP_MODES = ("allgather", "ulysses")


def knob(
    default: Any,
    doc: str,
    *,
    planner_ignores: str | None = None,
    hydra_type: Any = None,
    hydra_default: Any = dataclasses.MISSING,
):
    """A dataclass field that is a knob: its default, its one documentation string, and, for a
    knob the planner does not model, the reason (`planner_ignores`). `hydra_type` is the type
    the Hydra schema gives it where the Python type is a union OmegaConf cannot hold (those
    become Any); `hydra_default` the schema's default where it differs from Python's (an
    interpolation such as `${seed}`)."""
    meta = {
        "doc": doc,
        "planner": planner_ignores is None,
        "planner_ignores": planner_ignores,
        "hydra_type": hydra_type,
    }
    if hydra_default is not dataclasses.MISSING:
        meta["hydra_default"] = hydra_default
    if isinstance(default, list | dict):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def options_of(cls: type, settings: Any) -> Any:
    """An option class built from a composed config node, a mapping or any object with its
    fields: each field read by name, a list-like value as a list, a field whose default is an
    option class built the same way (`trainer.checkpoint` inside `trainer`)."""
    values = {}
    for f in fields(cls):
        value = settings.get(f.name) if isinstance(settings, Mapping) else getattr(settings, f.name)
        if is_dataclass(f.default):
            value = options_of(type(f.default), value)
        elif isinstance(value, Sequence) and not isinstance(value, str):
            value = list(value)
        values[f.name] = value
    return cls(**values)


def check_reshard(reshard_after_forward: bool | int, shard_size: int | None = None) -> None:
    """An int `reshard_after_forward` must be above 1 and divide the shard group size (once
    `shard_size` is known: where the mesh is built). Raises ValueError."""
    n = reshard_after_forward
    if isinstance(n, bool):
        return
    if not isinstance(n, int) or n < 2 or (shard_size is not None and shard_size % n):
        size = "" if shard_size is None else f" {shard_size}"
        raise ValueError(
            f"reshard_after_forward={n!r} must be true, false or an integer above 1 that "
            f"divides the shard group size{size}"
        )


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

    compile: bool = knob(
        False,
        "torch.compile each block, after activation checkpointing and before FSDP wraps the model.",
    )
    compile_backend: str = knob(
        "inductor",
        "inductor (needs a C compiler on CPUs), aot_eager (no code generation) or eager.",
    )

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
class Float8Options:
    """Float8 training of the blocks' linear layers (`parallel/float8.py`, torchao)."""

    float8: str = knob(
        "none",
        "none, tensorwise or rowwise: torchao's float8 recipe for the linear layers "
        "(the output projection, and layers whose sizes are not multiples of 16, stay in high "
        "precision); emulated on CPUs. With tp > 1 tensorwise only (activations travel in bf16). "
        "Needs torchao "
        "(pip install 'lightning_dist[fp8]').",
    )
    float8_all_gather: bool = knob(
        False,
        "FSDP gathers the float8 linears' weights already cast to float8 (half the bytes "
        "of bf16; torchao's enable_fsdp_float8_all_gather) instead of in the parameter dtype. "
        "Tensorwise only. On backends without float8 collectives (gloo) the bytes move as uint8, "
        "unchanged. No effect without FSDP sharding (dp_shard = 1).",
    )

    def __post_init__(self) -> None:
        if self.float8 not in FLOAT8_RECIPES:
            raise ValueError(
                f"strategy.float8={self.float8!r} is not one of {', '.join(FLOAT8_RECIPES)}"
            )
        if self.float8_all_gather and self.float8 != "tensorwise":
            raise ValueError(
                f"strategy.float8_all_gather=true needs strategy.float8=tensorwise (torchao "
                f"gathers float8 weights only with one scale per tensor), not {self.float8!r}: "
                "set strategy.float8=tensorwise or strategy.float8_all_gather=false"
            )


@dataclass(frozen=True, kw_only=True)
class CheckpointingOptions:
    """Activation checkpointing (`parallel/activation_checkpoint.py` applies it)."""

    activation_checkpointing: CheckpointChoice = knob(
        0,
        "0: off; n: every n-th block in full (1: every block); full (= 1); op or selective: "
        "every block, saving matmul/attention outputs and recomputing the pointwise ops (under "
        "TP also the row-parallel matmuls and the all-gathers, whose outputs are full-size); "
        "op_alternate: op, but every other matmul (2nd, 4th, ... of a block) recomputed too.",
        hydra_type=Any,
    )

    def __post_init__(self) -> None:
        choice = parse_activation_checkpointing(
            self.activation_checkpointing, "strategy.activation_checkpointing"
        )
        object.__setattr__(self, "activation_checkpointing", choice)


@dataclass(frozen=True, kw_only=True)
class PrecisionOptions:
    """FSDP's mixed-precision policy (FSDP1 and FSDP2)."""

    param_dtype: str | None = knob(
        None,
        "fp32, bf16 or fp16; null follows trainer.precision on GPUs and stays fp32 on CPUs.",
    )
    reduce_dtype: str | None = knob(
        "fp32",
        "dtype of the gradient reduction (fp32, bf16 or fp16).",
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "param_dtype", _dtype(self.param_dtype, "param_dtype"))
        object.__setattr__(self, "reduce_dtype", _dtype(self.reduce_dtype, "reduce_dtype"))


@dataclass(frozen=True, kw_only=True)
class ShardingOptions:
    """What FSDP (1 or 2) shards one by one, and where the shards live."""

    auto_wrap: list[str] | None = knob(
        None,
        "Block class names to shard one by one; null detects them ([] under FSDP1: the root only).",
        planner_ignores="the planner shards each transformer block",
    )
    cpu_offload: bool = knob(
        False,
        "Parameters, gradients and optimizer state in host memory "
        "(the optimizer step then runs on the CPU).",
    )

    def __post_init__(self) -> None:
        _flag(self.cpu_offload, "cpu_offload")
        if self.auto_wrap is not None:
            object.__setattr__(self, "auto_wrap", list(self.auto_wrap))


@dataclass(frozen=True, kw_only=True)
class FSDP2Options:
    """FSDP2 (`fully_shard`) over the data-parallel ranks of a mesh strategy."""

    reshard_after_forward: Any = knob(
        True,
        "true (free gathered weights after forward), false (keep them until backward: "
        "ZeRO-2), or an int above 1 (reshard to groups of that size). Under pp a stage stays "
        "gathered from its first forward to its last backward whatever this says: resharding "
        "would gather it again for every microbatch.",
    )
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
        False,
        "Each rank initialises only its own shards (no full copy; the init then "
        "differs from a single process's); false materialises whole, then shards.",
        planner_ignores="initialisation is outside the step",
    )

    def __post_init__(self) -> None:
        check_reshard(self.reshard_after_forward)
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
        None,
        "FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD, _HYBRID_SHARD_ZERO2 or NO_SHARD; null "
        "picks SHARD_GRAD_OP on one node and HYBRID_SHARD across nodes (or with "
        "hybrid_shard_size).",
    )
    hybrid_shard_size: int | None = knob(
        None, "Ranks per shard group under HYBRID_SHARD; null means one node."
    )
    forward_prefetch: bool = knob(
        True,
        "Issue the next unit's all-gather during forward.",
        planner_ignores="the planner assumes one block of overlap",
    )
    backward_prefetch: str | None = knob(
        "BACKWARD_PRE",
        "BACKWARD_PRE, BACKWARD_POST or none.",
        planner_ignores="the planner assumes one block of overlap",
    )
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
        None,
        "{module pattern: style}; null uses the model's own plan. On the command line a key "
        "cannot hold `*`: name modules exactly there, or write the plan in a YAML file; quote a "
        "fused style there (`'strategy.tp_plan={blocks.0.attn.qkv:\"colwise_fused(3)\"}'`).",
        planner_ignores="the planner models the Megatron plan of a Llama block",
    )
    sequence_parallel: Any = knob(
        "auto",
        "Split norms and the residual stream along the sequence between tensor-parallel "
        "regions: auto (on whenever tp > 1 and the TP plan names the norms, as the Llama plan "
        "does), true (an error where the plan cannot) or false.",
        hydra_type=Any,
    )
    loss_parallel: bool = knob(
        True,
        "Keep the logits split along the vocabulary for the cross-entropy (tp > 1).",
        planner_ignores="the planner counts vocabulary-split logits",
    )

    def __post_init__(self) -> None:
        if not (self.sequence_parallel == "auto" or isinstance(self.sequence_parallel, bool)):
            raise ValueError(
                f"strategy.sequence_parallel={self.sequence_parallel!r} must be auto, true or false"
            )
        _flag(self.loss_parallel, "loss_parallel")
        plan = self.tp_plan
        if plan is not None and not isinstance(plan, dict):
            raise ValueError(f"strategy.tp_plan={plan!r} must be a mapping of module patterns")
        object.__setattr__(self, "tp_plan", dict(plan) if plan else None)


@dataclass(frozen=True, kw_only=True)
class ContextParallelOptions:
    """Context parallelism over the `cp` ranks (`parallel/context_parallel.py`)."""

    cp_mode: str = knob(
        "allgather",
        "allgather: each rank gathers the whole sequence's keys and values and "
        "keeps its own queries (head and tail chunks, so causal work is even); ulysses: two "
        "all-to-alls per attention move sequence shards to head shards and back (needs the "
        "query heads per tp rank divisible by cp, and the key/value heads per tp rank "
        "divisible by cp or dividing it; fewer are repeated up to cp). Only read when cp > 1.",
    )

    def __post_init__(self) -> None:
        if self.cp_mode not in CP_MODES:
            raise ValueError(
                f"strategy.cp_mode={self.cp_mode!r} is not one of {', '.join(CP_MODES)}"
            )


@dataclass(frozen=True, kw_only=True)
class PipelineOptions:
    """How the model is cut into pipeline stages (the schedule and counts are in `Layout`)."""

    split_points: list[int] | None = knob(
        None,
        "First layer index of each stage after the first (pp x virtual_stages - 1 of "
        "them, in stage order: with virtual stages, rank r holds stages r, r + pp, ...); null "
        "balances stages by parameters, so the first and last stages (embedding, output) hold "
        "fewer blocks.",
    )

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
        False,
        "Re-broadcast buffers every forward; off, since our buffers (RoPE tables) never change.",
        planner_ignores="buffers are negligible",
    )


@dataclass(frozen=True, kw_only=True)
class ProcessOptions:
    """The process group."""

    process_group_backend: str | None = knob(
        None,
        "torch.distributed backend; null takes the hardware's (gloo on CPUs, nccl on GPUs).",
        planner_ignores="the hardware spec gives the links",
    )


@dataclass(frozen=True, kw_only=True)
class CheckpointFormatOptions:
    """How the strategy writes checkpoints (always the one format of docs/CHECKPOINTS.md)."""

    state_dict_type: str = knob(
        "sharded",
        "Checkpoint format: sharded (a torch.distributed.checkpoint folder) or full (one file).",
        planner_ignores="checkpoints are outside the step",
    )

    def __post_init__(self) -> None:
        if self.state_dict_type not in STATE_DICT_TYPES:
            raise ValueError(
                f"strategy.state_dict_type={self.state_dict_type!r} is not one of "
                f"{', '.join(STATE_DICT_TYPES)}"
            )


def _positive(value: Any, name: str, *, minimum: float = 1, whole: bool = False) -> None:
    kinds = int if whole else int | float
    if isinstance(value, bool) or not isinstance(value, kinds) or value < minimum:
        kind = "a whole number" if whole else "a number"
        raise ValueError(f"strategy.{name}={value!r} must be {kind} of at least {minimum}")


@dataclass(frozen=True, kw_only=True)
class ReplicaGroupOptions:
    """Replica groups that heal live (`strategy=ft_hsdp`, torchft; `cluster/replica_groups.py`)."""

    replica_groups: int = knob(
        2,
        "Replica groups of the job, each its own process group (one "
        "torchrun per group, `python -m lightning_dist.launch replicas`); "
        "gradients are averaged over the groups present at each step.",
        planner_ignores="the planner plans one replica group",
    )
    min_replica_groups: int = knob(
        1,
        "Fewest groups a step may commit with; with fewer, the "
        "quorum waits for groups to come back, and the run stops "
        "after ft_timeout_s.",
        planner_ignores="a fault-tolerance setting",
    )
    join_timeout_s: float = knob(
        10.0,
        "How long a step's quorum waits for a live group that has "
        "not asked to join before going on without it.",
        planner_ignores="a fault-tolerance setting",
    )
    heartbeat_timeout_s: float = knob(
        1.0,
        "A group whose heartbeat (sent every 0.1 s) the "
        "Lighthouse has not heard for this long is left out of "
        "the next quorum.",
        planner_ignores="a fault-tolerance setting",
    )
    ft_timeout_s: float = knob(
        60.0,
        "Seconds a quorum, a cross-group all-reduce or a healing "
        "transfer may take; past it the step is retried without the "
        "group that did not answer.",
        planner_ignores="a fault-tolerance setting",
    )

    def __post_init__(self) -> None:
        _positive(self.replica_groups, "replica_groups", whole=True)
        _positive(self.min_replica_groups, "min_replica_groups", whole=True)
        if self.min_replica_groups > self.replica_groups:
            raise ValueError(
                f"strategy.min_replica_groups={self.min_replica_groups} is more than "
                f"strategy.replica_groups={self.replica_groups}"
            )
        _positive(self.join_timeout_s, "join_timeout_s", minimum=0.1)
        _positive(self.heartbeat_timeout_s, "heartbeat_timeout_s", minimum=0.2)
        _positive(self.ft_timeout_s, "ft_timeout_s", minimum=1)
