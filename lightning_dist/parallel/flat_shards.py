"""The flat index space ZeRO-1 shards (`parallel/sharded_optimizer.py`): one parameter group's
parameters (this rank's local pieces: `to_local()` of a DTensor split by tensor parallelism)
end to end, N elements, padded to a multiple of the data-parallel ranks; rank r owns
[r * chunk, (r + 1) * chunk), chunk = ceil(N / dp). Here: the slice bounds, the group laid flat, and the mapping between a flat
range and each parameter's elements. No collective and no Lightning import here.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from lightning_dist.parallel.gradient_reduction import Overlap, local_tensor, overlaps


def shard_bounds(numel: int, dp: int, rank: int) -> tuple[int, int]:
    """[start, stop) of rank `rank`'s slice of a flat space of `numel` elements over `dp` ranks:
    ceil(numel / dp) elements each, the last shard padded (its padding lies past `numel`)."""
    chunk = -(-numel // dp)
    return rank * chunk, (rank + 1) * chunk


@dataclass
class FlatGroup:
    """One parameter group laid flat: its parameters' offsets and this rank's slice (`shard`,
    the tensor the wrapped optimizer steps)."""

    group: dict[str, Any]
    params: list[torch.Tensor]
    offsets: list[int]
    start: int
    stop: int
    shard: torch.Tensor

    def pieces(self) -> Iterator[Overlap]:
        """Every parameter that overlaps this rank's slice: (parameter, [a, b) in its flattened
        local elements, [s, t) in the shard)."""
        return overlaps(self.params, self.offsets, self.start, self.stop)

    def pieces_with(self, entries: list[Any]) -> Iterator[tuple[Overlap, Any]]:
        """`pieces()` beside each parameter's entry of `entries` (in the group's order), for
        the parameters that have one: a parameter without saved state keeps zeros, as a fresh
        optimizer's."""
        by_param = dict(zip(map(id, self.params), entries, strict=True))
        for piece in self.pieces():
            entry = by_param[id(piece[0])]
            if entry:
                yield piece, entry


def lay_flat(
    group: dict[str, Any], dp: int, rank: int, empty_kind: tuple[torch.dtype, torch.device]
) -> FlatGroup:
    """`group` laid flat over `dp` ranks, this rank's shard zeroed in the parameters' dtype and
    device (`empty_kind` for a group without parameters). Raises ValueError (the fix named) for
    a non-contiguous parameter, which the step could not write in place, or a group that mixes
    dtypes or devices."""
    params = list(group["params"])
    if not all(local_tensor(p).is_contiguous() for p in params):
        raise ValueError(
            "strategy.shard_optimizer=true writes parameters in place and needs them "
            "contiguous; make the model's parameters contiguous, or set "
            "strategy.shard_optimizer=false"
        )
    kinds = {(local_tensor(p).dtype, local_tensor(p).device) for p in params}
    if len(kinds) > 1:
        raise ValueError(
            f"strategy.shard_optimizer=true needs one dtype and device per parameter group, "
            f"got {sorted(map(str, kinds))} in one group; give each dtype its own group in "
            "configure_optimizers, or set strategy.shard_optimizer=false"
        )
    offsets, numel = [], 0
    for param in params:
        offsets.append(numel)
        numel += local_tensor(param).numel()
    start, stop = shard_bounds(numel, dp, rank)
    dtype, device = kinds.pop() if kinds else empty_kind
    shard = torch.zeros(stop - start, dtype=dtype, device=device, requires_grad=True)
    return FlatGroup(group, params, offsets, start, stop, shard)


def piece_like(param: torch.Tensor, whole: torch.Tensor, offset: int) -> torch.Tensor:
    """The piece of a gathered flat state that belongs to `param`, shaped and placed like it."""
    local = local_tensor(param)
    piece = whole[offset : offset + local.numel()].view(local.shape).clone()
    if isinstance(param, DTensor):
        return DTensor.from_local(
            piece, param.device_mesh, param.placements, run_check=False,
            shape=param.shape, stride=param.stride(),
        )  # fmt: skip
    return piece
