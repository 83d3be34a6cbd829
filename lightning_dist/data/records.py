"""Documents out of the files real corpora ship in, streamed: memory is bounded by one record
(or one Parquet/Arrow batch), never by the size of the file.

Formats (`FORMATS`):

- `text`: the whole file is one document. It is read whole (decompressed as it is read), so it
  is refused above `MAX_TEXT_BYTES`; a larger corpus is several files or JSON Lines.
- `jsonl`: one JSON object per line; the document is its string `field` (default "text").
- `parquet`: the string column `field` (default "text"), read one batch of rows at a time.
- `hf_disk`: a folder written by `datasets.Dataset.save_to_disk`: its `state.json` lists Arrow
  stream files, read one record batch at a time with pyarrow. Nothing of `datasets` is imported
  and nothing from the folder is executed.

`text` and `jsonl` files ending in `.gz` or `.zst` are decompressed as they are read. Every
refusal is one `ConfigError` line naming the file (and the line or row where there is one).
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import stat
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from lightning_dist.runtime.console import print_line
from lightning_dist.runtime.refusal import ConfigError

FORMATS = ("text", "jsonl", "parquet", "hf_disk")
COMPRESSED_SUFFIXES = (".gz", ".zst")
DEFAULT_FIELD = "text"
MAX_TEXT_BYTES = 256 << 20
"""The largest `text` document (one file, decompressed): it is held whole to be tokenized."""
MAX_LINE_BYTES = 256 << 20
"""The longest JSON Lines record; a longer line is refused rather than read into memory."""
_BATCH_ROWS = 1024
SKIP_HINT = (
    "repair that record, or skip bad records with a count (train.py: "
    "data.skip_bad_records=true; prepare: --skip-bad-records)"
)
SET_FIELD = "set the field that holds the text (train.py: data.sources[i].field; prepare: --field)"


class BadRecord(ConfigError):
    """One malformed record: `where` is `file:line: what is wrong` (a row for Parquet and
    Arrow); its message adds how to fix or skip it. Raised when a read reaches the record, so
    for a streamed source possibly mid-run (train.py then keeps the steps trained)."""

    def __init__(self, where: str):
        super().__init__(where)  # the one argument: it pickles (a DataLoader worker's error)
        self.where = where

    def __str__(self) -> str:
        return f"{self.where}; {SKIP_HINT}"


@dataclass
class ReadStats:
    """What a read yielded and skipped; pass one to `iter_documents` to collect the counts."""

    documents: int = 0
    skipped: int = 0
    first_skipped: str = ""
    """Where the first skipped record was, and why (file:line: reason)."""

    def skip(self, where: str) -> None:
        self.skipped += 1
        self.first_skipped = self.first_skipped or where


def iter_documents(
    path: str | os.PathLike,
    fmt: str,
    *,
    field: str | None = None,
    skip_bad_records: bool = False,
    stats: ReadStats | None = None,
    quiet: bool = False,
) -> Iterator[str]:
    """The documents of one local file (one folder for `hf_disk`) in order, streamed.

    The path, format and compression are checked at once; the records as they are read. A bad
    record (malformed JSON, a missing or non-string field, a null) raises `BadRecord` naming
    file:line, unless `skip_bad_records`: then it is skipped, counted in `stats`, and one
    `warning:` line at the end of the file gives the count (none when `quiet`: a stream
    reports its count at the end of the run). A field missing from the file's
    first record is refused either way: it is a wrong `field`, not a bad record.
    """
    if fmt not in FORMATS:
        raise ConfigError(f"data format {fmt!r} is not one of {', '.join(FORMATS)}")
    path = Path(path)
    column = field or DEFAULT_FIELD
    if fmt == "hf_disk":
        files = _hf_disk_files(path)
    else:
        _check_regular_file(path)
        files = [path]
    if compression(path) and fmt in ("parquet", "hf_disk"):
        raise ConfigError(
            f"{path}: a {fmt} file is compressed inside; decompress the file ({compression(path)}) "
            "or name the uncompressed one"
        )
    stats = stats if stats is not None else ReadStats()
    readers = {"text": _text, "jsonl": _jsonl, "parquet": _parquet, "hf_disk": _arrow_stream}
    return _counted(path, files, readers[fmt], column, skip_bad_records, stats, quiet)


def _counted(path, files, reader, column, skip_bad_records, stats, quiet) -> Iterator[str]:
    skipped_before = stats.skipped
    for file in files:
        for text in reader(file, column, skip_bad_records, stats):
            stats.documents += 1
            yield text
    if stats.skipped > skipped_before and not quiet:
        print_line(
            f"warning: {path}: skipped {stats.skipped - skipped_before} bad records "
            f"(the first: {stats.first_skipped})"
        )


def compression(path: Path) -> str | None:
    """The compression named by the file's suffix (`.gz` or `.zst`), or None."""
    return path.suffix if path.suffix in COMPRESSED_SUFFIXES else None


