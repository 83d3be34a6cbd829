"""Context parallelism for Hugging Face models, through transformers' attention registry.

A transformers attention layer that follows the registry (`AttentionInterface`: Llama, Qwen2,
Mistral, ...) projects q, k and v, applies the rotary step at the `position_ids` it was given,
then calls the function its config's attention implementation names. We register one,
`HF_CONTEXT_PARALLEL`, that hands q, k and v ([b, heads, s_local, head_dim], k and v with the
key/value heads) to the layer's `ContextParallelAttention` and returns the output as the
registry expects it ([b, s_local, heads, head_dim], no attention weights). transformers builds no
mask for an implementation it has no mask function for, so the causal (and chunk) structure
comes from our step alone, which compares true positions. The model is fed this rank's chunks
and their positions (`HFCausalLM.forward(tokens, positions)`), so RoPE rotates at true positions.

transformers is imported only when an HF model is met; nothing here imports Lightning.
"""

from __future__ import annotations

import sys

import torch

HF_CONTEXT_PARALLEL = "lightning_dist_context_parallel"
"""Our name in transformers' `AttentionInterface` (set as the model's attention implementation)."""


def hf_context_parallel_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract, run by the layer's context-parallel step
    (`module.attend`, set by `attach_hf_context_parallel`); the rest of `kwargs`
    (`position_ids`, ...) carries nothing attention needs here."""
    step = getattr(module, "attend", None)
    if step is None:
        raise RuntimeError(
            f"{type(module).__name__} runs attention {HF_CONTEXT_PARALLEL!r} but has no "
            "context-parallel step: call attach_context_parallel on the whole model"
        )
    # `check_hf_context_parallel` refuses these before step 1; a mask would be a caller's
    # padding mask, which HFCausalLM never passes and whose chunks we do not cut.
    if attention_mask is not None or dropout or sliding_window is not None or softcap is not None:
        raise ValueError(
            f"context-parallel attention takes no attention_mask, dropout={dropout}, "
            f"sliding_window={sliding_window} or softcap={softcap}"
        )
    out = step(query, key, value, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def hf_models(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The outermost transformers `PreTrainedModel`s inside `model` ([] without transformers'
    modeling module loaded or without one)."""
    # No transformers model can exist before the module that defines its base class is loaded.
    # Looking it up on `transformers` itself would import it (and torchao): seconds per rank.
    modeling = sys.modules.get("transformers.modeling_utils")
    if modeling is None:
        return []
    found, inner = [], set()
    for module in model.modules():
        if isinstance(module, modeling.PreTrainedModel) and module not in inner:
            found.append(module)
            inner.update(m for m in module.modules() if m is not module)
    return found


def hf_attention_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The attention layers of transformers models: modules with `num_key_value_groups` and
    `scaling`, the attributes every Llama-family attention layer holds."""
    return [
        m for m in model.modules() if hasattr(m, "num_key_value_groups") and hasattr(m, "scaling")
    ]


LENGTH_DEPENDENT_ROPE = ("dynamic", "longrope")
"""transformers' rotary types that choose their frequencies from the largest position id seen."""


def check_hf_context_parallel(model: torch.nn.Module, cp: int) -> bool:
    """Whether `model` holds transformers models; ValueError in one line when one of them
    cannot run under context parallelism of degree `cp`: attention not through the registry,
    no attention layer found, or attention dropout, a sliding window or a soft cap."""
    found = hf_models(model)
    for hf in found:
        name = type(hf).__name__
        if not type(hf).is_backend_compatible():
            raise ValueError(
                f"strategy.cp={cp}: {name}'s attention does not go through transformers' "
                "AttentionInterface, which context parallelism replaces; use strategy.cp=1"
            )
        layers = hf_attention_layers(hf)
        if not layers:
            raise ValueError(
                f"strategy.cp={cp}: {name} has no attention layer with `num_key_value_groups` "
                "and `scaling` (Llama-family layers) to route; use strategy.cp=1"
            )
        rope = (getattr(hf.config, "rope_scaling", None) or {}).get("rope_type")
        if rope in LENGTH_DEPENDENT_ROPE:
            raise ValueError(
                f"strategy.cp={cp}: {name} uses rope_type={rope}, whose frequencies follow the "
                "longest position a rank holds, which differs between context-parallel ranks; "
                "use another rope_scaling or strategy.cp=1"
            )
        softcap = getattr(hf.config, "attn_logit_softcapping", None)
        unsupported = {
            "attention_dropout": {getattr(m, "attention_dropout", 0.0) for m in layers} - {0.0},
            "sliding_window": {_sliding_window(m) for m in layers} - {None},
            "attn_logit_softcapping": set() if softcap is None else {softcap},
        }
        what = ", ".join(f"{k}={min(v)}" for k, v in unsupported.items() if v)
        if what:
            raise ValueError(
                f"strategy.cp={cp} runs causal attention without dropout, window or soft cap; "
                f"{name} has {what}: turn it off in "
                "model.config (null, or 0 for dropout) or use strategy.cp=1"
            )
    return bool(found)


def _sliding_window(layer: torch.nn.Module) -> int | None:
    """The window a layer passes to attention: its own (Qwen2: None on full-attention layers),
    else its config's (Mistral)."""
    if hasattr(layer, "sliding_window"):
        return layer.sliding_window
    return getattr(getattr(layer, "config", None), "sliding_window", None)


def attach_hf_context_parallel(model: torch.nn.Module, step) -> None:
    """Route the attention of every transformers model inside `model` through `step` (a
    `ContextParallelAttention`): register `HF_CONTEXT_PARALLEL`, make it the models'
    attention implementation and give each attention layer the step."""
    found = hf_models(model)
    if not found:
        return
    import transformers

    transformers.AttentionInterface.register(HF_CONTEXT_PARALLEL, hf_context_parallel_attention)
    for hf in found:
        hf.set_attn_implementation(HF_CONTEXT_PARALLEL)
        for layer in hf_attention_layers(hf):
            layer.attend = step
