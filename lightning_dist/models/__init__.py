"""Single-device model code: the Llama-style `Transformer`, its `ModelArgs`, and HF adapters.

Only `ModelArgs` loads eagerly: the planner and the config composer read it on a laptop, and
importing torch there would cost seconds for nothing.
"""

from lightning_dist.models.args import ModelArgs

__all__ = ["HFCausalLM", "HFModelSpec", "ModelArgs", "RMSNorm", "Transformer"]

_LAZY = {
    "Transformer": "lightning_dist.models.llama",
    "RMSNorm": "lightning_dist.models.llama",
    "HFModelSpec": "lightning_dist.models.hf",
    "HFCausalLM": "lightning_dist.models.hf",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
