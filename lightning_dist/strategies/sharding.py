"""Checks and helpers shared by the FSDP1 (`fsdp_tuned`) and FSDP2 (`fsdp2`) strategies, and
ZeRO-1's (`strategy.shard_optimizer`) clipping and summary under `ddp` and the mesh strategies.

Each check raises ValueError naming the bad value and the fix. `train()` runs them before the
Trainer starts (one `error:` line on every rank); plain Lightning users hit the same checks in
the strategy's `setup_environment`/`setup`, also on every rank before step 1.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from lightning_dist._compat import plain_optimizer
from lightning_dist.parallel.fsdp import find_block_types
from lightning_dist.parallel.sharded_optimizer import ShardedOptimizer


def check_auto_wrap(model: nn.Module, auto_wrap) -> tuple[type[nn.Module], ...]:
    """The block classes to wrap; raises ValueError listing the model's blocks if one is absent."""
    return find_block_types(model, auto_wrap)


def move_metrics(module: nn.Module, device: torch.device) -> None:
    """Move torchmetrics states, which FSDP does not move (they are not parameters)."""
    from torchmetrics import Metric

    for metric in (m for m in module.modules() if isinstance(m, Metric)):
        metric.to(device)


def sharding_summary(optimizers: list[Any]) -> dict[str, Any]:
    """summary.json's `shard_optimizer` entry under ZeRO-1: the replicas the states are sharded
    over and the bytes of per-element states this rank holds; {} without it."""
    sharded = [o for o in optimizers if isinstance(o, ShardedOptimizer)]
    if not sharded:
        return {}
    return {
        "shard_optimizer": {
            "replicas": sharded[0].dp_size,
            "state_bytes_per_rank": sum(o.local_state_bytes() for o in sharded),
        }
    }


def clip_sharded_gradients(plugin: Any, *, stage_size: int) -> None:
    """Make `plugin` (a Lightning precision plugin) clip a ZeRO-1 optimizer's gradients through
    it: its reduced slices by the whole model's norm (`ShardedOptimizer.clip_grad_norm_`) or by
    value, since `param.grad` holds this rank's unreduced gradient there. Other optimizers
    keep the plugin's own clipping. For this plugin instance only, as the mesh strategies'
    global-norm clipping is set."""

    def through_zero1(own: Any, sharded: Any) -> Any:
        # Manual optimization hands the plugin Lightning's wrapper of the optimizer: its own
        # attributes are not the optimizer's, so the reduction is asked of the optimizer itself.
        def clip(optimizer: Any, clip_val: float) -> None:
            inner = plain_optimizer(optimizer)
            if isinstance(inner, ShardedOptimizer) and inner.reduces_gradients:
                sharded(inner, clip_val)
            else:
                own(optimizer, clip_val)

        return clip

    plugin.clip_grad_by_norm = through_zero1(
        plugin.clip_grad_by_norm, lambda o, v: o.clip_grad_norm_(v, stage_size=stage_size)
    )
    plugin.clip_grad_by_value = through_zero1(
        plugin.clip_grad_by_value, lambda o, v: o.clip_grad_value_(v)
    )
