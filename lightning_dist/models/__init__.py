"""Single-device model code: the Llama-style `Transformer` and its mixture-of-experts flavor
`MoETransformer`, their `ModelArgs` and `MoEArgs`, and HF adapters.

Only the args load eagerly: the planner and the config composer read them on a laptop, and
importing torch there would cost seconds for nothing.
"""

from lightning_dist.models.args import ModelArgs, MoEArgs

__all__ = [
    "HFCausalLM", "HFModelSpec", "ModelArgs", "MoEArgs", "MoETransformer", "RMSNorm", "Transformer",
]  # fmt: skip

_LAZY = {
    "Transformer": "lightning_dist.models.llama",
    "MoETransformer": "lightning_dist.models.moe",
    "RMSNorm": "lightning_dist.models.llama",
    "HFModelSpec": "lightning_dist.models.hf",
    "HFCausalLM": "lightning_dist.models.hf",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
