"""`ModelArgs` and `MoEArgs`: the shapes of our models (`shape.py`) that can build them.

The fields, parameter counts and FLOPs live in `LlamaShape` and `MoEShape`; this module adds
`build()`, the one method needing the model code, whose import (and torch's) waits until it is
called. `llama.py` and `moe.py` annotate with the shapes and never import this module, so they
form no import circle. `lightning_dist.models.args.ModelArgs` (dense) and
`lightning_dist.models.args.MoEArgs` (mixture of experts) are the `_target_`s of
conf/model/*.yaml. `HFModelSettings` declares a Hugging Face model's settings (model=hf_llama)
without torch, for the Hydra schema; `models.hf.HFModelSpec` adds what builds it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

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


@dataclass(kw_only=True)
class HFModelSettings:
    """A Hugging Face causal LM: either a random-init `config` or a local `pretrained_path`."""

    config: dict | None = field(default=None, metadata={"hydra_type": Any})
    """A transformers config as a dict (LlamaConfig keys: hidden_size, num_hidden_layers, ...).
    `model_type` picks the config class and defaults to "llama"; `architectures` is allowed."""
    pretrained_path: str | None = None
    """A local directory written by `save_pretrained` (config.json plus weights)."""
    attn_implementation: str = "sdpa"
    """Attention kernel passed to transformers ("sdpa", "eager", "flash_attention_2")."""
