"""Activation checkpointing of whole blocks, as one function over a model.

A checkpointed block keeps only its input during forward and recomputes its activations in
backward: activation memory drops from all blocks to about one, for roughly a third more
compute. No Lightning import here.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from torch import nn

from lightning_dist.parallel.fsdp import block_modules

log = logging.getLogger(__name__)


def apply_activation_checkpointing(
    model: nn.Module, block_types: Sequence[type[nn.Module]], *, every_n: int = 1
) -> nn.Module:
    """Wrap every `every_n`-th block (blocks 0, n, 2n, ...) of `model` in a non-reentrant
    checkpoint wrapper, in place. `every_n=0` does nothing. Returns `model`.

    Call it before FSDP2's `apply_fsdp` (the torchtitan order) or after FSDP1 has wrapped the
    model (checkpointing then runs inside each FSDP unit); both keep parameter names but add a
    `_checkpoint_wrapped_module.` segment.
    """
    from lightning_dist._compat import checkpoint_wrapper_api

    wrap_matching, checkpoint_wrapper = checkpoint_wrapper_api()

    if every_n < 0:
        raise ValueError(f"activation_checkpointing={every_n} must be 0 (off) or a block interval")
    if every_n == 0:
        return model
    blocks = block_modules(model, block_types)
    if not blocks:
        log.warning("Activation checkpointing found no blocks in %s", type(model).__name__)
        return model
    chosen = {id(b) for i, b in enumerate(blocks) if i % every_n == 0}
    wrap_matching(
        model, checkpoint_wrapper_fn=checkpoint_wrapper, check_fn=lambda m: id(m) in chosen
    )
    log.info("Applied activation checkpointing to %d of %d blocks", len(chosen), len(blocks))
    return model
