"""Token files: Megatron-Core's indexed dataset (`.bin` + `.idx`) and nanoGPT-style flat arrays.

The indexed format, byte for byte (what Megatron-Core's `indexed_dataset.py` writes and reads):

- `.idx`: the 9 bytes `MMIDIDX\\x00\\x00`; the version, u64 little-endian, 1; the token dtype's
  code, u8 (`DTYPE_CODES`); the sequence count, u64; the document count, u64 (the length of
  the document index array, so one more than the documents); then the arrays, little-endian and
  back to back: int32 length of each sequence, int64 byte offset of each sequence in the `.bin`,
  int64 document index (the sequence each document starts at: 0 first, the sequence count
  last). A multimodal dataset adds an int8 mode per sequence after those; it is read and
  ignored.
- `.bin`: the tokens of every sequence, back to back, in the dtype of the code.

A document is one or more sequences; our writer makes each document one sequence, as
Megatron's preprocessing does. Files are memory-mapped, so opening a dataset of any size reads
only its 34-byte header; a file whose size disagrees with its header is refused in one line.
"""

from __future__ import annotations

import hashlib
import os
import struct
import uuid
from array import array
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lightning_dist.runtime.refusal import ConfigError

INDEX_MAGIC = b"MMIDIDX\x00\x00"
INDEX_VERSION = 1
DTYPE_CODES: dict[int, np.dtype] = {
    1: np.dtype(np.uint8),
    2: np.dtype(np.int8),
    3: np.dtype(np.int16),
    4: np.dtype(np.int32),
    5: np.dtype(np.int64),
    6: np.dtype(np.float64),
    7: np.dtype(np.float32),
    8: np.dtype(np.uint16),
}
_CODE_OF = {dtype: code for code, dtype in DTYPE_CODES.items()}
_HEADER = struct.Struct("<9sQBQQ")  # magic, version, dtype code, sequences, document indices


def indexed_dtype(vocab_size: int) -> np.dtype:
    """The token dtype of an indexed dataset for a vocabulary: uint16 when every id fits, else
    int32 (the format has no uint32). Megatron's own preprocessing switches to int32 a little
    earlier, below 65,500 ids; either reads the other's files."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.int32)


def token_file_dtype(vocab_size: int) -> np.dtype:
    """The dtype of a nanoGPT-style token file: uint16 when every id fits, else uint32."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def read_token_file(path: str | os.PathLike, vocab_size: int) -> np.ndarray:
    """A flat little-endian token file with no header, memory-mapped read-only (its dtype from
    `token_file_dtype(vocab_size)`). A size that is not a whole number of tokens is refused."""
    path = Path(path)
    dtype = token_file_dtype(vocab_size).newbyteorder("<")
    size = _size_of(path)
    if size % dtype.itemsize:
        raise ConfigError(
            f"{path}: {size} bytes is not a whole number of {dtype.name} tokens (vocabulary "
            f"{vocab_size}); the file is truncated or was written for another vocabulary size"
        )
    if size == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r")


