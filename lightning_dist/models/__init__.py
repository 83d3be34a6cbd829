"""Single-device model code: the Llama-style `Transformer`, its `ModelArgs`, and HF adapters."""

from lightning_dist.models.args import ModelArgs
from lightning_dist.models.llama import RMSNorm, Transformer

__all__ = ["HFCausalLM", "HFModelSpec", "ModelArgs", "RMSNorm", "Transformer"]


def __getattr__(name: str):
    # hf.py is cheap to import (transformers itself loads lazily), but keeping it out of the
    # package import keeps `import lightning_dist.models` minimal.
    if name in ("HFModelSpec", "HFCausalLM"):
        from lightning_dist.models import hf

        return getattr(hf, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
