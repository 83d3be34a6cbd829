"""Checks and helpers shared by the FSDP1 (`fsdp_tuned`) and FSDP2 (`fsdp2`) strategies.

Each check raises ValueError naming the bad value and the fix. `train()` runs them before the
Trainer starts (one `error:` line on every rank); plain Lightning users hit the same checks in
the strategy's `setup_environment`/`setup`, also on every rank before step 1.
"""

from __future__ import annotations

import torch
from torch import nn

from lightning_dist.parallel.fsdp import find_block_types


def check_auto_wrap(model: nn.Module, auto_wrap) -> tuple[type[nn.Module], ...]:
    """The block classes to wrap; raises ValueError listing the model's blocks if one is absent."""
    return find_block_types(model, auto_wrap)


def move_metrics(module: nn.Module, device: torch.device) -> None:
    """Move torchmetrics states, which FSDP does not move (they are not parameters)."""
    from torchmetrics import Metric

    for metric in (m for m in module.modules() if isinstance(m, Metric)):
        metric.to(device)
