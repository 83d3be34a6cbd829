"""Telemetry callbacks: progress, throughput and the per-run statistics behind summary.json."""

from lightning_dist.callbacks.progress import PlainProgress, progress_bar
from lightning_dist.callbacks.run_stats import RunStats

__all__ = ["PlainProgress", "RunStats", "progress_bar"]
