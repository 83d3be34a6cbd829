"""The training settings the planner reasons about, and the constants of its cost model.

Everything here is plain Python: the planner must answer on a laptop in well under a second,
so nothing under `lightning_dist/planner/` imports torch, torch.distributed or Lightning.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from lightning_dist.options import KNOB_GROUP, FSDP1Options, StrategyOptions
from lightning_dist.options.activation_checkpointing import CheckpointChoice
from lightning_dist.planner.calibration import correction

GIB = 1024**3

# Lightning precision aliases, folded onto the three regimes the memory model distinguishes.
_PRECISIONS = {
    "32-true": "32-true",
    "32": "32-true",
    "bf16-mixed": "bf16-mixed",
    "16-mixed": "bf16-mixed",  # same byte counts as bf16 autocast
    "bf16-true": "bf16-true",
    "bf16": "bf16-true",
    "16-true": "bf16-true",
}
PRECISIONS = ("32-true", "bf16-mixed", "bf16-true")

# Optimizer states per parameter (Adam keeps m and v; plain SGD keeps nothing).
OPTIMIZER_STATES = {"adamw": 2, "adam": 2, "sgd_momentum": 1, "sgd": 0}

SHARDING_MODES = ("NO_SHARD", "SHARD_OPTIMIZER", "SHARD_GRAD_OP", "FULL_SHARD", "HYBRID_SHARD")
REPLICATED_MODES = ("NO_SHARD", "SHARD_OPTIMIZER")
"""The modes whose parameters and gradients are whole on every data-parallel rank: DDP, and
ZeRO-1 (`SHARD_OPTIMIZER`: the optimizer states sharded over the dp_replicate ranks, as
Megatron-LM's distributed optimizer and DeepSpeed's BF16 optimizer shard them;
`strategy.shard_optimizer`, `parallel/sharded_optimizer.py`)."""
BLOCK_OPS = ("llama", "mpt")
"""The block codes whose pointwise ops the time model counts (`compute.POINTWISE_BYTES`)."""

LOSSES = ("eager", "compiled")
"""The cross-entropies whose memory the planner counts (`TrainSettings.loss`)."""

# --- cost-model constants (rough, documented; calibration refines them later) -------------

DEFAULT_EFFICIENCY = {"gpu": 0.5, "cpu": 0.5}
"""Fraction of the datasheet peak a transformer's matmuls sustain (~0.5 on H100 in practice)."""
DEFAULT_DP_OVERLAP = 0.8
"""Fraction of the overlappable compute under which data-parallel communication can hide."""
DEFAULT_OVERLAP_SLOWDOWN = 0.2
"""Slowdown of compute while hidden communication runs beside it (SM and HBM contention)."""
DEFAULT_HEADROOM = 0.9
"""The planner's one safety margin: a layout fits when its predicted peak (its tensors plus the
runtime's RESERVE_BYTES) is at most this fraction of device memory. The other 10% is for what
the count leaves out: the caching allocator's slack on GPUs (fragmentation, a few percent) and
the planner's own error (the calibration table's totals are within 7% on this CPU)."""
RESERVE_BYTES = {"gpu": 1.0 * GIB, "cpu": correction("reserve_bytes", "cpu")}
"""CUDA context, NCCL buffers and cuBLAS workspaces (GPU: assumed, never measured), or the
runtime itself (CPU: torch, Lightning, gloo and Python, about 0.5 GiB resident per rank, measured:
the `reserve_bytes` correction of planner/calibration.json; docs/PLANNER.md)."""
NOMINAL_PEAK_FLOPS = 1e11
"""Per-device FLOP/s assumed when the hardware spec has no peak (ranking only; MFU is None)."""
NOMINAL_LINK_GBYTES_PER_SEC = 5.0
"""Per-device link bandwidth assumed when the hardware spec has none (e.g. gloo on a CPU)."""
RING_STEP_LATENCY_S = {"intra": 1e-6, "inter": 5e-6}
"""Latency of one step of a ring collective over NVLink / over the network (NCCL, rough)."""
HOST_LINK_GBYTES_PER_SEC = 25.0
"""Device-host copy bandwidth per device for CPU offload (PCIe 4.0 x16, effective)."""
HOST_MEMORY_GIB_PER_DEVICE = 192.0
"""Host memory per device for offloaded state when the spec has none (a DGX: 2 TB / 8 GPUs,
less the OS and page cache)."""
HOST_OPTIMIZER_PARAMS_PER_SEC = 2.5e8
"""Parameters per second a CPU Adam step updates per device it serves (a node's cores shared)."""
SELECTIVE_RECOMPUTE_SHARE = 0.03
"""Time op-level checkpointing adds to a block, as a share of the block's training compute: it
recomputes only norms, RoPE, SiLU, the product and the residual adds, which do next to no FLOPs
but read and write their tensors (memory-bound; docs/PLANNER.md estimates ~3% for Llama 3 8B on
an H100). An assumption, not measured here."""
COMPILE_SPEEDUP = {"inductor": 1.10, "aot_eager": 1.0, "eager": 1.0}
"""Compute time is divided by this under `compile` (per-block torch.compile), by backend. Inductor
fuses the pointwise ops around the matmuls (norms, RoPE, SwiGLU, residual adds) into a few
kernels; we assume 10% less compute time on GPUs. An assumption, not measured here (this CPU has
no GPU; docs/PLANNER.md). aot_eager and eager run the same kernels as eager mode: no change.
`step_time(compile_speedup=...)` overrides it."""