def open_stream(path: Path) -> BinaryIO:
    """`path` opened for reading, decompressed as it is read when it ends in .gz or .zst."""
    if path.suffix == ".gz":
        return gzip.open(path, "rb")  # type: ignore[return-value]
    raw = open(path, "rb")  # noqa: SIM115 (the stream is returned; the caller closes it)
    if path.suffix == ".zst":
        return io.BufferedReader(_ZstdReader(raw, path), buffer_size=1 << 20)  # type: ignore[return-value]
    return raw


ZSTD_PIECE_BYTES = 1 << 9
"""Compressed bytes inflated at a time. A zstd block (at most 128 KiB) can be coded in 4 bytes,
so a piece inflates to at most 16 MiB, however the file was made; a 256 KiB read inflated at
once could have been 8 GiB."""


class _ZstdReader(io.RawIOBase):
    """A zstd file as a raw stream, one frame after another, that refuses a truncated file
    (zstandard's own `stream_reader` ends quietly there, and the tail would be lost unseen)."""

    def __init__(self, raw: BinaryIO, path: Path):
        import zstandard

        self._raw, self._path, self._zstd = raw, path, zstandard
        self._decompressor = zstandard.ZstdDecompressor()
        self._frame = self._decompressor.decompressobj()
        self._input, self._input_at = b"", 0
        self._pending, self._pending_at = b"", 0
        self._started = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while self._pending_at == len(self._pending):
            if self._input_at == len(self._input):
                self._input, self._input_at = self._raw.read(1 << 18), 0
                if not self._input:
                    if not self._frame.eof and self._started:
                        raise _corrupt(self._path, "zstd", "the file ends inside a frame")
                    return 0
            piece = self._input[self._input_at : self._input_at + ZSTD_PIECE_BYTES]
            self._input_at += len(piece)
            self._pending, self._pending_at = self._decompress(piece), 0
        count = min(len(buffer), len(self._pending) - self._pending_at)
        buffer[:count] = self._pending[self._pending_at : self._pending_at + count]
        self._pending_at += count
        return count

    def _decompress(self, chunk: bytes) -> bytes:
        out = []
        try:
            while chunk:
                if self._frame.eof:  # a file of several frames: the next one starts here (a
                    # frame may end exactly where a read ended, leaving no unused data)
                    self._frame = self._decompressor.decompressobj()
                self._started = True
                out.append(self._frame.decompress(chunk))
                chunk = self._frame.unused_data if self._frame.eof else b""
        except self._zstd.ZstdError as e:
            raise _corrupt(self._path, "zstd", str(e)) from e
        return b"".join(out)

    def close(self) -> None:
        self._raw.close()
        super().close()


def _corrupt(path: Path, kind: str, why: str) -> ConfigError:
    return ConfigError(f"{path}: corrupt {kind} file ({why}); re-create or re-download it")


def _check_regular_file(path: Path) -> None:
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise ConfigError(f"{path} does not exist") from None
    except OSError as e:
        raise ConfigError(f"cannot read {path} ({e.strerror})") from e
    if not stat.S_ISREG(mode):
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a folder" if stat.S_ISDIR(mode) else "special"
        raise ConfigError(f"{path} is not a regular file ({kind}); name a file of documents")


@contextlib.contextmanager
def _decompressing(path: Path) -> Iterator[None]:
    """Turn gzip's errors (raised while reading) into one line naming the file."""
    try:
        yield
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise _corrupt(path, "gzip", str(e)) from e


TEXT_HEAD_BYTES = 1 << 16
"""How much of a compressed text file `check_text_head` decompresses before a run starts."""


def check_text_head(path: Path) -> None:
    """ConfigError (one line) when the start of a compressed text file does not decompress to
    text: checked before the ranks start, where the whole file is only read when tokenized."""
    with open_stream(path) as stream, _decompressing(path):
        head = stream.read(TEXT_HEAD_BYTES)
    if b"\0" in head:
        raise ConfigError(
            f"{path} decompresses to data that is not text (a NUL byte at offset "
            f"{head.index(0)}); leave it out or give its documents as text"
        )


def _text(path: Path, column: str, skip_bad_records: bool, stats: ReadStats) -> Iterator[str]:
    with open_stream(path) as stream, _decompressing(path):
        data = stream.read(MAX_TEXT_BYTES + 1)
    if len(data) > MAX_TEXT_BYTES:
        raise ConfigError(
            f"{path}: format text takes a whole file as one document, and this one is over "
            f"{MAX_TEXT_BYTES >> 20} MiB; split it into files or into JSON Lines records"
        )
    if b"\0" in data:
        raise ConfigError(f"{path} is not text (a NUL byte at offset {data.index(0)})")
    yield data.decode("utf-8", errors="replace")


