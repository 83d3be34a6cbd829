"""`ModelArgs` and `MoEArgs`: the shapes of our models (`shape.py`) that can build them.

The fields, parameter counts and FLOPs live in `LlamaShape` and `MoEShape`; this module adds
`build()`, the one method needing the model code, whose import (and torch's) waits until it is
called. `llama.py` and `moe.py` annotate with the shapes and never import this module, so they
form no import circle. `lightning_dist.models.args.ModelArgs` (dense) and
`lightning_dist.models.args.MoEArgs` (mixture of experts) are the `_target_`s of
conf/model/*.yaml.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from lightning_dist.models.shape import LlamaShape, MoEShape

if TYPE_CHECKING:
    from lightning_dist.models.llama import Transformer
    from lightning_dist.models.moe import MoETransformer


@dataclass(kw_only=True)
class ModelArgs(LlamaShape):
    """Shape of a Llama-style decoder (RMSNorm, RoPE, SwiGLU, grouped-query attention)."""

    def build(self) -> Transformer:
        """Build the single-device `Transformer` on the current default device (use meta)."""
        from lightning_dist.models.llama import Transformer

        return Transformer(self)


@dataclass(kw_only=True)
class MoEArgs(MoEShape):
    """Shape of our decoder with mixture-of-experts MLPs (`MoEShape`, docs/MOE.md)."""

    def build(self) -> MoETransformer:
        """Build the single-device `MoETransformer` on the current default device (use meta)."""
        from lightning_dist.models.moe import MoETransformer

        return MoETransformer(self)
