"""Packed documents: several documents in one window, each attending only to itself.

A window of a packed corpus holds the end of one document, whole documents, and the start of
another, each ended by a separator token (the tokenizer's end of text). Three pure functions
describe it, for one device and for the context-parallel attention alike
(`parallel/context_parallel.py`):

- `document_ids`: which document of the window each token belongs to (0, 1, ...); a separator
  belongs to the document it ends;
- `document_positions`: each token's place in its document, the rotary position;
- `document_causal_mask`: a query attends to a key of its own document, never past itself.
"""

from __future__ import annotations

import torch


def document_ids(tokens: torch.Tensor, separator: int) -> torch.Tensor:
    """The document of each token of `tokens` [..., n]: the separators before it."""
    ends = (tokens == separator).long()
    return ends.cumsum(-1) - ends


def document_positions(documents: torch.Tensor) -> torch.Tensor:
    """Each token's position in its document, from the document ids [..., n] of consecutive
    tokens (`document_ids`): 0 at every document's first token."""
    index = torch.arange(documents.size(-1), device=documents.device).expand_as(documents)
    starts = torch.ones_like(documents, dtype=torch.bool)
    starts[..., 1:] = documents[..., 1:] != documents[..., :-1]
    return index - torch.where(starts, index, 0).cummax(-1).values


def document_causal_mask(
    query_documents: torch.Tensor, key_documents: torch.Tensor, causal: torch.Tensor
) -> torch.Tensor:
    """The boolean attention mask [b, 1, queries, keys] of SDPA: the query's and the key's
    document ids ([b, queries], [b, keys]) are equal, and `causal` [queries, keys] (the key is
    not after the query in the whole sequence) holds."""
    same = query_documents[:, :, None] == key_documents[:, None, :]
    return (same & causal).unsqueeze(1)
