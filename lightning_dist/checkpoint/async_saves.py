"""Checkpoints written in the background (DCP `async_save`), in the one format."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from lightning_dist.checkpoint.format import finish_folder, flatten


class AsyncSaves:
    """Sharded saves written by a background thread (DCP `async_save`) while training goes on.

    `save` stages the state to host memory and returns; the files are written behind. The next
    `save` and `wait` (at the end of training) first wait for the previous write; all ranks then
    agree (one all-reduce) whether every rank's writer succeeded, so a failure stops every rank
    with one message. Lightning's `meta.pt` and then `manifest.json`, the file that makes a
    checkpoint folder complete for `trainer.resume=auto`, are written only then, so an
    unfinished save never looks complete.
    The writes use their own gloo process group, never the training one.
    """

    def __init__(self) -> None:
        self._group = None
        self._pending: tuple | None = None

    def save(
        self,
        state: dict[str, Any],
        path: Path,
        metadata: dict[str, Any],
        fields: dict[str, Any],
        *,
        rank0: bool,
    ) -> None:
        """Start writing `state` (from `format.gather_state`) into the empty folder `path`."""
        import torch.distributed as dist
        from torch.distributed.checkpoint import async_save

        self.wait()
        if self._group is None:
            self._group = dist.new_group(backend="gloo")
        from lightning_dist.checkpoint.pieces import PiecewiseSavePlanner

        future = async_save(
            flatten(state),
            checkpoint_id=str(path),
            process_group=self._group,
            planner=PiecewiseSavePlanner(),
        )
        self._pending = (future, path, metadata, fields, rank0)

    def wait(self) -> None:
        """Finish the pending save (if any) on every rank; raise on every rank if one failed."""
        import torch.distributed as dist

        if self._pending is None:
            return
        future, path, metadata, fields, rank0 = self._pending
        self._pending = None
        error = None
        try:
            future.result()
        except Exception as e:  # reported on every rank below
            error = e
        failed = torch.tensor([float(error is not None)])
        dist.all_reduce(failed, op=dist.ReduceOp.MAX, group=self._group)
        if failed.item():
            mine = f": {type(error).__name__}: {error}" if error else " on another rank"
            raise RuntimeError(f"the asynchronous checkpoint {path} failed{mine}")
        if rank0:
            finish_folder(path, metadata, fields)