def _jsonl(path: Path, column: str, skip_bad_records: bool, stats: ReadStats) -> Iterator[str]:
    first = True
    with open_stream(path) as stream, _decompressing(path):
        lineno = 0
        while line := stream.readline(MAX_LINE_BYTES + 1):
            lineno += 1
            if len(line) > MAX_LINE_BYTES:
                raise ConfigError(
                    f"{path}:{lineno}: a record longer than {MAX_LINE_BYTES >> 20} MiB (or a "
                    "file that is not JSON Lines)"
                )
            if not line.strip():
                continue
            text, problem = _field_of(line, column)
            if problem and first and problem.startswith("no field"):
                raise ConfigError(f"{path}:{lineno}: {problem}")
            first = False
            if problem:
                where = f"{path}:{lineno}: {problem}"
                if not skip_bad_records:
                    raise BadRecord(where)
                stats.skip(where)
                continue
            yield text


def _field_of(line: bytes, column: str) -> tuple[str, str]:
    """(the document, "") or ("", what is wrong with the record)."""
    try:
        record = json.loads(line)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError
        return "", f"not valid JSON ({getattr(e, 'msg', e)})"
    if not isinstance(record, dict):
        return "", f"a JSON {type(record).__name__}, not an object"
    if column not in record:
        fields = ", ".join(map(repr, list(record)[:20])) or "none"
        return "", f"no field {column!r} (the record's fields: {fields}); {SET_FIELD}"
    text = record[column]
    if not isinstance(text, str):
        return "", f"field {column!r} is {type(text).__name__}, not a string"
    if b"\\ud" in line.lower():  # a lone surrogate escape decodes, but cannot be tokenized
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return "", f"field {column!r} holds an unpaired surrogate, not text"
    return text, ""


def _arrow_column(path: Path, schema, column: str, fmt: str) -> None:
    import pyarrow as pa

    if column not in schema.names:
        raise ConfigError(
            f"{path}: no column {column!r} (its columns: {', '.join(schema.names)}); {SET_FIELD}"
        )
    kind = schema.field(column).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise ConfigError(f"{path}: column {column!r} is {kind}, not a string ({fmt})")


def _batches_texts(path: Path, batches, column: str, skip_bad_records, stats) -> Iterator[str]:
    row = 0
    for batch in batches:
        for text in batch.column(column).to_pylist():
            row += 1
            if text is None:
                where = f"{path}: row {row}: column {column!r} is null"
                if not skip_bad_records:
                    raise BadRecord(where)
                stats.skip(where)
                continue
            yield text


def _parquet(path: Path, column: str, skip_bad_records: bool, stats: ReadStats) -> Iterator[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise ConfigError(f"{path} is not a readable Parquet file ({e})") from e
    _arrow_column(path, parquet.schema_arrow, column, "parquet")
    try:
        batches = parquet.iter_batches(batch_size=_BATCH_ROWS, columns=[column])
        yield from _batches_texts(path, batches, column, skip_bad_records, stats)
    except (pa.ArrowException, OSError) as e:
        raise _corrupt(path, "Parquet", str(e).splitlines()[0]) from e
    finally:
        parquet.close()


def _hf_disk_files(folder: Path) -> list[Path]:
    """The Arrow files of a `save_to_disk` folder, as its state.json lists them."""
    if (folder / "dataset_dict.json").is_file():
        splits = sorted(p.name for p in folder.iterdir() if (p / "state.json").is_file())
        raise ConfigError(
            f"{folder} holds a DatasetDict; name one split's folder ({', '.join(splits)})"
        )
    state = folder / "state.json"
    if not state.is_file():
        raise ConfigError(f"{folder} is not a datasets.save_to_disk folder (no state.json)")
    try:
        names = [entry["filename"] for entry in json.loads(state.read_bytes())["_data_files"]]
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{state}: not a datasets state file ({e!r})") from e
    files = []
    for name in names:
        # The names come from the folder: one that leads out of it is not read.
        if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
            raise ConfigError(f"{state}: data file {name!r} is not a file name in {folder}")
        _check_regular_file(folder / name)
        files.append(folder / name)
    return files


def _arrow_stream(path: Path, column: str, skip_bad_records, stats) -> Iterator[str]:
    import pyarrow as pa

    with pa.OSFile(str(path), "rb") as source:
        try:
            reader = pa.ipc.open_stream(source)
        except (pa.ArrowException, OSError) as e:
            raise ConfigError(f"{path} is not an Arrow stream file of datasets ({e})") from e
        _arrow_column(path, reader.schema, column, "hf_disk")
        try:
            yield from _batches_texts(path, reader, column, skip_bad_records, stats)
        except (pa.ArrowException, OSError) as e:
            raise _corrupt(path, "Arrow", str(e).splitlines()[0]) from e
