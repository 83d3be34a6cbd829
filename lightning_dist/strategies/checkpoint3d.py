"""Sharded checkpoints (torch.distributed.checkpoint) for layouts with pipeline stages.

Lightning's ModelParallelStrategy saves the optimizer state with its `param_groups` as one object
under one key. DCP writes such an object once for all ranks, which is right when every rank holds
every parameter name, but pipeline ranks hold different ones: on load each would get the first
stage's groups. Flattening the state (one key per parameter and setting) gives every rank its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from lightning_dist._compat import LIGHTNING_CHECKPOINT_METADATA
from lightning_dist.checkpoint.safe import load


def flat_options():
    """StateDictOptions with the optimizer state flattened to one key per parameter."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(flatten_optimizer_state_dict=True, cpu_offload=True)


def flat_optimizer_state(model: nn.Module, optimizer) -> dict[str, Any]:
    """This rank's optimizer state, keyed by parameter name."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    optimizer = getattr(optimizer, "_optimizer", optimizer)  # a LightningOptimizer
    return get_optimizer_state_dict(model, optimizer, options=flat_options())


def load_sharded(model: nn.Module, optimizers: list, path: Path, *, strict: bool) -> dict[str, Any]:
    """Load model and optimizer states saved by the same layout; return Lightning's metadata
    (loops, schedulers, callbacks) from the checkpoint folder."""
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    model_state = {"state_dict": get_model_state_dict(model)}
    load(model_state, path)
    model.load_state_dict(model_state["state_dict"], strict=strict)
    for i, optimizer in enumerate(optimizers):
        key = f"optimizer_{i}"
        state = {key: get_optimizer_state_dict(model, optimizer, options=flat_options())}
        load(state, path)
        set_optimizer_state_dict(model, optimizer, state[key], options=flat_options())
    # Never plain pickle, whatever the caller asks: the file holds only loop and callback state.
    return torch.load(path / LIGHTNING_CHECKPOINT_METADATA, weights_only=True)


def is_sharded_checkpoint(path: Path) -> bool:
    """A folder of DCP shards with Lightning's metadata file beside them."""
    return path.is_dir() and (path / LIGHTNING_CHECKPOINT_METADATA).is_file()


class AsyncSaves:
    """Sharded saves written by a background thread (DCP `async_save`) while training goes on.

    `save` stages the state to host memory and returns; the files are written behind. The next
    `save` and `wait` (at the end of training) first wait for the previous write; all ranks then
    agree (one all-reduce) whether every rank's writer succeeded, so a failure stops every rank
    with one message. Lightning's `meta.pt`, the file that makes a checkpoint folder complete
    for `trainer.resume=auto`, is written only then, so an unfinished save never looks complete.
    The writes use their own gloo process group, never the training one.
    """

    def __init__(self) -> None:
        self._group = None
        self._pending: tuple[Any, Path, dict[str, Any], bool] | None = None

    def save(self, state: dict[str, Any], path: Path, metadata: dict[str, Any], rank0: bool):
        import torch.distributed as dist
        from torch.distributed.checkpoint import async_save

        self.wait()
        if self._group is None:
            self._group = dist.new_group(backend="gloo")
        future = async_save(state, checkpoint_id=path, process_group=self._group)
        self._pending = (future, path, metadata, rank0)

    def wait(self) -> None:
        """Finish the pending save (if any) on every rank; raise on every rank if one failed."""
        import torch.distributed as dist

        if self._pending is None:
            return
        future, path, metadata, rank0 = self._pending
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
            torch.save(metadata, path / LIGHTNING_CHECKPOINT_METADATA)
