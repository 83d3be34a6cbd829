"""Token sources: flat arrays of ids read as they are, no tokenizing (`data.sources[i].format`
`tokens` and `megatron`; `lm/sources.py` builds them beside the text sources).

- `TokenFileSource` (format `tokens`): flat little-endian arrays of ids with no header (nanoGPT's
  `.bin`), memory-mapped; the last `val_fraction` of each file's tokens is held out.
- `megatron_source` (format `megatron`): one over the `.bin` files of Megatron-Core indexed
  datasets (`data/indexed.py` checks both files).
"""

from __future__ import annotations

import glob
import logging
from pathlib import Path

import numpy as np
from torch.utils.data import ConcatDataset

from lightning_dist.data.indexed import IndexedDataset, token_file_dtype
from lightning_dist.lm.datasets import TokenWindows, WindowSet
from lightning_dist.lm.source_files import path_matches
from lightning_dist.lm.token_cache import file_sizes
from lightning_dist.options.data import DataSource

log = logging.getLogger(__name__)

SPLITS = ("train", "val")
_SCAN_CHUNK = 1 << 24
"""Ids read at a time when a token file is checked against the vocabulary (32 MiB of uint16)."""


def token_files(path: str | list[str], where: str) -> list[Path]:
    """The files of a `tokens` source: a file, every file of a folder, or a glob's files, or
    those of each entry of a list."""
    if not isinstance(path, str):
        return [f for entry in path for f in token_files(entry, where)]
    root = Path(path).expanduser()
    if root.is_file():
        return [root]
    if root.is_dir():
        found = sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))
    else:
        found = sorted(Path(p) for p in glob.glob(str(root), recursive=True) if Path(p).is_file())
    if not found:
        raise ValueError(f"{where}={path!r} matches no file; point it at token files")
    return found


class TokenFileSource:
    """Flat token files: little-endian uint16 or uint32 ids, no header, memory-mapped.

    Every id is checked against `vocab_size` when the source is built (one pass over the files,
    `_SCAN_CHUNK` ids at a time): an id the model has no embedding for would fail mid-run, or
    silently index another row."""

    def __init__(
        self,
        spec: DataSource,
        *,
        name: str,
        where: str,
        seq_len: int,
        val_fraction: float,
        vocab_size: int | None,
        files: list[Path] | None = None,
        dtype: np.dtype | None = None,
    ):
        self.spec, self.name, self.where = spec, name, where
        self.seq_len, self.val_fraction = seq_len, val_fraction
        dtype = dtype or np.dtype(spec.dtype or token_file_dtype(vocab_size or 0))
        self.dtype = dtype.newbyteorder("<")
        self.files = files or token_files(spec.path or "", f"{where}.path")
        sizes = file_sizes(self.files)
        for file, size in zip(self.files, sizes, strict=True):
            if size % self.dtype.itemsize:
                raise ValueError(
                    f"{where}: {file} has {size} bytes, not a whole number of "
                    f"{self.dtype.name} ids: a truncated file, or not {self.dtype.name} "
                    f"(set {where}.dtype)"
                )
        self.counts = [size // self.dtype.itemsize for size in sizes]
        if vocab_size is not None:
            self._check_vocabulary(vocab_size)
        self.inputs = {
            "files": len(self.files),
            "bytes": sum(sizes),
            "tokens": sum(self.counts),
            "first_paths": [str(f) for f in self.files[:5]],
        }
        log.info(
            "Reading %d token files, %d tokens (%s)",
            len(self.files),
            sum(self.counts),
            ", ".join(self.inputs["first_paths"]),
        )
        for split in SPLITS:  # fails now, before any process starts
            if not self._parts(split):
                raise ValueError(
                    f"{where}: the {split} split holds no window of data.seq_len={seq_len} "
                    f"({sum(self.counts)} tokens in {len(self.files)} files, data.val_fraction="
                    f"{val_fraction}); add tokens or lower data.seq_len"
                )

    def _check_vocabulary(self, vocab_size: int) -> None:
        for file, count in zip(self.files, self.counts, strict=True):
            ids = np.memmap(file, dtype=self.dtype, mode="r") if count else np.zeros(0)
            for start in range(0, count, _SCAN_CHUNK):
                chunk = ids[start : start + _SCAN_CHUNK]
                top = int(chunk.max())
                if top >= vocab_size:
                    at = start + int(np.argmax(chunk >= vocab_size))
                    raise ValueError(
                        f"{self.where}: {file} holds token id {top} (first at position {at}), "
                        f"at or above the model's vocab_size={vocab_size}; use a model with "
                        f"model.vocab_size > {top}, or check {self.where}.dtype "
                        f"({self.dtype.name}) and the tokenizer that wrote it"
                    )

    def _parts(self, split: str) -> list[tuple[Path, int, int]]:
        """(file, first id, ids) of each file's piece of `split` that holds a whole window."""
        parts = []
        for file, count in zip(self.files, self.counts, strict=True):
            held_out = max(1, int(count * self.val_fraction))
            start, n = (0, count - held_out) if split == "train" else (count - held_out, held_out)
            if n >= self.seq_len + 1:
                parts.append((file, start, n))
        return parts

    def prepare(self) -> None:
        """Nothing to prepare: the files are read as they are."""

    def windows(self, split: str, separator: int | None) -> WindowSet:
        """The split's windows, file by file (a window never spans two files)."""
        sets = [
            TokenWindows(
                np.memmap(
                    file, dtype=self.dtype, mode="r", offset=start * self.dtype.itemsize, shape=(n,)
                ),
                self.seq_len,
                split=split,
                separator=separator,
            )
            for file, start, n in self._parts(split)
        ]
        return sets[0] if len(sets) == 1 else ConcatDataset(sets)


def megatron_source(
    spec: DataSource,
    *,
    name: str,
    where: str,
    seq_len: int,
    val_fraction: float,
    vocab_size: int | None,
) -> TokenFileSource:
    """A Megatron-Core indexed dataset (`prefix.bin` + `prefix.idx`, `data/indexed.py` checks
    both) as a token source: its documents back to back, as Megatron's GPT dataset reads them.
    `path` is the prefix (a `.bin` or `.idx` suffix is dropped), a glob of them, or a list."""

    entries = [spec.path] if isinstance(spec.path, str) else list(spec.path or [])
    named = [e for e in entries if Path(f"{e}.idx").expanduser().is_file()]  # bare prefixes
    globbed = [e for e in entries if e not in named]
    matches = [Path(e).expanduser() for e in named]
    matches += path_matches(globbed, f"{where}.path") if globbed else []
    prefixes, dtypes = [], set()
    for match in matches:
        suffix = match.suffix if match.suffix in (".bin", ".idx") else ""
        prefix = str(match)[: len(str(match)) - len(suffix)]
        if prefix not in prefixes:
            prefixes.append(prefix)
            dtypes.add(IndexedDataset(prefix).dtype)
    if len(dtypes) > 1 or dtypes & {np.dtype(np.float32), np.dtype(np.float64)}:
        raise ValueError(
            f"{where}: the indexed datasets hold {sorted(map(str, dtypes))} tokens; "
            "one integer dtype per source"
        )
    return TokenFileSource(
        spec,
        name=name,
        where=where,
        seq_len=seq_len,
        val_fraction=val_fraction,
        vocab_size=vocab_size,
        files=[Path(p + ".bin") for p in prefixes],
        dtype=dtypes.pop(),
    )
