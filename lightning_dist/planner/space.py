"""The space of layouts the search walks, pruned to what is worth estimating.

TP takes powers of two inside a node; PP takes every divisor of the remaining ranks up to the
layer count (uneven splits are allowed, the busiest stage sets the pace: BLOOM-176B trained its
70 layers on pp=12); CP takes powers of two for long sequences (`cp_values`); DP is pure
replication (DDP), ZeRO-1 (`SHARD_OPTIMIZER`: replicated parameters and gradients, optimizer
states sharded: `strategy.shard_optimizer`), pure sharding (FULL_SHARD, SHARD_GRAD_OP) or HSDP with a
power-of-two shard group; interleaved schedules try 2, 4 and 8 chunks per rank, and up to two
chunks more than the layers (an embedding-only and a loss-only chunk; planner only); micro-batch
sizes are the powers of two and three times the powers of two dividing the per-rank batch.
"""

from __future__ import annotations

import math

from lightning_dist.layout import Layout
from lightning_dist.planner.layout_checks import pp_problem

INTERLEAVED = ("Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble")
CP_MIN_SEQ_LEN = 16384
"""Sequences shorter than this are not split by context parallelism in a search: below it a
rank's activations fit with TP, PP and checkpointing alone, and the key/value exchange only
costs (Llama 3 trained at 8192 tokens without CP and added it for 131072). An explicit
`strategy.cp` is estimated at any length."""
CP_MIN_RANK_TOKENS = 4096
"""The shortest share of a sequence a context-parallel rank is given in a search (cp at most
seq_len / 4096): smaller shares make the exchange outweigh the attention it splits."""


def layout_makers(model, pp, r, s, tp, schedules, cp=1, ep=1):
    """Functions from a microbatch count to a Layout, one per schedule (and interleaving
    depth v in 2, 4, 8 for the interleaved schedules, while pp x v <= n_layers)."""
    if pp == 1:
        return [lambda m: Layout(pp=1, dp_replicate=r, dp_shard=s, cp=cp, tp=tp, ep=ep)]
    makers = []
    for sched in schedules:
        depths = (2,) if sched == "ZBVZeroBubble" else (2, 4, 8) if sched in INTERLEAVED else (1,)
        extra = (model.n_layers + 2) // pp
        if sched in INTERLEAVED and sched != "ZBVZeroBubble" and pp * extra > model.n_layers:
            # Beside the powers of two, more chunks than layers / pp: every layer plus an
            # embedding-only and a loss-only chunk (`stage_shapes.stage_shapes`; planner only).
            depths += tuple({extra} - {*depths, 1})
        for v in depths:
            if pp_problem(model, pp, v) is None:
                makers.append(
                    lambda m, sched=sched, v=v: Layout(
                        pp=pp,
                        dp_replicate=r,
                        dp_shard=s,
                        cp=cp,
                        tp=tp,
                        ep=ep,
                        schedule=sched,
                        microbatches=m,
                        virtual_stages=v,
                    )
                )
    return makers


def dp_splits(dp, pp, shard_start, modes):
    """(dp_replicate, dp_shard, mode) options: DDP, ZeRO-1 over the replicas, full sharding,
    and HSDP splits whose shard group is a power of two from one node's worth of ranks up to
    half of dp."""
    if dp == 1:
        return [(1, 1, "NO_SHARD")]
    splits = [(dp, 1, "NO_SHARD"), (dp, 1, "SHARD_OPTIMIZER"), (1, dp, "FULL_SHARD")]
    if pp == 1:
        splits.append((1, dp, "SHARD_GRAD_OP"))  # under PP it behaves as FULL_SHARD does
    s = max(2, shard_start)
    while s < dp:
        if dp % s == 0:
            splits.append((dp // s, s, "HYBRID_SHARD"))
        s *= 2
    return [x for x in splits if x[2] in modes]


def cp_values(ranks: int, seq_len: int) -> list[int]:
    """Context-parallel degrees to try on `ranks` ranks: 1, and for sequences of at least
    CP_MIN_SEQ_LEN tokens the powers of two dividing `ranks` that cut `seq_len` into 2 x cp
    equal chunks of which each rank keeps at least CP_MIN_RANK_TOKENS."""
    if seq_len < CP_MIN_SEQ_LEN:
        return [1]
    return [1] + [
        c
        for c in powers_dividing(ranks)[1:]
        if seq_len % (2 * c) == 0 and seq_len // c >= CP_MIN_RANK_TOKENS
    ]


def sharded_splits(
    splits: list[tuple[int, int, str]], modes, pp: int
) -> list[tuple[int, int, str]]:
    """`dp_splits` for cp > 1, where FSDP always shards (over dp_shard x cp): pure replication
    becomes HSDP over the cp ranks, or with no data parallelism FULL_SHARD and (without PP)
    SHARD_GRAD_OP over them, in `modes`."""
    out = []
    for r, s, mode in splits:
        if mode == "SHARD_OPTIMIZER":  # FSDP shards the parameters over cp already
            continue
        options = [mode]
        if mode == "NO_SHARD":
            options = (
                ["HYBRID_SHARD"]
                if r > 1
                else ["FULL_SHARD", "SHARD_GRAD_OP"][: 2 if pp == 1 else 1]
            )
        for option in options:
            if option in modes and (r, s, option) not in out:
                out.append((r, s, option))
    return out


def ep_values(model, shard_size: int) -> list[int]:
    """Expert-parallel degrees to try for a mixture of experts sharded over `shard_size` ranks
    (dp_shard x cp): 1, and the powers of two above it that divide both the experts and the
    shard group (a dense model: 1 only)."""
    experts = getattr(model, "num_experts", 0)
    if not experts:
        return [1]
    return [e for e in powers_dividing(shard_size) if experts % e == 0]


def pp_values(ranks: int, n_layers: int) -> list[int]:
    """Pipeline degrees to try for `ranks` ranks: every divisor up to the layer count (stages
    need not hold equal blocks), plus the first one past it (whose rejection the search
    reports)."""
    values = divisors(ranks)
    return [d for d in values if d <= n_layers] + [d for d in values if d > n_layers][:1]


def micro_batch_values(per_rank: int) -> list[int]:
    """Micro-batch sizes to try for a per-rank batch of `per_rank` sequences, ascending: the
    powers of two and three times the powers of two that divide it (1, 2, 3, 4, 6, 8, 12, ...;
    a per-rank batch of 96 tries 6 and 12, not only 4 and 8)."""
    sizes = {p * k for p in powers_of_two(per_rank) for k in (1, 3)}
    return sorted(b for b in sizes if per_rank % b == 0)


def powers_of_two(limit: int) -> list[int]:
    """1, 2, 4, ... up to `limit`."""
    return [1 << i for i in range(limit.bit_length()) if (1 << i) <= limit]


def powers_dividing(n: int) -> list[int]:
    """The powers of two that divide `n`."""
    return [p for p in powers_of_two(n) if n % p == 0]


def divisors(n: int) -> list[int]:
    """Every divisor of `n`, ascending."""
    small = [i for i in range(1, math.isqrt(n) + 1) if n % i == 0]
    return sorted(set(small + [n // i for i in small]))
