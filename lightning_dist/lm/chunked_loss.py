"""A next-token cross-entropy that never holds the whole logits.

The logits of a batch are tokens x vocabulary: for Llama 3 (128k entries) at 8k tokens they are
4 GiB in fp32, more than a whole block's activations. Here the model's output projection is
deferred: it returns its input (the final-norm hidden states), and the loss applies the
projection to `chunk_tokens` tokens at a time. Each chunk runs under a non-reentrant
`torch.utils.checkpoint`, so its logits are freed as soon as its summed loss is known and are
recomputed, one chunk at a time, in backward.

The chunks' summed losses divided by the number of tokens are the mean cross-entropy, so the
result equals the plain loss up to fp32 summation order. It works unchanged on DTensors: under
tensor parallelism the projection's weight is split along the vocabulary, each chunk's logits
are too, and the cross-entropy of `loss_parallel()` reduces across the shards.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


class DeferredOutputHead(nn.Linear):
    """An output projection whose forward returns its input unchanged.

    The weight stays where it was (same name, same sharding, same checkpoint key); the loss reads
    it. `defers_logits` tells the tensor-parallel plan to shard the weight but leave the
    hidden states replicated instead of splitting an output along the vocabulary.
    """

    defers_logits = True

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden


def defer_output_head(model: nn.Module) -> nn.Linear | None:
    """Turn the model's output projection (named by its `output_head` attribute) into a
    `DeferredOutputHead`, in place, and return it; None when the model names none (Hugging Face
    models) or it is not a bias-free `nn.Linear`. Call it before parallelising the model."""
    name = getattr(model, "output_head", None)
    head = model.get_submodule(name) if name else None
    if isinstance(head, DeferredOutputHead):
        return head
    if type(head) is not nn.Linear or head.bias is not None:
        return None
    head.__class__ = DeferredOutputHead
    return head


def chunked_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk_tokens: int
) -> torch.Tensor:
    """Mean cross-entropy of `hidden @ weight.T` [..., vocab] against `targets` [...], computed
    `chunk_tokens` tokens at a time (see the module docs). `hidden` is [..., dim]."""
    if chunk_tokens < 1:
        raise ValueError(f"loss_chunk_tokens={chunk_tokens} must be positive (0 turns it off)")
    flat = hidden.flatten(0, -2)
    labels = targets.flatten()
    total = None
    for h, t in zip(flat.split(chunk_tokens), labels.split(chunk_tokens), strict=True):
        part = checkpoint(_summed_loss, h, weight, t, use_reentrant=False)
        total = part if total is None else total + part
    return total / labels.numel()


def _summed_loss(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor):
    logits = F.linear(hidden, weight)
    return F.cross_entropy(logits.float(), targets, reduction="sum")
