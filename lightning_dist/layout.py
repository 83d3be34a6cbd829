"""Layout: the one description of how ranks are split into data, context, tensor and pipeline
groups.

The strategies, the planner and the telemetry all read it. It validates itself on construction
and names the offending numbers; building the DeviceMesh is the only part that needs
torch.distributed, and it is imported lazily so the planner can use this file on a laptop.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from typing import Any

# Mesh dimensions from outermost (slowest links, across nodes) to innermost (NVLink).
MESH_DIMS = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
SCHEDULES = ("GPipe", "1F1B", "Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble")
SINGLE_STAGE_SCHEDULES = ("GPipe", "1F1B")
INTERLEAVED_SCHEDULES = ("Interleaved1F1B", "InterleavedZeroBubble")


def _field(default: Any, doc: str) -> Any:
    """A `Layout` field with its documentation (the strategy knob reference reads `doc`)."""
    return field(default=default, metadata={"doc": doc})


@dataclass(frozen=True, kw_only=True)
class Layout:
    """Parallel degrees and pipeline settings. `-1` on one degree means "the remaining ranks"."""

    pp: int = _field(1, "Pipeline-parallel ranks (outermost); -1 means the remaining ranks.")
    dp_replicate: int = _field(
        1,
        "Data-parallel replica groups (DDP, or HSDP across them); null (in a strategy "
        "config) means one per node.",
    )
    dp_shard: int = _field(
        1, "Data-parallel ranks sharding parameters (FSDP2); -1 means the remaining ranks."
    )
    cp: int = _field(
        1,
        "Context-parallel ranks, which split each sequence into 2 x cp chunks (between "
        "dp_shard and tp; parameters are sharded over dp_shard x cp); -1 means the "
        "remaining ranks.",
    )
    tp: int = _field(
        1,
        "Tensor-parallel ranks, which split each layer (innermost: keep within a node); "
        "-1 means the remaining ranks.",
    )
    ep: int = _field(
        1,
        "Expert-parallel ranks (mixture of experts): each MoE layer's experts split over "
        "ep ranks borrowed from dp_shard (the innermost ep of them, which still read "
        "different batches; so not a factor of the world size), tokens exchanged by "
        "all-to-all; the experts are FSDP-sharded over the other dp_shard / ep "
        "(parallel/expert_parallel.py). Must divide model.num_experts and dp_shard; cp "
        "with experts is refused.",
    )
    schedule: str = _field(
        "1F1B",
        "GPipe, 1F1B, Interleaved1F1B, InterleavedZeroBubble or ZBVZeroBubble; only read "
        "when pp > 1.",
    )
    microbatches: int | None = _field(None, "Pipeline microbatches per step; null means 2 x pp.")
    virtual_stages: int = _field(
        1,
        "Model chunks (stages) per pipeline rank: 2+ for the interleaved schedules, 2 for "
        "ZBVZeroBubble.",
    )

    def __post_init__(self) -> None:
        degrees = self.degrees()
        bad = {k: v for k, v in degrees.items() if v == 0 or v < -1}
        if bad:
            raise ValueError(f"parallel degrees must be positive or -1, got {_fmt(bad)}")
        if sum(v == -1 for v in degrees.values()) > 1:
            raise ValueError(f"at most one degree may be -1, got {_fmt(degrees)}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule={self.schedule!r} is not one of {', '.join(SCHEDULES)}")
        if self.virtual_stages < 1:
            raise ValueError(f"virtual_stages={self.virtual_stages} must be at least 1")
        if self.microbatches is not None and self.microbatches < 1:
            raise ValueError(f"microbatches={self.microbatches} must be at least 1")
        if self.pp > 1 and self.schedule == "1F1B" and self.num_microbatches < self.pp:
            raise ValueError(
                f"schedule=1F1B needs at least pp={self.pp} microbatches, got {self.num_microbatches}"
            )
        self._check_schedule()
        self._check_ep()

    def _check_ep(self) -> None:
        """ep is at least 1 and divides dp_shard x cp, whose ranks it borrows (once known)."""
        ep = self.ep
        if isinstance(ep, bool) or not isinstance(ep, int) or ep < 1:
            raise ValueError(
                f"strategy.ep={ep!r} must be a whole number of at least 1 (it borrows ranks from "
                "dp_shard x cp, so it cannot be -1)"
            )
        if ep > 1 and -1 not in (self.dp_shard, self.cp) and self.shard_size % ep:
            raise ValueError(
                f"strategy.ep={ep} does not divide dp_shard x cp = {self.dp_shard} x {self.cp} = "
                f"{self.shard_size}, the ranks it borrows; pick an ep that divides "
                f"{self.shard_size} (or more data-parallel ranks)"
            )

    def _check_schedule(self) -> None:
        """Each schedule's rule on stages per rank and microbatches (torch's own constraints)."""
        v, sched = self.virtual_stages, self.schedule
        if sched in SINGLE_STAGE_SCHEDULES and v != 1:
            raise ValueError(
                f"schedule={sched} runs one stage per rank, got virtual_stages={v}; "
                f"use one of {', '.join(s for s in SCHEDULES if s not in SINGLE_STAGE_SCHEDULES)}"
            )
        if sched == "ZBVZeroBubble" and v != 2:
            raise ValueError(f"schedule=ZBVZeroBubble needs virtual_stages=2, got {v}")
        if sched in INTERLEAVED_SCHEDULES and v < 2:
            raise ValueError(f"schedule={sched} needs virtual_stages >= 2, got {v}")
        if self.pp > 1 and sched in INTERLEAVED_SCHEDULES:
            m = self.num_microbatches
            rounds = max(1, m // self.pp)
            if m % rounds:
                raise ValueError(
                    f"schedule={sched} needs microbatches={m} to be a multiple of "
                    f"microbatches // pp = {rounds} (pp={self.pp})"
                )

    def degrees(self) -> dict[str, int]:
        """The degrees in mesh order (outermost first)."""
        return {name: getattr(self, name) for name in MESH_DIMS}

    @property
    def dp(self) -> int:
        """Data-parallel size: the number of different batches processed at once."""
        return self.dp_replicate * self.dp_shard

    @property
    def shard_size(self) -> int:
        """Ranks FSDP shards parameters over: dp_shard x cp (context-parallel ranks hold the
        same weights, so they shard them too)."""
        return self.dp_shard * self.cp

    @property
    def expert_shard_size(self) -> int:
        """Ranks FSDP shards each expert over: dp_shard x cp / ep (the rest hold other experts)."""
        return self.shard_size // self.ep

    def describe(self) -> dict[str, int]:
        """The degrees in mesh order, and ep when above 1 (summary.json's `layout`)."""
        return {**self.degrees(), **({"ep": self.ep} if self.ep > 1 else {})}

    @property
    def world_size(self) -> int:
        return math.prod(self.degrees().values())

    @property
    def num_microbatches(self) -> int:
        return self.microbatches if self.microbatches is not None else 2 * self.pp

    def resolve(self, world_size: int) -> Layout:
        """Fill a `-1` degree from `world_size` and check that the degrees multiply to it."""
        degrees = self.degrees()
        known = math.prod(v for v in degrees.values() if v != -1)
        free = [k for k, v in degrees.items() if v == -1]
        if free:
            if world_size % known:
                raise ValueError(
                    f"world size {world_size} is not divisible by {_fmt(degrees)} (product {known})"
                )
            degrees[free[0]] = world_size // known
        product = math.prod(degrees.values())
        if product != world_size:
            raise ValueError(
                f"parallel degrees {_fmt(degrees)} multiply to {product}, "
                f"but the world size is {world_size}"
            )
        return replace(self, **degrees)  # __post_init__ checks ep against the resolved dp_shard

    @property
    def num_stages(self) -> int:
        """Pipeline stages in total: pp ranks x virtual stages per rank."""
        return self.pp * self.virtual_stages

    # --- rank arithmetic (row-major over MESH_DIMS, as init_device_mesh lays ranks out) -------

    def coordinate(self, rank: int) -> dict[str, int]:
        """The position of global `rank` along each mesh dimension."""
        self._require_resolved()
        coords = {}
        for name in reversed(MESH_DIMS):
            size = getattr(self, name)
            coords[name] = rank % size
            rank //= size
        return {name: coords[name] for name in MESH_DIMS}

    def group_ranks(self, *dims: str) -> list[list[int]]:
        """The global ranks of every group spanning `dims` (e.g. "tp"), the rest held fixed."""
        groups: dict[tuple[int, ...], list[int]] = {}
        for rank in range(self.world_size):
            c = self.coordinate(rank)
            groups.setdefault(tuple(v for k, v in c.items() if k not in dims), []).append(rank)
        return list(groups.values())

    def dp_rank(self, rank: int) -> int:
        """Rank of global `rank` among the data-parallel ranks (replicate-major, then shard)."""
        c = self.coordinate(rank)
        return c["dp_replicate"] * self.dp_shard + c["dp_shard"]

    def stage_ids(self, pp_rank: int) -> list[int]:
        """Pipeline stages held by `pp_rank`: looped (r, r + pp, ...), or a V for ZBVZeroBubble."""
        if self.schedule == "ZBVZeroBubble":
            return [pp_rank, self.num_stages - 1 - pp_rank]
        return [pp_rank + k * self.pp for k in range(self.virtual_stages)]

    # --- checks against the model, the batch and the machine ---------------------------------

    def check_model(self, args) -> None:
        """Raise ValueError if `args` (a ModelArgs) cannot be split by this layout's tp and pp."""
        problem = tp_split_problem(args, self.tp) or self.experts_problem(args)
        if problem:
            raise ValueError(problem)
        if args.n_layers < self.num_stages:
            raise ValueError(
                f"model n_layers={args.n_layers} is fewer than pp={self.pp} x "
                f"virtual_stages={self.virtual_stages} = {self.num_stages} pipeline stages"
            )
        if self.pp > 1 and args.tie_embeddings:
            raise ValueError(
                f"tie_embeddings=True shares the embedding with the output layer, which pp={self.pp} "
                "puts on different stages; untie them or use pp=1"
            )
        if self.tp > 1 and args.tie_embeddings:
            # Sharding the two modules one after the other would silently untie them.
            raise ValueError(
                f"tie_embeddings=True is not supported with tp={self.tp} yet; untie them or use tp=1"
            )

    def experts_problem(self, args) -> str | None:
        """Why this layout cannot train `args`' model as far as experts go, or None: ep above 1
        needs a mixture of experts whose experts and FSDP shards it splits evenly; a mixture of
        experts runs with dp_replicate, dp_shard, ep, tp and pp, not yet with cp."""
        experts = getattr(args, "num_experts", 0)
        if not experts:
            if self.ep > 1:
                return (
                    f"strategy.ep={self.ep} splits the experts of a mixture of experts, but the "
                    "model is dense (no model.num_experts); use strategy.ep=1 or an MoE model"
                )
            return None
        if self.cp > 1:
            return (
                f"strategy.cp={self.cp} with a mixture of experts (model.num_experts={experts}) "
                "is not supported yet; use strategy.cp=1 (data, expert, tensor and pipeline "
                "parallelism run it)"
            )
        if experts % self.ep:
            return (
                f"strategy.ep={self.ep} does not divide model.num_experts={experts}: each "
                f"expert-parallel rank holds num_experts / ep experts; pick an ep that divides "
                f"{experts}"
            )
        shards = self.expert_shard_size
        if self.ep > 1 and -1 not in (self.dp_shard, self.cp) and shards > 1:
            for name, size in (("expert_hidden_size", args.expert_dim), ("dim", args.dim)):
                if size % shards:
                    return (
                        f"model.{name}={size} is not divisible by dp_shard x cp / ep = "
                        f"{self.shard_size} / {self.ep} = {shards}, the ranks FSDP splits each "
                        "expert's weights over (dim 1; ep splits dim 0): change strategy.ep or "
                        "strategy.dp_shard"
                    )
        return None

    def check_batch(self, global_batch_size: int, micro_batch_size: int | None = None) -> None:
        """Raise ValueError unless each data-parallel micro-batch splits into the microbatches.

        Under PP a rank's micro-batch (global / dp unless micro_batch_size is set) is cut into
        `num_microbatches` equal pipeline microbatches.
        """
        if self.pp == 1:
            return
        m = self.num_microbatches
        if micro_batch_size is None and global_batch_size % (self.dp * m):
            raise ValueError(
                f"data.global_batch_size={global_batch_size} is not divisible by dp={self.dp} x "
                f"microbatches={m} = {self.dp * m}; "
                f"{nearest_multiples(global_batch_size, self.dp * m)}"
            )
        if micro_batch_size is not None and micro_batch_size % m:
            per_dp = global_batch_size // self.dp if global_batch_size % self.dp == 0 else 0
            valid = [v for v in range(m, per_dp + 1, m) if per_dp % v == 0]
            raise ValueError(
                f"data.per_rank_batch_size={micro_batch_size} (one rank's batch, which pp cuts "
                f"into its microbatches) is not divisible by microbatches={m}; "
                f"{nearest_valid(micro_batch_size, valid, 'data.per_rank_batch_size')}"
            )

    def check_sequence(self, seq_len: int) -> None:
        """Raise ValueError unless context parallelism can cut `seq_len` into 2 x cp equal
        chunks (each rank holds a head and a tail chunk)."""
        if self.cp > 1 and seq_len % (2 * self.cp):
            step = 2 * self.cp
            raise ValueError(
                f"data.seq_len={seq_len} does not split into 2 x strategy.cp = {step} equal "
                f"chunks; {nearest_multiples(seq_len, step, 'data.seq_len')}"
            )

    def check_nodes(self, devices_per_node: int, num_nodes: int) -> None:
        """Raise ValueError if a tensor-parallel group would span nodes (tp is innermost)."""
        if num_nodes > 1 and devices_per_node % self.tp:
            raise ValueError(
                f"tp={self.tp} does not divide the {devices_per_node} devices of a node, so "
                "tensor-parallel groups would cross nodes; pick tp dividing hardware.devices"
            )

    def _require_resolved(self) -> None:
        if -1 in self.degrees().values():
            raise ValueError("resolve(world_size) the layout first")

    def build_mesh(self, device_type: str):
        """Build the named DeviceMesh; dimensions of size 1 are kept so names always resolve."""
        from torch.distributed.device_mesh import init_device_mesh

        self._require_resolved()
        return init_device_mesh(
            device_type, tuple(self.degrees().values()), mesh_dim_names=MESH_DIMS
        )


def balanced_split(costs: list[int], num_stages: int) -> list[int]:
    """Cut `costs` into `num_stages` contiguous non-empty runs minimising the largest run sum
    (ties: the smaller sum of squares, i.e. the more even split); return the start index of
    every run but the first."""
    n = len(costs)
    prefix = [0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = (float("inf"), float("inf"))
    # best[s][i]: (largest run, sum of squared runs) when the first i items form s runs.
    best = [[inf] * (n + 1) for _ in range(num_stages + 1)]
    cut = [[0] * (n + 1) for _ in range(num_stages + 1)]
    best[0][0] = (0, 0)
    for s in range(1, num_stages + 1):
        for i in range(s, n - (num_stages - s) + 1):
            for j in range(s - 1, i):
                run = prefix[i] - prefix[j]
                value = (max(best[s - 1][j][0], run), best[s - 1][j][1] + run * run)
                if value < best[s][i]:
                    best[s][i], cut[s][i] = value, j
    points, i = [], n
    for s in range(num_stages, 1, -1):
        i = cut[s][i]
        points.append(i)
    return points[::-1]


@functools.lru_cache(maxsize=256)
def stage_sizes(
    n_blocks: int, num_stages: int, block: int | tuple[int, ...], first: int, last: int
) -> tuple[int, ...]:
    """Blocks in each pipeline stage of a model of `n_blocks` equal blocks of `block` parameters
    (or of blocks of `block[i]` parameters each: a mixture of experts' dense and MoE blocks)
    whose first stage also holds `first` parameters (the embedding) and its last `last` (the
    final norm and the output): the cut `parallel/pipeline.py` makes without `split_points`
    (`balanced_split` of the per-block parameter counts), so the planner counts the stages the
    code builds."""
    costs = list(block) if isinstance(block, tuple) else [block] * n_blocks
    costs[0] += first
    costs[-1] += last
    return run_lengths(balanced_split(costs, num_stages), n_blocks)


def run_lengths(split_points: list[int], n_blocks: int) -> tuple[int, ...]:
    """Blocks per stage of `n_blocks` cut at `split_points` (each stage's first block but the
    first stage's)."""
    bounds = [0, *split_points, n_blocks]
    return tuple(b - a for a, b in zip(bounds, bounds[1:], strict=False))


def tp_split_problem(args, tp: int) -> str | None:
    """Why tensor parallelism of degree `tp` cannot split this model's layers, or None.

    Shared by the strategies' pre-flight checks and the planner, so both refuse the same models.
    A mixture of experts' MLPs are replicated over tp (`parallel/expert_parallel.py`), so their
    width need not divide.
    """
    sizes = [("n_heads", args.n_heads), ("n_kv_heads", args.kv_heads)]
    if not getattr(args, "num_experts", 0):
        sizes.append(("ffn_hidden_size", args.hidden_dim))
    for name, value in (*sizes, ("vocab_size", args.vocab_size)):
        if value % tp:
            return f"model {name}={value} is not divisible by tp={tp}"
    return None


def ulysses_heads_problem(n_heads: int, n_kv_heads: int, cp: int, tp: int = 1) -> str | None:
    """Why Ulysses context parallelism over `cp` ranks cannot split the attention heads of one
    tensor-parallel rank of `tp` (`n_heads` and `n_kv_heads` are the model's), or None: the
    query heads per tp rank must divide by cp, the key/value heads per tp rank divide by cp or
    divide it (fewer are repeated up to cp). Shared by the strategy and the planner."""
    q, kv = n_heads // tp, n_kv_heads // tp
    if q % cp or (kv % cp and cp % kv):
        per = f" per tp={tp} rank" if tp > 1 else ""
        return (
            f"strategy.cp_mode=ulysses splits attention heads over strategy.cp={cp} ranks: "
            f"the {q} query heads{per} must divide by it, and the {kv} key/value "
            f"heads{per} divide by it or divide it; use strategy.cp_mode=allgather or another cp"
        )
    return None


@dataclass(frozen=True, kw_only=True)
class Batch:
    """The batch a run trains with: `data.global_batch_size` sequences of `data.seq_len` tokens
    per optimizer step, cut into micro-batches of `data.micro_batch_size` per data-parallel rank
    (None: a rank's whole share at once)."""

    global_batch_size: int
    seq_len: int
    micro_batch_size: int | None = None

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.seq_len

    @classmethod
    def of_config(cls, data: Any) -> Batch:
        """The batch of a `data` config section (conf/data/*; anything with those keys)."""
        micro = data.get("micro_batch_size")
        return cls(
            global_batch_size=int(data.global_batch_size),
            seq_len=int(data.seq_len),
            micro_batch_size=None if micro is None else int(micro),
        )


def batch_plan(
    global_batch_size: int, dp_size: int, micro_batch_size: int | None = None
) -> tuple[int, int]:
    """Return (micro_batch_size, grad_accumulation) for one data-parallel rank.

    With `micro_batch_size=None` each rank takes its whole share in one micro-batch. Raises
    ValueError naming the numbers when the global batch cannot be split evenly.
    """
    if global_batch_size < 1:
        raise ValueError(f"data.global_batch_size={global_batch_size} must be at least 1")
    if dp_size < 1:
        raise ValueError(f"data-parallel size {dp_size} must be at least 1")
    if micro_batch_size is None:
        if global_batch_size % dp_size:
            raise ValueError(
                f"data.global_batch_size={global_batch_size} is not divisible by "
                f"data-parallel size {dp_size}; {nearest_multiples(global_batch_size, dp_size)}"
            )
        return global_batch_size // dp_size, 1
    if micro_batch_size < 1:
        raise ValueError(f"data.per_rank_batch_size={micro_batch_size} must be at least 1")
    if global_batch_size % (dp_size * micro_batch_size):
        step = dp_size * micro_batch_size
        raise ValueError(
            f"data.global_batch_size={global_batch_size} is not divisible by data-parallel size "
            f"{dp_size} x data.per_rank_batch_size={micro_batch_size} = {step}; "
            f"{nearest_multiples(global_batch_size, step)}"
        )
    return micro_batch_size, global_batch_size // (dp_size * micro_batch_size)


def nearest_valid(value: int, valid: list[int], key: str) -> str:
    """The valid values next to `value`, as the fix of a batch error."""
    near = [
        v
        for v in (
            max((v for v in valid if v < value), default=None),
            min((v for v in valid if v > value), default=None),
        )
        if v
    ]
    if not near:
        return f"no value of {key} fits; change data.global_batch_size or the layout"
    if len(near) == 1:
        return f"the nearest valid value is {key}={near[0]}"
    return f"the nearest valid values are {key}={near[0]} and {key}={near[1]}"


def nearest_multiples(value: int, step: int, key: str = "data.global_batch_size") -> str:
    """The multiples of `step` next to `value`, as the fix of a batch error."""
    return nearest_valid(value, [value // step * step, (value // step + 1) * step], key)


def _fmt(degrees: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in degrees.items())


DEPRECATED_BATCH_KNOB = "data.micro_batch_size"
"""The old name of `data.per_rank_batch_size`: under pp it is not the pipeline micro-batch."""


def per_rank_batch(per_rank_batch_size: int | None, micro_batch_size: int | None) -> int | None:
    """One rank's batch from `data.per_rank_batch_size` and its deprecated name
    `data.micro_batch_size` (which the config makes follow the new name unless set itself)."""
    if micro_batch_size is None or micro_batch_size == per_rank_batch_size:
        return per_rank_batch_size
    if per_rank_batch_size is not None:
        raise ValueError(
            f"data.per_rank_batch_size={per_rank_batch_size} and its deprecated name "
            f"{DEPRECATED_BATCH_KNOB}={micro_batch_size} disagree; set data.per_rank_batch_size only"
        )
    return micro_batch_size


def warn_if_deprecated_batch_knob() -> None:
    """One deprecation line (rank 0) when the command line sets `data.micro_batch_size`."""
    try:
        from hydra.core.hydra_config import HydraConfig
    except ImportError:
        return
    if not HydraConfig.initialized():
        return
    keys = {o.lstrip("+").partition("=")[0] for o in HydraConfig.get().overrides.task}
    if DEPRECATED_BATCH_KNOB in keys:
        from lightning.pytorch.utilities import rank_zero_deprecation

        rank_zero_deprecation(
            f"{DEPRECATED_BATCH_KNOB} is deprecated: use data.per_rank_batch_size, its new name "
            "(each rank's batch, which pp cuts into microbatches: not the pipeline micro-batch)"
        )
