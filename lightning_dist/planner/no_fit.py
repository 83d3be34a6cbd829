"""Why no layout fits: the closest misses of a search, and one line saying what would help.

`search.py` calls these when no family has a fitting variant (`nothing_fits`) or none got as far
as a memory estimate (`no_layout_exists`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

from lightning_dist.layout import Layout
from lightning_dist.planner.estimate import Candidate, evaluate
from lightning_dist.planner.inputs import SearchInputs
from lightning_dist.planner.settings import GIB, TrainSettings, state_bytes


class Miss(NamedTuple):
    """The variant of a family needing the least device memory, when none of them fits."""

    need: tuple[bool, float]
    layout: Layout
    settings: TrainSettings
    problem: str | None


def closest_misses(search: SearchInputs, misses: list[Miss]) -> list[Candidate]:
    """The five misses needing the least device memory, fully estimated, smallest first."""
    return [
        evaluate(
            search.model,
            search.hardware,
            miss.layout,
            miss.settings,
            headroom=search.headroom,
            efficiency=search.efficiency,
            overlap=search.overlap,
            compile_speedup=search.compile_speedup,
        )
        for miss in sorted(misses, key=lambda miss: miss.need)[:5]
    ]


def no_layout_exists(search: SearchInputs, min_batch: float, rejected: dict[str, str]) -> str:
    """One line for when no family got as far as a memory estimate: the global batch is too
    small for the devices, or the first few distinct reasons."""
    gbs, world = search.base.global_batch_size, search.world
    if gbs < min_batch < math.inf:
        return (
            f"global_batch_size={gbs} is too small for {world} devices: every "
            f"layout needs at least {min_batch} sequences per step (one per data-parallel "
            f"rank, and pp microbatches per pipeline); raise it or use fewer devices"
        )
    reasons = "; ".join(list(dict.fromkeys(rejected.values()))[:4])
    return f"no layout can exist on {world} devices: {reasons}"


def nothing_fits(search: SearchInputs, smallest: Candidate) -> str:
    """One line: the smallest memory any layout needs, and what would help."""
    model, hardware, base = search.model, search.hardware, search.base
    per_param = sum(state_bytes(base.precision, base.optimizer))
    states = per_param * model.num_params()
    helps = [f"more devices (the model states alone are {_gib(states)} GiB in total"]
    if hardware.memory_gib:
        usable = hardware.memory_gib * GIB * search.headroom
        helps[0] += f", {math.ceil(states / usable)} devices' worth"
    helps[0] += ")"
    if not any(c.mode == "full" and c.every_n == 1 for c in search.ac_options):
        helps.append(
            "activation checkpointing of every block (strategy.activation_checkpointing=full)"
        )
    if not search.allow_offload:
        helps.append("CPU offload")
    if smallest.settings.micro_batch_size == 1:
        helps.append(f"a shorter seq_len than {base.seq_len}")
    return (
        f"no layout fits on {search.world} x {hardware.name} devices: the smallest, "
        f"{smallest.describe()}, {smallest.reason}; would help: " + ", ".join(helps)
    )


def _gib(nbytes: float | None) -> str:
    """Bytes as GiB with one decimal, or "?" when unknown."""
    return "?" if nbytes is None else f"{nbytes / GIB:.1f}"
