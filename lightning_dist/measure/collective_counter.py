"""Counting a rank's collectives: each c10d call (eager or functional) under a dispatch mode,
by the mesh dimension of its process group, as bytes per rank by the caller's ring rule
(`planner.traffic.ring_volume`). The dry run (`measure/fake_rank.py`) counts with it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from lightning_dist._compat import dispatch_mode_class

COLLECTIVE_NAMESPACES = ("c10d", "_c10d_functional")


@dataclass
class Traffic:
    """Collectives of one rank by mesh dimension: calls and ring volume in bytes."""

    calls: dict[str, int] = field(default_factory=dict)
    volume: dict[str, float] = field(default_factory=dict)

    def add(self, dim: str, volume: float, calls: int = 1) -> None:
        self.calls[dim] = self.calls.get(dim, 0) + calls
        self.volume[dim] = self.volume.get(dim, 0.0) + volume

    def combined(self, other: Traffic, times: float = 1.0) -> Traffic:
        """This traffic plus `times` x `other`."""
        out = Traffic()
        for src, k in ((self, 1.0), (other, times)):
            for dim, volume in src.volume.items():
                out.add(dim, k * volume, round(k * src.calls[dim]))
        return out


def _kind(op_name: str) -> str | None:
    name = op_name.split("::")[-1]
    for key, kind in (
        ("gather", "all_gather"),
        ("reduce_scatter", "reduce_scatter"),
        ("allreduce", "all_reduce"),
        ("all_reduce", "all_reduce"),
        ("all_to_all", "all_to_all"),
        ("alltoall", "all_to_all"),
        ("broadcast", "broadcast"),
        ("send", "send"),
    ):
        if key in name:
            return kind
    return None  # recv, barrier, wait_tensor: nothing sent


def tensor_bytes(value) -> int:
    """Bytes of a tensor, or of the tensors in a (nested) list or tuple; 0 for anything else."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, list | tuple):
        return sum(tensor_bytes(v) for v in value)
    return 0


class CollectiveCounter(dispatch_mode_class()):  # type: ignore[misc]  # from _compat, dynamic
    """Counts every c10d collective by the mesh dimension of its group (`dims`: group name ->
    (dimension, group size)); groups outside the mesh count as 'other'."""

    def __init__(
        self, dims: dict[str, tuple[str, int]], ring_volume: Callable[[str, float, int], float]
    ):
        super().__init__()
        self.dims = dims
        self.ring_volume = ring_volume
        self.traffic = Traffic()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace in COLLECTIVE_NAMESPACES:
            self._count(func, args)
        return func(*args, **(kwargs or {}))

    def _count(self, func, args) -> None:
        kind = _kind(func.name())
        if kind is None:
            return
        group = None
        for arg in args:
            if isinstance(arg, str) and arg in self.dims:
                group = arg
            elif isinstance(arg, torch.ScriptObject):
                with contextlib.suppress(RuntimeError):  # a ReduceOp, not a group
                    group = torch.distributed.ProcessGroup.unbox(arg).group_name
        dim, n = self.dims.get(group or "", ("other", 0))  # no group found: "other"
        sizes = [tensor_bytes(a) for a in args]
        full = max(sizes)  # the gathered output, the scattered input, the reduced tensor
        if func.namespace == "_c10d_functional" and kind == "all_gather":
            full *= n  # the functional op takes the shard and returns the gathered tensor
        if kind == "all_reduce" and func.namespace == "c10d":
            full = sizes[0]  # allreduce_(tensors, ...)
        self.traffic.add(dim, self.ring_volume(kind, full, n) if n else full)