def _size_of(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        raise ConfigError(f"{path} does not exist") from None


class IndexedDataset:
    """A Megatron-Core indexed dataset at `prefix` (`prefix.idx` + `prefix.bin`), read-only."""

    def __init__(self, prefix: str | os.PathLike):
        """Open and check both files; ConfigError in one line when one is missing or corrupt."""
        self.prefix = str(prefix)
        idx_path, bin_path = Path(self.prefix + ".idx"), Path(self.prefix + ".bin")
        idx_size, bin_size = _size_of(idx_path), _size_of(bin_path)
        with open(idx_path, "rb") as f:
            head = f.read(_HEADER.size)
        if len(head) < _HEADER.size or head[:9] != INDEX_MAGIC:
            raise ConfigError(f"{idx_path} is not a Megatron indexed-dataset index (bad header)")
        _, version, code, sequences, doc_entries = _HEADER.unpack(head)
        if version != INDEX_VERSION or code not in DTYPE_CODES:
            raise ConfigError(
                f"{idx_path}: index version {version} / dtype code {code} is not readable "
                f"(version {INDEX_VERSION}, codes {sorted(DTYPE_CODES)})"
            )
        self.dtype = DTYPE_CODES[code]
        arrays = _HEADER.size + 12 * sequences + 8 * doc_entries
        if idx_size not in (arrays, arrays + sequences):  # + int8 modes of a multimodal one
            raise ConfigError(
                f"{idx_path}: {idx_size} bytes, but its header ({sequences} sequences, "
                f"{doc_entries} document indices) needs {arrays}; the index is truncated or corrupt"
            )
        index = np.memmap(idx_path, dtype=np.uint8, mode="r")
        offset = _HEADER.size
        self.sequence_lengths = index[offset : offset + 4 * sequences].view("<i4")
        offset += 4 * sequences
        self.sequence_pointers = index[offset : offset + 8 * sequences].view("<i8")
        offset += 8 * sequences
        self.document_boundaries = index[offset : offset + 8 * doc_entries].view("<i8")
        """Index of the first sequence of each document, then the sequence count."""
        self._check(idx_path, bin_path, bin_size)
        dtype = self.dtype.newbyteorder("<")
        self._tokens = (
            np.memmap(bin_path, dtype=dtype, mode="r") if bin_size else np.zeros(0, dtype)
        )

    def _check(self, idx_path: Path, bin_path: Path, bin_size: int) -> None:
        lengths, bounds = self.sequence_lengths, self.document_boundaries
        itemsize = self.dtype.itemsize
        total = int(lengths.sum(dtype=np.int64)) * itemsize
        if len(bounds) < 1 or bounds[0] != 0 or bounds[-1] != len(lengths):
            raise ConfigError(
                f"{idx_path}: the document indices must run from 0 to the sequence count "
                f"{len(lengths)}; the index is corrupt"
            )
        last_end = (
            int(self.sequence_pointers[-1]) + int(lengths[-1]) * itemsize if len(lengths) else 0
        )
        if total != bin_size or last_end != total or (len(lengths) and lengths.min() < 0):
            raise ConfigError(
                f"{bin_path}: {bin_size} bytes, but its index describes {total} bytes of "
                f"{self.dtype.name} tokens; the data file is truncated or corrupt"
            )

    def __len__(self) -> int:
        """The number of sequences."""
        return len(self.sequence_lengths)

    @property
    def num_documents(self) -> int:
        return len(self.document_boundaries) - 1

    @property
    def num_tokens(self) -> int:
        return len(self._tokens)

    def get(self, i: int) -> np.ndarray:
        """The tokens of sequence `i`, a read-only view into the memory map."""
        start = int(self.sequence_pointers[i]) // self.dtype.itemsize
        return self._tokens[start : start + int(self.sequence_lengths[i])]

    __getitem__ = get


@dataclass(frozen=True)
class ShardSummary:
    """What `IndexedWriter.close` wrote: counts and the sha256 of each file."""

    prefix: str
    sequences: int
    documents: int
    tokens: int
    bin_sha256: str
    idx_sha256: str


class IndexedWriter:
    """Writes an indexed dataset one sequence at a time, with memory independent of the token
    count (12 bytes per sequence are kept until `close`).

    Both files are written under temporary names and renamed into place by `close`, the `.idx`
    last, so a reader never sees a half-written dataset; a writer that is not closed (an error,
    a kill) leaves no file under the final names. Use as a context manager, or call `close`.
    """

    def __init__(self, prefix: str | os.PathLike, dtype: np.dtype | type):
        self.prefix = str(prefix)
        self.dtype = np.dtype(dtype)
        if self.dtype not in _CODE_OF:
            raise ValueError(f"dtype {self.dtype} has no code in the indexed format")
        self._tmp = f".tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._bin_path = Path(self.prefix + ".bin" + self._tmp)
        self._bin = open(self._bin_path, "wb")  # noqa: SIM115 (closed by close/abort)
        self._bin_hash = hashlib.sha256()
        self._lengths = array("i")
        self._documents = array("q", [0])
        self._tokens = 0
        self.summary: ShardSummary | None = None
        """What `close` wrote, once it has."""
        if self.dtype.kind in "iu":
            info = np.iinfo(self.dtype)
            self._range = (info.min, info.max)

    @property
    def tokens(self) -> int:
        """Tokens written so far."""
        return self._tokens

    def add(self, tokens) -> None:
        """Append one sequence (any array-like of ids) to the current document."""
        tokens = np.asarray(tokens)
        if tokens.dtype != self.dtype and len(tokens) and self.dtype.kind in "iu":
            low, high = int(tokens.min()), int(tokens.max())
            if low < self._range[0] or high > self._range[1]:
                raise ValueError(f"token ids {low}..{high} do not fit {self.dtype.name}")
        data = tokens.astype(self.dtype.newbyteorder("<"), copy=False).tobytes()
        self._bin.write(data)
        self._bin_hash.update(data)
        self._lengths.append(len(tokens))
        self._tokens += len(tokens)

    def end_document(self) -> None:
        """End the current document at the last sequence added."""
        if self._documents[-1] != len(self._lengths):
            self._documents.append(len(self._lengths))

    def add_document(self, tokens) -> None:
        """One document of one sequence."""
        self.add(tokens)
        self.end_document()

    def close(self) -> ShardSummary:
        """Write the index and put both files in place; returns what was written."""
        if self.summary is not None:
            return self.summary
        self.end_document()
        self._bin.close()
        lengths = (
            np.frombuffer(self._lengths, dtype=np.int32) if self._lengths else np.zeros(0, np.int32)
        )
        pointers = np.zeros(len(lengths), dtype="<i8")
        np.cumsum(lengths[:-1], dtype=np.int64, out=pointers[1:])
        pointers *= self.dtype.itemsize
        header = _HEADER.pack(
            INDEX_MAGIC, INDEX_VERSION, _CODE_OF[self.dtype], len(lengths), len(self._documents)
        )
        parts = [header, lengths.astype("<i4").tobytes(), pointers.tobytes()]
        parts.append(np.frombuffer(self._documents, dtype=np.int64).astype("<i8").tobytes())
        idx_hash = hashlib.sha256()
        idx_tmp = Path(self.prefix + ".idx" + self._tmp)
        with open(idx_tmp, "wb") as f:
            for part in parts:
                f.write(part)
                idx_hash.update(part)
        os.replace(self._bin_path, self.prefix + ".bin")
        os.replace(idx_tmp, self.prefix + ".idx")
        self.summary = ShardSummary(
            self.prefix,
            len(lengths),
            len(self._documents) - 1,
            self._tokens,
            self._bin_hash.hexdigest(),
            idx_hash.hexdigest(),
        )
        return self.summary

    def abort(self) -> None:
        """Drop what was written (the temporary files); nothing once `close` has finished."""
        if self.summary is not None:
            return
        self._bin.close()
        self._bin_path.unlink(missing_ok=True)
        Path(self.prefix + ".idx" + self._tmp).unlink(missing_ok=True)

    def __enter__(self) -> IndexedWriter:
        return self

    def __exit__(self, kind, error, traceback) -> None:
        if kind is None:
            self.close()
        else:
            self.abort()


def write_indexed(
    prefix: str | os.PathLike, sequences: Iterable, dtype: np.dtype | type
) -> ShardSummary:
    """Write `sequences` (each one document of one sequence) as an indexed dataset at `prefix`."""
    with IndexedWriter(prefix, dtype) as writer:
        for tokens in sequences:
            writer.add_document(tokens)
    assert writer.summary is not None
    return writer.summary
