"""Sequence parallelism's entry into a column-parallel sub-block, keeping only the shard.

Under sequence parallelism the residual stream is split along the sequence, and the input of a
sub-block (attention, MLP) is all-gathered before its column-parallel projections. Those
projections save their input for backward, so each rank would keep the gathered, full-sequence
tensor: tp times what it needs. `GatherSequenceInput` gathers the input as torch's
`PrepareModuleInput` would, but while the sub-block runs forward a saved-tensor hook replaces
every saved view of the gathered tensor by a reference to the local shard. In backward the
first unpack gathers it again (once for all the projections that share it), as Megatron-LM
does (Korthikanti et al. 2022, Sec. 4.2.2).

Inside activation checkpointing nothing of the sub-block is saved anyway, so no hooks are added
there. Under autocast the shard is cast before the gather, so the projections find their input
already in the autocast dtype and make no copies of their own (the values are the same: a
cast commutes with a gather), and the gather moves half the bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import ParallelStyle

from lightning_dist._compat import ParallelStyleHook, saved_tensors_hooks_active


class _Shard:
    """The local shard a gathered input came from, and that input once gathered again."""

    def __init__(self, shard: DTensor) -> None:
        self.shard = shard.detach()
        self.full: torch.Tensor | None = None

    def gathered(self) -> torch.Tensor:
        if self.full is None:  # freed with this object, after the last projection's backward
            self.full = self.shard.redistribute(placements=[Replicate()]).to_local()
        return self.full


@dataclass(frozen=True)
class _SavedView:
    """A saved tensor that was a view of the gathered input: how to rebuild it."""

    source: _Shard
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    dtensor: tuple | None
    """(mesh, placements, shape, stride) when the saved tensor was a DTensor."""

    def rebuild(self) -> torch.Tensor:
        local = self.source.gathered().as_strided(self.size, self.stride, self.offset)
        if self.dtensor is None:
            return local
        mesh, placements, shape, stride = self.dtensor
        return DTensor.from_local(
            local, mesh, placements, run_check=False, shape=shape, stride=stride
        )


class GatherSequenceInput(ParallelStyleHook, ParallelStyle):
    """Gather a sub-block's first input from sequence shards (dim 1) and save only the shard.

    The other positional inputs (rotary tables, masks) pass through untouched. The sub-block
    receives a replicated DTensor, as with `PrepareModuleInput(Shard(1) -> Replicate())`.
    """

    def apply_to(self, module: nn.Module, device_mesh) -> nn.Module:
        module.register_forward_pre_hook(lambda mod, args: _enter(mod, args, device_mesh))
        module.register_forward_hook(lambda mod, args, out: _exit(mod), always_call=True)
        return module


def _enter(module: nn.Module, args: tuple, mesh) -> tuple:
    x, rest = args[0], args[1:]
    if not isinstance(x, DTensor):
        x = DTensor.from_local(x, mesh, [Shard(1)], run_check=False)
    device = x.device.type
    if torch.is_autocast_enabled(device):
        x = x.to(torch.get_autocast_dtype(device))
    full = x.redistribute(placements=[Replicate()])
    hooks = None
    # Inside activation checkpointing (or offload) the outer hooks already decide what is kept.
    if (
        torch.is_grad_enabled()
        and not saved_tensors_hooks_active()
        and full.to_local().is_contiguous()
    ):
        hooks = torch.autograd.graph.saved_tensors_hooks(*_pack_unpack(x, full))
        hooks.__enter__()
    module.__dict__.setdefault("_sp_saved_hooks", []).append(hooks)
    return (full, *rest)


def _exit(module: nn.Module) -> None:
    stack = module.__dict__.get("_sp_saved_hooks")
    hooks = stack.pop() if stack else None
    if hooks is not None:
        hooks.__exit__(None, None, None)


def _pack_unpack(shard: DTensor, full: DTensor):
    source = _Shard(shard)
    storage = full.to_local().untyped_storage()
    pointer, nbytes = storage.data_ptr(), storage.nbytes()

    def pack(t: torch.Tensor):
        with torch.no_grad():
            local = t.to_local() if isinstance(t, DTensor) else t
        s = local.untyped_storage()
        if s.data_ptr() != pointer or s.nbytes() != nbytes:
            return t
        meta = (
            (t.device_mesh, t.placements, t.shape, t.stride()) if isinstance(t, DTensor) else None
        )
        return _SavedView(
            source, tuple(local.shape), tuple(local.stride()), local.storage_offset(), meta
        )

    def unpack(saved):
        return saved.rebuild() if isinstance(saved, _SavedView) else saved

    return pack, unpack
