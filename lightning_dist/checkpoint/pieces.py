"""DCP for DTensors whose local part is several blocks of the whole tensor, not one.

DCP describes a DTensor's local part as one chunk: its first global offset and its local shape.
That holds for `Shard` and for FSDP2's strided shard over TP, but not for a fused projection
split part by part (`"colwise_fused(n)"`, parallel/fused.py), seen as its single-device tensor:
rank r holds rows r of each of the n parts, n separate runs of rows (more under FSDP). DCP would refuse to save it ("overlapping chunks"), and a chunk
at the first offset would load the wrong rows.

The planners here write and read such a tensor as its runs, each a chunk at its own global
offset, read from and into views of the local tensor. The files therefore hold the
single-device tensor in its own order, like every other weight (docs/CHECKPOINTS.md), and any
layout, fused or not, reads it back. Every other value goes through DCP's default planners
unchanged. No collective: each rank works out its runs from the placements alone.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex
from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

from lightning_dist._compat import strided_shard_class

Pieces = dict[tuple[int, ...], tuple[tuple[int, ...], torch.Tensor]]
"""{global offsets: (sizes, view of the local tensor)} of one DTensor."""


def local_pieces(value: Any) -> Pieces | None:
    """The blocks of the whole tensor that this rank's part of `value` holds, when there are
    several (a DTensor with a strided placement); None when DCP's one chunk describes it."""
    strided = strided_shard_class()
    if not isinstance(value, DTensor) or not any(isinstance(p, strided) for p in value.placements):
        return None
    runs = [_runs(_global_index(value, dim).tolist()) for dim in range(value.ndim)]
    if all(len(r) <= 1 for r in runs):
        return None
    local = value.to_local()
    pieces: Pieces = {}
    for block in itertools.product(*runs):
        view = local
        for dim, (start, _, length) in enumerate(block):
            view = view.narrow(dim, start, length)
        offsets = tuple(first for _, first, _ in block)
        pieces[offsets] = (tuple(length for *_, length in block), view)
    return pieces


def _global_index(value: DTensor, dim: int) -> torch.Tensor:
    """The global index along `dim` of each of this rank's positions along it."""
    strided = strided_shard_class()
    placements = []
    for p in value.placements:
        if isinstance(p, strided) and p.dim == dim:
            placements.append(strided(0, split_factor=p.split_factor))
        elif isinstance(p, (Shard, strided)) and p.dim == dim:
            placements.append(Shard(0))
        else:
            placements.append(Replicate())
    # Each rank cuts its own part of the index (src_data_rank=None: nothing is sent).
    index = torch.arange(value.shape[dim])
    return distribute_tensor(index, value.device_mesh, placements, src_data_rank=None).to_local()


def _runs(index: list[int]) -> list[tuple[int, int, int]]:
    """(local start, global start, length) of each run of consecutive global indices."""
    runs: list[list[int]] = []
    for position, global_index in enumerate(index):
        if runs and global_index == runs[-1][1] + runs[-1][2]:
            runs[-1][2] += 1
        else:
            runs.append([position, global_index, 1])
    return [tuple(r) for r in runs]


class PiecewiseSavePlanner(DefaultSavePlanner):
    """DCP's default save planner; a DTensor held in several blocks is written block by block."""

    def create_local_plan(self):
        plan = super().create_local_plan()
        self._pieces: dict[str, Pieces] = {}
        items = []
        for item in plan.items:
            pieces = None
            if item.type == WriteItemType.SHARD:
                pieces = local_pieces(self.state_dict.get(item.index.fqn))
            if pieces is None:
                items.append(item)
                continue
            self._pieces[item.index.fqn] = pieces
            for offsets, (sizes, _) in pieces.items():
                chunk = ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=torch.Size(sizes))
                items.append(
                    WriteItem(
                        index=MetadataIndex(item.index.fqn, torch.Size(offsets)),
                        type=WriteItemType.SHARD,
                        tensor_data=TensorWriteData(
                            chunk=chunk,
                            properties=item.tensor_data.properties,
                            size=item.tensor_data.size,
                        ),
                    )
                )
        self.plan = dataclasses.replace(plan, items=items)
        return self.plan

    def lookup_object(self, index: MetadataIndex) -> Any:
        pieces = getattr(self, "_pieces", {}).get(index.fqn)
        if pieces is None:
            return super().lookup_object(index)
        return pieces[tuple(index.offset)][1]


class PiecewiseLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner; a DTensor held in several blocks is read block by block,
    into views of its local tensor."""

    def create_local_plan(self):
        from torch.distributed.checkpoint.default_planner import create_default_local_load_plan
        from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

        self._pieces = {}
        for fqn, value in self.state_dict.items():
            pieces = local_pieces(value)
            if pieces is not None:
                self._pieces[fqn] = pieces
        if not self._pieces:
            return super().create_local_plan()
        rest = {k: v for k, v in self.state_dict.items() if k not in self._pieces}
        plan = create_default_local_load_plan(rest, self.metadata, not self.allow_partial_load)
        items = list(plan.items)
        for fqn, pieces in self._pieces.items():
            saved = self.metadata.state_dict_metadata.get(fqn)
            if saved is None:
                if self.allow_partial_load:
                    continue
                raise RuntimeError(f"Missing key in checkpoint state_dict: {fqn}.")
            if tuple(saved.size) != tuple(self.state_dict[fqn].size()):
                raise ValueError(
                    f"Size mismatch between saved {saved.size} and current: "
                    f"{self.state_dict[fqn].size()} for {fqn}"
                )
            chunks = [
                ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=torch.Size(sizes))
                for offsets, (sizes, _) in pieces.items()
            ]
            items += create_read_items_for_chunk_list(fqn, saved, chunks)
        return dataclasses.replace(plan, items=items)

    def lookup_tensor(self, index: MetadataIndex) -> torch.Tensor:
        pieces = getattr(self, "_pieces", {}).get(index.fqn)
        if pieces is None:
            return super().lookup_tensor(index)
        return pieces[tuple(index.offset)][1]
