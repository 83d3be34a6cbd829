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
    from lightning.fabric.strategies.model_parallel import _distributed_checkpoint_load
    from lightning.fabric.utilities.load import _METADATA_FILENAME
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    model_state = {"state_dict": get_model_state_dict(model)}
    _distributed_checkpoint_load(model_state, path)
    model.load_state_dict(model_state["state_dict"], strict=strict)
    for i, optimizer in enumerate(optimizers):
        key = f"optimizer_{i}"
        state = {key: get_optimizer_state_dict(model, optimizer, options=flat_options())}
        _distributed_checkpoint_load(state, path)
        set_optimizer_state_dict(model, optimizer, state[key], options=flat_options())
    return torch.load(path / _METADATA_FILENAME, weights_only=weights_only)
