"""Telemetry callbacks: progress, throughput/MFU, communication vs compute, the pipeline
bubble and stragglers, and the per-run statistics behind summary.json."""

from lightning_dist.callbacks.comm import CommComputeMonitor
from lightning_dist.callbacks.context import RunContext, StepClock, step_clock
from lightning_dist.callbacks.progress import PlainProgress, progress_bar
from lightning_dist.callbacks.run_stats import RunStats
from lightning_dist.callbacks.throughput import ThroughputMFU

__all__ = [
    "CommComputeMonitor",
    "PlainProgress",
    "RunContext",
    "RunStats",
    "StepClock",
    "ThroughputMFU",
    "progress_bar",
    "step_clock",
]
