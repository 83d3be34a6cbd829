"""Activation checkpointing of blocks, whole or selective (op-level), as one function over a model.

Three choices, one setting (`strategy.activation_checkpointing`):

- `0` or `"none"`: off;
- `n` (an int) or `"full"` (= 1): every n-th block keeps only its input during forward and
  recomputes its activations in backward (activation memory of those blocks drops to about one
  tensor each, for roughly a third more compute);
- `"op"` (alias `"selective"`): every block is checkpointed, but the outputs of its matmuls,
  attention kernels and collectives are saved; only the cheap ops between them (norms,
  activations, RoPE, residual adds, casts) are recomputed. Most of full checkpointing's memory
  saving on pointwise tensors, for a few percent of recompute instead of a third.

The setting itself is parsed in `lightning_dist/options/activation_checkpointing.py` (no torch there,
so the planner shares it). No Lightning import here.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence

import torch
from torch import nn

from lightning_dist.options.activation_checkpointing import (  # noqa: F401 (re-exported)
    CheckpointChoice,
    parse_activation_checkpointing,
)
from lightning_dist.parallel.fsdp import block_modules

log = logging.getLogger(__name__)


def saved_ops() -> list:
    """The ops whose outputs op-level checkpointing keeps: matmuls, attention kernels and
    collectives (recomputing a collective would repeat its communication)."""
    aten = torch.ops.aten
    names = [
        (aten, "mm"), (aten, "addmm"), (aten, "bmm"), (aten, "baddbmm"),
        (aten, "_scaled_dot_product_flash_attention"),
        (aten, "_scaled_dot_product_flash_attention_for_cpu"),
        (aten, "_scaled_dot_product_efficient_attention"),
        (aten, "_scaled_dot_product_cudnn_attention"),
        (torch.ops._c10d_functional, "all_reduce"),
        (torch.ops._c10d_functional, "reduce_scatter_tensor"),
        (torch.ops._c10d_functional, "all_gather_into_tensor"),
        (torch.ops._c10d_functional, "all_to_all_single"),
    ]  # fmt: skip
    return [getattr(space, op).default for space, op in names if hasattr(space, op)]


def selective_context():
    """The `context_fn` of torch.utils.checkpoint for op-level checkpointing."""
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(saved_ops())


def apply_activation_checkpointing(
    model: nn.Module,
    block_types: Sequence[type[nn.Module]],
    *,
    every_n: int | str | CheckpointChoice = 1,
) -> nn.Module:
    """Wrap the chosen blocks of `model` in a non-reentrant checkpoint wrapper, in place.

    `every_n` is any `activation_checkpointing` setting: an int (0 off, n: blocks 0, n, 2n, ...
    in full) or a name ('none', 'full', 'op', 'selective'). Returns `model`.

    Call it before FSDP2's `apply_fsdp` (the torchtitan order) or after FSDP1 has wrapped the
    model (checkpointing then runs inside each FSDP unit); both keep parameter names but add a
    `_checkpoint_wrapped_module.` segment.
    """
    from lightning_dist._compat import checkpoint_wrapper_api

    choice = parse_activation_checkpointing(every_n)
    if not choice.enabled:
        return model
    wrap_matching, checkpoint_wrapper = checkpoint_wrapper_api()
    blocks = block_modules(model, block_types)
    if not blocks:
        log.warning("Activation checkpointing found no blocks in %s", type(model).__name__)
        return model
    chosen = {id(b) for i, b in enumerate(blocks) if i % choice.every_n == 0}
    wrapper = checkpoint_wrapper
    if choice.mode == "op":
        wrapper = functools.partial(checkpoint_wrapper, context_fn=selective_context)
    wrap_matching(model, checkpoint_wrapper_fn=wrapper, check_fn=lambda m: id(m) in chosen)
    log.info(
        "Applied %s activation checkpointing to %d of %d blocks",
        "op-level (selective)" if choice.mode == "op" else "full", len(chosen), len(blocks),
    )  # fmt: skip
    return model
