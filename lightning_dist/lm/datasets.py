"""Map-style datasets of token windows: real text from a token array, or synthetic ids.

Every sample is a LongTensor of `seq_len + 1` ids; the model uses `w[:-1]` as inputs and `w[1:]`
as targets. Given a `separator` (packed documents, `data.pack_documents`), a sample is instead
the dict `packed_window` makes: the ids as "tokens" and each one's document id as "documents".
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from lightning_dist.models.documents import document_ids


def packed_window(tokens: torch.Tensor, separator: int | None) -> torch.Tensor | dict:
    """A window of ids as it is, or (`separator` given) with the document of each id."""
    if separator is None:
        return tokens
    return {"tokens": tokens, "documents": document_ids(tokens, separator)}


WindowSet = Any
"""A split's windows: a map-style dataset with `len()` (TokenWindows, SyntheticTokens, their
ConcatDataset, or an empty list). torch types `Dataset` without `__len__`, so the checker cannot
follow `len()` of one; this name says what is meant where the type cannot."""


class SplitTooSmall(ValueError):
    """A split of the data holds less than the run needs (a window, a micro-batch per rank),
    found as the data is set up: the same on every rank, so `train()` reports it as one line
    (a configuration error), not a traceback per rank."""


class TokenWindows(Dataset):
    """Consecutive windows of `seq_len + 1` tokens over a 1-D token array.

    Window i is `tokens[i*seq_len : i*seq_len + seq_len + 1]`, so neighbours share one token and
    every token except the first is a target exactly once. With `separator` (the id that ends
    each document) a window is a `packed_window`.
    """

    def __init__(
        self,
        tokens: np.ndarray,
        seq_len: int,
        *,
        split: str = "train",
        separator: int | None = None,
    ):
        if seq_len < 1:
            raise ValueError(f"data.seq_len={seq_len} must be at least 1")
        n = len(tokens)
        if n < seq_len + 1:
            raise SplitTooSmall(
                f"the {split} split has {n} tokens, too few for one window of "
                f"data.seq_len={seq_len} (needs {seq_len + 1}); add text, lower data.seq_len"
                + (" or raise data.val_fraction" if split == "val" else "")
            )
        self.tokens = tokens
        self.seq_len = seq_len
        self.split = split
        self.separator = separator

    def __len__(self) -> int:
        return (len(self.tokens) - 1) // self.seq_len

    def __getitem__(self, i: int) -> torch.Tensor:
        if not 0 <= i < len(self):
            raise IndexError(f"window {i} is out of range for {len(self)} windows")
        start = i * self.seq_len
        window = self.tokens[start : start + self.seq_len + 1].astype(np.int64)
        return packed_window(torch.from_numpy(window), self.separator)

    def __getstate__(self) -> dict:
        # DataLoader workers pickle the dataset; pickling a memmap would copy the whole corpus,
        # so workers reopen the file instead (the same piece of it: a source's split is one).
        state = dict(self.__dict__)
        if isinstance(self.tokens, np.memmap) and self.tokens.filename:
            t = self.tokens
            state["tokens"] = (t.filename, t.dtype.str, t.offset, len(t))
        return state

    def __setstate__(self, state: dict) -> None:
        tokens = state["tokens"]
        if isinstance(tokens, tuple):
            filename, dtype, offset, n = tokens
            state["tokens"] = np.memmap(
                filename, dtype=np.dtype(dtype), mode="r", offset=offset, shape=(n,)
            )
        self.__dict__.update(state)


class SyntheticTokens(Dataset):
    """`num_samples` windows of uniform random ids, each a pure function of (seed, index).

    With `documents=True` the last id, `vocab_size - 1`, is kept for separators: the others
    are drawn below it, and documents of 1 to seq_len / 2 + 1 tokens (drawn from the same
    stream) each end with one, so a window is a `packed_window` of several documents."""

    def __init__(
        self,
        num_samples: int,
        seq_len: int,
        vocab_size: int,
        seed: int = 0,
        offset: int = 0,
        documents: bool = False,
    ):
        if num_samples < 1 or seq_len < 1 or vocab_size < 1 + documents:
            raise ValueError(
                f"synthetic data needs num_samples={num_samples}, seq_len={seq_len} and "
                f"vocab_size={vocab_size} all at least 1"
            )
        self.num_samples = num_samples
        self.seq_len = seq_len
        self.vocab_size = vocab_size
        self.seed = seed
        self.offset = offset
        """Index of the first window in the seed's stream; validation starts after training."""
        self.separator = vocab_size - 1 if documents else None

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, i: int) -> torch.Tensor:
        if not 0 <= i < self.num_samples:
            raise IndexError(f"sample {i} is out of range for {self.num_samples} samples")
        # numpy's SeedSequence mixes the whole (seed, index) pair; torch's CPU generator keeps
        # only 32 bits of its seed, so packing both into one torch seed would collide.
        entropy = [self.seed & (2**64 - 1), self.offset + i]
        rng = np.random.default_rng(entropy)
        if self.separator is None:
            return torch.from_numpy(rng.integers(0, self.vocab_size, self.seq_len + 1))
        ids = rng.integers(0, self.separator, self.seq_len + 1)
        ends = np.cumsum(rng.integers(1, self.seq_len // 2 + 2, self.seq_len + 1)) - 1
        ids[ends[ends <= self.seq_len]] = self.separator  # each document's last id
        return packed_window(torch.from_numpy(ids), self.separator)
