"""The families the layout search walks: degrees (tp, pp, cp and its mode, the dp split, ep)
plus an FSDP mode, each searched by `planner/search.py` over schedule, checkpointing, offload
and micro-batch size; degrees that cannot work become families with the reason."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from lightning_dist.layout import Layout, ulysses_heads_problem
from lightning_dist.planner.inputs import SearchInputs
from lightning_dist.planner.layout_checks import float8_problem, pp_problem, tp_problem
from lightning_dist.planner.memory import SHARDED_MODES
from lightning_dist.planner.mixed import mixed_problem
from lightning_dist.planner.settings import SHARDING_MODES
from lightning_dist.planner.space import (
    cp_values,
    dp_splits,
    ep_values,
    layout_makers,
    powers_of_two,
    pp_values,
    sharded_splits,
)


@dataclass(frozen=True)
class Family:
    """Degrees plus FSDP mode, searched over schedule, AC, offload and micro-batch size.

    `problem` is set (and `makers` empty) when the degrees alone rule it out.
    """

    key: str
    makers: list = field(default_factory=list)
    mode: str = ""
    per_rank: int = 0
    problem: str | None = None
    knobs: dict = field(default_factory=dict)
    """Strategy knobs every variant of the family sets (`cp_mode` when cp > 1)."""


def enumerate_families(search: SearchInputs) -> tuple[list[Family], float]:
    """Walk tp, then pp, then the dp splits, and list the families in that order.

    Degrees that cannot work become families with a `problem`. Also returns the smallest global
    batch any (tp, pp) could take, for the message when no layout can exist.
    """
    model: Any = search.model  # duck-typed over ModelArgs, like the rest of the planner
    per_node, world = search.per_node, search.world
    families: list[Family] = []
    min_batch = math.inf
    base = search.base
    for tp in powers_of_two(world):
        problem = tp_problem(model, per_node, tp) or float8_problem(
            base.options.float8.float8, tp, search.hardware
        )
        if problem:
            families.append(Family(f"tp={tp}", problem=problem))
            if tp > per_node:
                break  # every larger tp crosses the node boundary too
            continue
        for pp in pp_values(world // tp, model.n_layers):
            problem = pp_problem(model, pp)
            if problem:
                families.append(Family(f"tp={tp} pp={pp}", problem=problem))
                break
            problem = mixed_problem(search.hardware, pp)
            if problem:
                families.append(Family(f"tp={tp} pp={pp}", problem=problem))
                continue
            for cp in cp_values(world // (tp * pp), base.seq_len):
                dp = world // (tp * pp * cp)
                # One sequence per data-parallel rank; 1F1B wants pp microbatches per pipeline.
                min_batch = min(min_batch, dp * (pp if "GPipe" not in search.schedules else 1))
                for mode in _cp_modes(model, tp, cp):
                    families += _dp_families(search, tp, pp, dp, cp, mode)
    return families, min_batch


def _cp_modes(model, tp: int, cp: int) -> tuple[str | None, ...]:
    """The `cp_mode`s a family of this cp tries: none at cp = 1, else allgather, and ulysses
    where it can split the heads of a tp rank."""
    if cp == 1:
        return (None,)
    if ulysses_heads_problem(model.n_heads, model.kv_heads, cp, tp):
        return ("allgather",)
    return ("allgather", "ulysses")


def _dp_families(
    search: SearchInputs, tp: int, pp: int, dp: int, cp: int = 1, cp_mode: str | None = None
) -> list[Family]:
    """The families of one (tp, pp, cp, cp_mode): one per dp split and FSDP mode, or a single
    rejected one when the global batch does not split over dp."""
    gbs = search.base.global_batch_size
    degrees = f"tp={tp} pp={pp}" + (f" cp={cp} {cp_mode}" if cp > 1 else "")
    if gbs % dp:
        verb = "is smaller than" if gbs < dp else "is not divisible by"
        reason = f"global_batch_size={gbs} {verb} dp={dp}"
        return [Family(f"{degrees} dp={dp}", problem=reason)]
    shard_start = search.per_node // tp
    if cp == 1:
        splits = dp_splits(dp, pp, shard_start, search.sharding_modes)
    else:  # FSDP shards over dp_shard x cp: no pure replication
        splits = sharded_splits(
            dp_splits(dp, pp, shard_start, SHARDING_MODES), search.sharding_modes, pp
        )
    knobs = {"cp_mode": cp_mode} if cp > 1 else {}
    families = []
    for r, s, mode in splits:
        split = mode in SHARDED_MODES and search.expert_parallel
        for ep in ep_values(search.model, s * cp) if split else [1]:
            key = f"{degrees} dp_replicate={r} dp_shard={s}" + (f" ep={ep}" if ep > 1 else "")
            key += f" {mode}" if s * cp > 1 or mode == "SHARD_OPTIMIZER" else ""
            problem = Layout(dp_replicate=r, dp_shard=s, cp=cp, tp=tp, ep=ep).experts_problem(
                search.model
            )
            if problem:
                families.append(Family(key, problem=problem))
                continue
            makers = layout_makers(search.model, pp, r, s, tp, search.schedules, cp, ep)
            families.append(Family(key, makers, mode, gbs // dp, knobs=knobs))
    return families
