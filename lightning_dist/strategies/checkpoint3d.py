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


def flat_options():
    """StateDictOptions with the optimizer state flattened to one key per parameter."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(flatten_optimizer_state_dict=True, cpu_offload=True)


def flat_optimizer_state(model: nn.Module, optimizer) -> dict[str, Any]:
    """This rank's optimizer state, keyed by parameter name."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    optimizer = getattr(optimizer, "_optimizer", optimizer)  # a LightningOptimizer
    return get_optimizer_state_dict(model, optimizer, options=flat_options())


def load_sharded(
    model: nn.Module, optimizers: list, path: Path, *, strict: bool, weights_only: bool | None
) -> dict[str, Any]:
    """Load model and optimizer states saved by the same layout; return Lightning's metadata
    (loops, schedulers, callbacks) from the checkpoint folder."""
    from torch.distributed.checkpoint import load
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    model_state = {"state_dict": get_model_state_dict(model)}
    load(model_state, checkpoint_id=path)
    model.load_state_dict(model_state["state_dict"], strict=strict)
    for i, optimizer in enumerate(optimizers):
        key = f"optimizer_{i}"
        state = {key: get_optimizer_state_dict(model, optimizer, options=flat_options())}
        load(state, checkpoint_id=path)
        set_optimizer_state_dict(model, optimizer, state[key], options=flat_options())
    return torch.load(path / LIGHTNING_CHECKPOINT_METADATA, weights_only=weights_only)


def is_sharded_checkpoint(path: Path) -> bool:
    """A folder of DCP shards with Lightning's metadata file beside them."""
    return path.is_dir() and (path / LIGHTNING_CHECKPOINT_METADATA).is_file()
