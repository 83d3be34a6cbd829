"""The fixed inputs of one search, read by `search.py` and by `no_fit.py` when nothing fits.

Its own module so that neither of those two imports the other for it.
"""

from __future__ import annotations

from dataclasses import dataclass

from lightning_dist.options.activation_checkpointing import CheckpointChoice
from lightning_dist.planner.settings import TrainSettings


@dataclass(frozen=True, kw_only=True)
class SearchInputs:
    """The fixed inputs of one `plan_layouts` call, shared by its steps."""

    model: object
    hardware: object
    expert_parallel: bool = True
    """May the search split experts (`ep`)? Only for our MoE layers (a Hugging Face mixture of
    experts has none of their seams: `parallel/expert_parallel.check_expert_parallel`)."""
    base: TrainSettings
    """The settings every variant starts from (no micro-batch, FSDP mode, AC or offload yet)."""
    per_node: int
    world: int
    ac_options: tuple[CheckpointChoice, ...]
    allow_offload: bool
    sharding_modes: tuple[str, ...]
    schedules: tuple[str, ...]
    micro_batch_sizes: tuple[int, ...] | None
    efficiency: float | None
    overlap: float
    headroom: float
    compile_speedup: float | None
