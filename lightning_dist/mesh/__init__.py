"""The mesh runtime: one `Layout` and its options applied to a model, with no Lightning.

`MeshRuntime` builds the device mesh, parallelizes and materialises the model (through
`lightning_dist.parallel`), runs one pipeline-aware training step (schedule, gradient
accumulation, clipping by the global norm, the loss's reductions) and owns the model's
checkpoint state in the one format of every strategy (`lightning_dist.checkpoint.format`).
A plain PyTorch loop drives it (examples/mesh_runtime_loop.py); the Lightning strategies
forward to it.
"""

from lightning_dist.mesh.reductions import mean_over_ranks, sum_over_ranks
from lightning_dist.mesh.runtime import MeshRuntime, MicroBatch

__all__ = ["MeshRuntime", "MicroBatch", "mean_over_ranks", "sum_over_ranks"]
