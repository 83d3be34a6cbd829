"""The tokenizers, re-exported: they live in `lightning_dist/data/tokenizer.py`, the floor below,
so that `data/` (prepare, its workers) uses them without importing `lm/`."""

from lightning_dist.data.tokenizer import (
    EOS_CANDIDATES,
    ByteTokenizer,
    HFTokenizer,
    Tokenizer,
    describe,
    load_tokenizer,
)

__all__ = [
    "EOS_CANDIDATES",
    "ByteTokenizer",
    "HFTokenizer",
    "Tokenizer",
    "describe",
    "load_tokenizer",
]