def normalize_precision(precision: str) -> str:
    """Map a Lightning precision string onto '32-true', 'bf16-mixed' or 'bf16-true'."""
    key = str(precision)
    if key not in _PRECISIONS:
        raise ValueError(f"precision={precision!r} is not one of {', '.join(sorted(_PRECISIONS))}")
    return _PRECISIONS[key]


def state_bytes(precision: str, optimizer: str) -> tuple[int, int, int]:
    """Bytes per parameter of (parameters, gradients, optimizer state) between steps.

    bf16-mixed keeps fp32 parameters and gradients (Lightning's autocast casts in the ops; FSDP
    keeps fp32 shards and gathers a bf16 copy to compute with, a within-step buffer), so Adam
    costs 4 + 4 + 8 = 16 bytes per parameter: the ZeRO paper's 16 (Sec. 3), whose bf16 working
    copy and fp32 master copy are here one fp32 tensor. fp32 training costs the same; pure bf16
    keeps everything in bf16: 2 + 2 + 4. (The dry run reads these off FSDP2's shards.)
    """
    if optimizer not in OPTIMIZER_STATES:
        raise ValueError(f"optimizer={optimizer!r} is not one of {', '.join(OPTIMIZER_STATES)}")
    states = OPTIMIZER_STATES[optimizer]
    if precision in ("32-true", "bf16-mixed"):
        return 4, 4, 4 * states
    return 2, 2, 2 * states


def checkpoint_bytes(num_params: int, precision: str, optimizer: str = "adamw") -> int:
    """Bytes of one whole checkpoint: every parameter and its optimizer state, as `state_bytes`
    counts them (no gradients: a save holds none)."""
    params, _, states = state_bytes(normalize_precision(precision), optimizer)
    return num_params * (params + states)


