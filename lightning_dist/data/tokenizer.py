"""Tokenizers for the language-model data pipeline.

Two kinds: a byte-level tokenizer that needs nothing and works on any text (the default), and a
thin wrapper around a Hugging Face `tokenizer.json`. Both expose the same small surface that the
token cache needs: `name` (part of the cache key), `vocab_size`, `eos_id`, `encode`, `decode`.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Protocol

import numpy as np

# Tried in order when looking for the end-of-document token of a Hugging Face tokenizer.
EOS_CANDIDATES = (
    "<|endoftext|>",
    "<|end_of_text|>",
    "</s>",
    "<eos>",
    "[EOS]",
    "<|eos|>",
)


class Tokenizer(Protocol):
    """What the data pipeline needs from a tokenizer."""

    name: str
    vocab_size: int
    eos_id: int | None

    def encode(self, text: bytes | str) -> np.ndarray: ...

    def decode(self, ids) -> str: ...


class ByteTokenizer:
    """Byte-level tokenizer: ids 0..255 are the UTF-8 bytes, id 256 ends a document."""

    name = "byte"
    vocab_size = 257
    eos_id = 256

    def encode(self, text: bytes | str) -> np.ndarray:
        """Return the bytes of `text` (UTF-8 for a str) as a uint16 array of ids."""
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        return np.frombuffer(data, dtype=np.uint8).astype(np.uint16)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        """`encode` of each text."""
        return [self.encode(text) for text in texts]

    def decode(self, ids) -> str:
        """Turn ids back into text; the eos id is dropped and broken UTF-8 is replaced."""
        data = bytes(int(i) for i in _as_list(ids) if 0 <= int(i) < 256)
        return data.decode("utf-8", errors="replace")

    def __repr__(self) -> str:
        return "ByteTokenizer()"


class HFTokenizer:
    """A Hugging Face `tokenizers` tokenizer loaded from a `tokenizer.json` file."""

    def __init__(self, path: str | Path, where: str = "data.tokenizer"):
        """Load `path`; raises FileNotFoundError naming it (and `where`, the setting that gave
        it) when it does not exist, ValueError when it is not a tokenizer.json."""
        self.path = Path(path).expanduser()
        if not self.path.is_file():
            raise FileNotFoundError(f"{where}: tokenizer file '{self.path}' does not exist")
        try:
            from tokenizers import Tokenizer as _HFTokenizer
        except ImportError as err:
            raise ImportError(
                'data.tokenizer needs the `tokenizers` package: pip install -e ".[hf]"'
            ) from err
        raw = self.path.read_bytes()
        try:
            self._tok = _HFTokenizer.from_str(raw.decode("utf-8"))
        except Exception as err:  # tokenizers raises a bare Exception for a malformed file
            raise ValueError(
                f"{where}: '{self.path}' is not a tokenizer.json that `tokenizers` can load "
                f"({err}); give the tokenizer.json of a Hugging Face tokenizer, or byte"
            ) from err
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.eos_id = self._find_eos()
        # The content hash, not the path, goes into the cache key: the same tokenizer copied
        # elsewhere reuses the cache, and an edited one at the same path does not.
        self.name = f"hf:{self.path.name}:{hashlib.sha256(raw).hexdigest()[:16]}"

    def _find_eos(self) -> int | None:
        for token in EOS_CANDIDATES:
            token_id = self._tok.token_to_id(token)
            if token_id is not None:
                return token_id
        return None

    def encode(self, text: bytes | str) -> np.ndarray:
        """Encode `text` without adding special tokens; bytes are decoded as UTF-8 first."""
        if not isinstance(text, str):
            text = bytes(text).decode("utf-8", errors="replace")
        ids = self._tok.encode(text, add_special_tokens=False).ids
        return np.asarray(ids, dtype=np.int64)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        """`encode` of each text, in one call without character offsets (the same ids for
        about a quarter less CPU: `data/shard_worker.py` measured it)."""
        encode = getattr(self._tok, "encode_batch_fast", self._tok.encode_batch)  # >= 0.21
        return [np.asarray(e.ids, dtype=np.int64) for e in encode(texts, add_special_tokens=False)]

    def decode(self, ids) -> str:
        """Turn ids back into text (special tokens are skipped)."""
        return self._tok.decode([int(i) for i in _as_list(ids)])

    def __repr__(self) -> str:
        return f"HFTokenizer('{self.path}')"


def load_tokenizer(path: str | None, where: str = "data.tokenizer") -> ByteTokenizer | HFTokenizer:
    """Return the tokenizer at `path` (a tokenizer.json), or the byte tokenizer for None;
    `where` names the setting in errors."""
    if path is None or str(path) in ("", "byte"):
        return ByteTokenizer()
    return HFTokenizer(path, where)


def describe(tokenizer: ByteTokenizer | HFTokenizer) -> str:
    """A short human label for error messages: the file path, or "byte-level"."""
    path = getattr(tokenizer, "path", None)
    return str(path) if path is not None else "byte-level"


def _as_list(ids) -> list:
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    return list(ids) if not isinstance(ids, int) else [ids]
