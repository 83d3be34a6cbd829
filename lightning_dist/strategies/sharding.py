"""Checks and helpers shared by the FSDP1 (`fsdp_tuned`) and FSDP2 (`fsdp2`) strategies.

Each check raises ValueError naming the bad value and the fix. `train()` runs them before the
Trainer starts (one `error:` line on every rank); plain Lightning users hit the same checks in
the strategy's `setup_environment`/`setup`, also on every rank before step 1.
"""

from __future__ import annotations

import torch
from torch import nn

from lightning_dist.parallel.activation_checkpoint import parse_activation_checkpointing
from lightning_dist.parallel.fsdp import find_block_types

STATE_DICT_TYPES = ("sharded", "full")


def check_state_dict_type(value: str) -> str:
    if value not in STATE_DICT_TYPES:
        raise ValueError(
            f"strategy.state_dict_type={value!r} is not one of {', '.join(STATE_DICT_TYPES)}"
        )
    return value


def check_auto_wrap(model: nn.Module, auto_wrap) -> tuple[type[nn.Module], ...]:
    """The block classes to wrap; raises ValueError listing the model's blocks if one is absent."""
    return find_block_types(model, auto_wrap)


def check_activation_checkpointing(value: int | str) -> int | str:
    """`value` unchanged if it is a valid setting (see `parse_activation_checkpointing`)."""
    parse_activation_checkpointing(value, "strategy.activation_checkpointing")
    return value


def move_metrics(module: nn.Module, device: torch.device) -> None:
    """Move torchmetrics states, which FSDP does not move (they are not parameters)."""
    from torchmetrics import Metric

    for metric in (m for m in module.modules() if isinstance(m, Metric)):
        metric.to(device)
