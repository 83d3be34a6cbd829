"""`ModelArgs`: the shape of a Llama-style model (`shape.py`) that can build its `Transformer`.

The fields, parameter counts and FLOPs live in `LlamaShape`; this module adds `build()`, the
one method needing the model code, whose import (and torch's) waits until it is called.
`llama.py` annotates with `LlamaShape` and never imports this module, so the two form no
import circle. `lightning_dist.models.args.ModelArgs` is the `_target_` of conf/model/*.yaml.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from lightning_dist.models.shape import LlamaShape

if TYPE_CHECKING:
    from lightning_dist.models.llama import Transformer


@dataclass(kw_only=True)
class ModelArgs(LlamaShape):
    """Shape of a Llama-style decoder (RMSNorm, RoPE, SwiGLU, grouped-query attention)."""

    def build(self) -> Transformer:
        """Build the single-device `Transformer` on the current default device (use meta)."""
        from lightning_dist.models.llama import Transformer

        return Transformer(self)
