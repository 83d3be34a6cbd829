"""Gradient clipping by the global norm, whatever mix of shards and replicas a rank holds.

Under 3D parallelism one rank holds a pipeline stage's parameters, some split over tensor- and
data-parallel ranks (DTensors with Shard placements), some replicated (plain tensors or
Replicate placements). Clipping each rank by its own norm would change the update; the norm must
be that of the whole model's gradient, as on a single device.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor


def copies_of(tensor: torch.Tensor, stage_size: int) -> int:
    """How many of the `stage_size` ranks that hold one pipeline stage hold the same local piece
    of `tensor` (a parameter or its gradient): all of them for a plain tensor, fewer for a
    DTensor split over some of them."""
    if not isinstance(tensor, DTensor):
        return stage_size
    mesh = tensor.device_mesh
    # Any placement but Replicate splits the tensor (Shard, and FSDP2's _StridedShard over TP,
    # whose is_shard() is False); gradients are never Partial here.
    pieces = math.prod(
        mesh.size(i) for i, p in enumerate(tensor.placements) if not p.is_replicate()
    )
    return stage_size // pieces


def _local_and_copies(grad: torch.Tensor, stage_size: int) -> tuple[torch.Tensor, int]:
    """The rank's local piece of `grad` and how many ranks of its stage hold the same piece."""
    local = grad.to_local() if isinstance(grad, DTensor) else grad
    return local, copies_of(grad, stage_size)


@torch.no_grad()
def clip_grad_norm_global(
    parameters: Iterable[torch.Tensor], max_norm: float, *, stage_size: int, group=None
) -> torch.Tensor:
    """Scale gradients in place so that the global L2 norm is at most `max_norm`; return it.

    `stage_size` is the number of ranks that hold one pipeline stage (dp x tp). Each rank sums
    the squares of its local pieces, each divided by the number of ranks holding that same
    piece; one all-reduce over `group` (default: the world) then gives the squared norm of the
    whole model. The scale is torch's: max_norm / (norm + 1e-6), capped at 1.
    """
    grads = [p.grad for p in parameters if p.grad is not None]
    device = grads[0].device if grads else torch.device("cpu")
    squares = torch.zeros((), dtype=torch.float32, device=device)
    locals_ = []
    for grad in grads:
        local, copies = _local_and_copies(grad, stage_size)
        locals_.append(local)
        squares += local.float().pow(2).sum() / copies
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(squares, group=group)
    norm = squares.sqrt()
    scale = (max_norm / (norm + 1e-6)).clamp(max=1.0)
    if locals_:
        scale = scale.to(locals_[0].device)
        for local in locals_:
            local.mul_(scale)
    return norm