@dataclass(frozen=True, kw_only=True)
class TrainSettings:
    """What the planner needs to know about one training configuration besides the layout."""

    global_batch_size: int
    """Sequences per optimizer step, the same whatever the layout."""
    seq_len: int
    """Tokens per sequence."""
    precision: str = "bf16-mixed"
    """Lightning precision (aliases are folded onto 32-true, bf16-mixed, bf16-true)."""
    optimizer: str = "adamw"
    """'adamw', 'adam', 'sgd_momentum' or 'sgd' (no momentum)."""
    micro_batch_size: int = 1
    """Sequences per rank per forward pass (a pipeline microbatch under PP)."""
    sharding: str = "FULL_SHARD"
    """FSDP mode over dp_shard x cp (`Layout.shard_size`): NO_SHARD (DDP), SHARD_GRAD_OP,
    FULL_SHARD or HYBRID_SHARD; or SHARD_OPTIMIZER (ZeRO-1 over dp_replicate with dp_shard = 1:
    `REPLICATED_MODES`)."""
    attention: str = "flash"
    """'flash' (flash / memory-efficient SDPA, no s^2 term) or 'math' (materialises scores)."""
    block_ops: str = "llama"
    """Whose block code the time model counts the pointwise ops of: 'llama' (models/llama.py)
    or 'mpt' (llm-foundry's MPT block: `published/foundry.py`); `compute.POINTWISE_BYTES`."""
    loss: str = "eager"
    """Whose cross-entropy the memory model counts: 'eager' (`lm/module.py`'s) or 'compiled'
    (the same code under torch.compile, as torchtitan compiles its loss with the model since
    2025: `published/runs.py`); `activations.loss_bytes_per_logit`."""
    accelerator: str = "gpu"
    """The hardware's ('cpu' or 'gpu'): FSDP's parameters follow a mixed precision on GPUs only
    (`parallel/precision.py`)."""
    options: StrategyOptions = field(default_factory=lambda: PLANNER_OPTIONS)
    """The strategy's knobs (lightning_dist/options/); the properties below read the ones
    the cost model uses."""

    @property
    def activation_checkpointing(self) -> CheckpointChoice:
        return self.options.checkpointing.activation_checkpointing

    @property
    def offload(self) -> bool:
        return self.options.sharding.cpu_offload

    @property
    def bf16_parameters(self) -> bool:
        """Does FSDP compute with bf16 parameters under bf16-mixed? It does when it shards
        (dp_shard > 1) and `param_dtype` is bf16, or unset on a GPU. It then casts each unit's
        inputs to bf16, so the residual stream is bf16 too."""
        if self.precision != "bf16-mixed" or self.sharding in REPLICATED_MODES:
            return False
        dtype = self.options.precision.param_dtype
        if dtype is None:
            return self.accelerator != "cpu"
        return dtype in ("bf16", "bfloat16")

    @property
    def gathered_param_bytes(self) -> int:
        """Bytes per parameter the blocks compute with (what FSDP all-gathers): 2 in bf16-true
        and under FSDP's bf16 parameters, else 4."""
        return 2 if self.precision == "bf16-true" or self.bf16_parameters else 4

    @property
    def float8(self) -> bool:
        """The blocks' linear layers compute in float8 (`strategy.float8`)."""
        return self.options.float8.float8 != "none"

    @property
    def float8_all_gather(self) -> bool:
        """FSDP gathers those layers' weights in float8, one byte each."""
        return self.float8 and self.options.float8.float8_all_gather

    @property
    def residual_bytes(self) -> int:
        """Bytes per element of the residual stream (the blocks' inputs and the norms' inputs):
        the parameters' (FSDP casts each unit's inputs to them; autocast keeps fp32)."""
        return self.gathered_param_bytes

    @property
    def gradient_reduce_bytes(self) -> int:
        """Bytes per gradient element data parallelism reduces: FSDP's `reduce_dtype` (unset:
        the compute dtype; `parallel/precision.py`), DDP's the parameters' own (fp32 unless
        bf16-true) or its compression's (`strategy.grad_compression=bf16|fp16`: 2)."""
        if self.sharding in REPLICATED_MODES:
            halved = self.options.grad_sync.grad_compression in ("bf16", "fp16")
            return 2 if self.precision == "bf16-true" or halved else 4
        if self.precision == "32-true":
            return 4
        dtype = self.options.precision.reduce_dtype
        if dtype is None:
            return self.matmul_bytes
        return 4 if dtype in ("fp32", "float32") else 2

    @property
    def matmul_bytes(self) -> int:
        """Bytes per element of a matmul's input: 4 in 32-true, else 2."""
        return 4 if self.precision == "32-true" else 2

    @property
    def sequence_parallel(self) -> bool:
        """On unless turned off: "auto" runs it under TP with the Llama plan the planner models."""
        return self.options.tp.sequence_parallel is not False

    @property
    def limit_all_gathers(self) -> bool:
        """FSDP1's rate limiter; FSDP2 always rate-limits."""
        fsdp1 = self.options.fsdp1
        return True if fsdp1 is None else fsdp1.limit_all_gathers

    @property
    def compile(self) -> bool:
        return self.options.compile.compile

    @property
    def compile_backend(self) -> str:
        return self.options.compile.compile_backend

    def __post_init__(self) -> None:
        object.__setattr__(self, "precision", normalize_precision(self.precision))
        for name in ("global_batch_size", "seq_len", "micro_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be positive")
        if self.sharding not in SHARDING_MODES:
            raise ValueError(
                f"sharding={self.sharding!r} is not one of {', '.join(SHARDING_MODES)}"
            )
        if self.attention not in ("flash", "math"):
            raise ValueError(f"attention={self.attention!r} is not 'flash' or 'math'")
        if self.block_ops not in BLOCK_OPS:
            raise ValueError(f"block_ops={self.block_ops!r} is not one of {', '.join(BLOCK_OPS)}")
        if self.loss not in LOSSES:
            raise ValueError(f"loss={self.loss!r} is not one of {', '.join(LOSSES)}")
        state_bytes(self.precision, self.optimizer)  # validates the optimizer name

    @property
    def cp_mode(self) -> str:
        """Context parallelism's algorithm (`strategy.cp_mode`); read when a layout's cp > 1."""
        return self.options.cp.cp_mode

    def rank_tokens(self, layout) -> float:
        """Tokens of one microbatch on one rank: micro_batch_size x seq_len over the layout's
        cp (a context-parallel rank holds 1/cp of every sequence)."""
        return self.micro_batch_size * self.seq_len / layout.cp

    def microbatches(self, dp: int) -> int:
        """Microbatches one data-parallel rank runs per optimizer step (at least 1)."""
        return max(self.global_batch_size // dp // self.micro_batch_size, 1)

    def with_knobs(self, **knobs) -> TrainSettings:
        """A copy with some strategy knobs changed (`activation_checkpointing="op"`, ...)."""
        return replace(self, options=with_knobs(self.options, knobs))

    @classmethod
    def of(cls, *, options: StrategyOptions | None = None, **kwargs) -> TrainSettings:
        """Settings from fields and strategy knobs by name: `TrainSettings.of(seq_len=4096,
        global_batch_size=8, activation_checkpointing="op")`. Without `options`, the knobs
        start from PLANNER_OPTIONS."""
        knobs = {k: kwargs.pop(k) for k in list(kwargs) if k in KNOB_GROUP}
        return cls(options=with_knobs(options or PLANNER_OPTIONS, knobs), **kwargs)


PLANNER_OPTIONS = StrategyOptions()
"""The knobs the planner assumes when no strategy is given: every default (sequence parallelism
is auto, on under TP with the Llama plan the planner models)."""


def with_knobs(options: StrategyOptions, knobs: dict) -> StrategyOptions:
    """`options.with_knobs(**knobs)`, where activation_checkpointing may also be True (full)
    or False (off), as the planner's callers have long written it."""
    ac = knobs.get("activation_checkpointing")
    if isinstance(ac, bool):
        knobs = {**knobs, "activation_checkpointing": "full" if ac else 0}
    if options.fsdp1 is None and any(KNOB_GROUP.get(k) == "fsdp1" for k in knobs):
        # An FSDP1 knob alone (limit_all_gathers=False) keeps the planner's default mode.
        options = replace(options, fsdp1=FSDP1Options(sharding_strategy="FULL_SHARD"))
    return options.with_knobs(**knobs) if knobs else options
