"""Pre-flight planner: what fits and what runs fastest, as plain functions over the model args,
the hardware spec and a layout.

Nothing here imports torch, torch.distributed or Lightning, so it answers on a laptop.
"""

from lightning_dist.planner.estimate import Candidate, NoLayoutFitsError, estimate
from lightning_dist.planner.labels import describe
from lightning_dist.planner.layout_checks import check_layout
from lightning_dist.planner.memory import MemoryBreakdown, memory_per_device
from lightning_dist.planner.search import PlanResult, plan_layouts
from lightning_dist.planner.settings import TrainSettings, state_bytes
from lightning_dist.planner.timing import StepTime, bubble_fraction, step_time
from lightning_dist.planner.traffic import (
    allgather_volume,
    allreduce_volume,
    reduce_scatter_volume,
)

__all__ = [
    "Candidate",
    "MemoryBreakdown",
    "NoLayoutFitsError",
    "PlanResult",
    "StepTime",
    "TrainSettings",
    "allgather_volume",
    "allreduce_volume",
    "bubble_fraction",
    "check_layout",
    "describe",
    "estimate",
    "memory_per_device",
    "plan_layouts",
    "reduce_scatter_volume",
    "state_bytes",
    "step_time",
]
