"""ZeRO-1's gradient reduction: each replica's gradients reduce-scattered into the slice of the
flat parameter space it owns (`parallel/sharded_optimizer.py`), as Megatron's distributed
optimizer and DeepSpeed's ZeRO-1/2 reduce them, instead of DDP's all-reduce.

A step then moves a reduce-scatter of the gradients and an all-gather of the parameters: the
bytes of one all-reduce (which is a reduce-scatter and an all-gather), where an all-reduce
followed by the all-gather would move half as much again. The strategies leave the gradients
local for it: DDP through a communication hook that sends nothing (`cluster/grad_sync.py`),
the mesh strategies by running FSDP2 over dp_shard alone, not over dp_replicate
(`parallel/parallelize.dp_mesh`).

The flat space of a parameter group is laid out as in `sharded_optimizer`: its parameters'
local elements end to end, `chunk` elements per rank, the last rank's slice padded. No
Lightning import here.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from lightning_dist._compat import reduce_scatter_single

REDUCE_ELEMENTS = 1 << 25
"""Elements one reduce-scatter takes in (all ranks' pieces together): 128 MiB of fp32, the most
the reduction holds beside the gradients and the reduced slice, as the step's all-gather
(`sharded_optimizer.GATHER_ELEMENTS`)."""


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's piece of `tensor`: a DTensor's local shard, else the tensor itself."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


Overlap = tuple[torch.Tensor, tuple[int, int], tuple[int, int]]
"""(parameter, [a, b) in its flattened local elements, [s, t) in the range asked for)."""


def overlaps(
    params: Sequence[torch.Tensor], offsets: Sequence[int], lo: int, hi: int
) -> Iterator[Overlap]:
    """Every parameter of a group's flat space (its local elements from `offsets[i]` on) that
    overlaps the elements [lo, hi), with the overlap in both index spaces."""
    for param, offset in zip(params, offsets, strict=True):
        a, b = max(lo, offset), min(hi, offset + local_tensor(param).numel())
        if a < b:
            yield param, (a - offset, b - offset), (a - lo, b - lo)


def read_gradients(
    params: Sequence[torch.Tensor], offsets: Sequence[int], lo: int, out: torch.Tensor
) -> None:
    """Copy the gradient elements [lo, lo + len(out)) of a group's flat space into `out`, which
    holds zeros where a parameter has no gradient and past the last parameter (the padding)."""
    for param, (a, b), (s, t) in overlaps(params, offsets, lo, lo + out.numel()):
        if param.grad is not None:
            out[s:t] = local_tensor(param.grad).reshape(-1)[a:b]


@torch.no_grad()
def reduce_scatter_mean(
    params: Sequence[torch.Tensor],
    offsets: Sequence[int],
    out: torch.Tensor,
    *,
    group=None,
) -> torch.Tensor:
    """`out` (this rank's slice of the flat space, `chunk` elements) set to the mean over the
    ranks of `group` of their gradients of it: reduce-scatters of at most `REDUCE_ELEMENTS`
    (each rank's piece of each slice at a time), summed then divided by the rank count, as DDP
    averages. A collective: every rank of `group` calls it with the same layout."""
    dp = dist.get_world_size(group)
    chunk = out.numel()
    length = max(1, REDUCE_ELEMENTS // dp)
    for i in range(0, chunk, length):
        n = min(chunk, i + length) - i
        pieces = out.new_zeros(dp * n)
        for rank in range(dp):
            read_gradients(params, offsets, rank * chunk + i, pieces[rank * n : (rank + 1) * n])
        reduce_scatter_single(out[i : i + n], pieces, group=group)
    return out.div_(dp)


def write_parameters(
    params: Sequence[torch.Tensor], offsets: Sequence[int], lo: int, values: torch.Tensor
) -> None:
    """Write `values`, elements [lo, lo + len) of a group's flat space, into its parameters
    (the padding past the last one is dropped)."""
    for param, (a, b), (s, t) in overlaps(params, offsets, lo, lo + values.numel()):
        local_tensor(param).view(-1)[a:b].copy_(values[s:t])


@torch.no_grad()
def clip_by_norm_(
    grads: Sequence[torch.Tensor],
    pieces: Iterable[tuple[torch.Tensor, int]],
    max_norm: float,
    device: torch.device,
) -> torch.Tensor:
    """Scale the reduced slices `grads` so that the whole model's gradient norm is at most
    `max_norm` (torch's scale: max_norm / (norm + 1e-6), capped at 1); return the norm. Its
    square is summed over this rank's owned `pieces` (`(values, copies)`: `copies` ranks beyond
    the replicas hold the same piece, tensor-parallel peers of a replicated norm weight), then
    one scalar all-reduce over the world adds the other ranks' (pipeline stages, tp ranks)."""
    squares = torch.zeros((), dtype=torch.float32, device=device)
    for values, copies in pieces:
        squares += values.float().pow(2).sum() / copies
    if dist.is_initialized():
        dist.all_reduce(squares)
    norm = squares.sqrt()
    scale = (max_norm / (norm + 1e-6)).clamp(max=1.0)
    for grad in grads:
        grad.mul_(scale.to(grad.device))
    return norm
