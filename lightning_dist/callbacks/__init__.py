"""Telemetry callbacks: progress, throughput/MFU, communication vs compute, the pipeline
bubble and stragglers, and the per-run statistics behind summary.json."""

from lightning_dist.callbacks.comm import CommComputeMonitor
from lightning_dist.callbacks.context import RunContext
from lightning_dist.callbacks.progress import PlainProgress, progress_bar
from lightning_dist.callbacks.run_stats import RunStats
from lightning_dist.callbacks.throughput import ThroughputMonitor

__all__ = [
    "CommComputeMonitor",
    "PlainProgress",
    "RunContext",
    "RunStats",
    "ThroughputMonitor",
    "progress_bar",
]
