"""lightning_dist: train large transformer language models across many accelerators from the
PyTorch Lightning Trainer — tuned FSDP, 3D parallelism, a pre-flight planner and telemetry."""

__version__ = "0.1.0"
