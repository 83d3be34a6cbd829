"""A prepare worker process: whole input files into indexed token shards (prepare.py runs N).

The worker streams a file's documents, encodes them a batch at a time with its own tokenizer
(one thread: the environment prepare.py starts it with), appends the end-of-document token, and
writes shards of at most `shard_tokens` tokens, never splitting a document. It reports on the
`events` queue: ("shard", manifest record) for each finished shard, ("tokens", (tokens,
documents)) about once a second, ("file", (name, documents, skipped)) at a file's end, and
("error", one line) for a bad input, after which it stops.
"""

from __future__ import annotations

import hashlib
import os
import queue
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lightning_dist.data.indexed import IndexedWriter, indexed_dtype
from lightning_dist.data.records import ReadStats, iter_documents
from lightning_dist.data.tokenizer import ByteTokenizer

_PROGRESS_S = 1.0
_BATCH_DOCUMENTS = 64
_BATCH_CHARS = 1 << 20
"""A batch of documents is encoded in one call (it saves per-call overhead); at most this much
text is held."""


@dataclass(frozen=True)
class FileTask:
    """One input file for a worker: where to start (documents and part already finished)."""

    path: str
    name: str
    skip_documents: int
    first_part: int


def shard_name(source: str, part: int) -> str:
    """The file name (without .bin/.idx) of part `part` of input `source`."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", source.rsplit("/", 1)[-1])[:48]
    digest = hashlib.sha256(source.encode()).hexdigest()[:10]
    return f"{stem}-{digest}-{part:05d}"


def batch_encoder(tokenizer: str | None) -> Callable[[list[str]], list]:
    """Encode a list of documents in one call. For a `tokenizer.json`, the `tokenizers`
    package's batch encoding without character offsets: the ids `HFTokenizer.encode` gives, for
    about a quarter less CPU (and the file is parsed once per worker, not twice); for the byte
    tokenizer (None or "byte"), one document at a time."""
    if tokenizer in (None, "", "byte"):
        byte = ByteTokenizer()
        return lambda texts: [byte.encode(text) for text in texts]
    from tokenizers import Tokenizer

    rust = Tokenizer.from_file(str(Path(tokenizer).expanduser()))
    encode = getattr(rust, "encode_batch_fast", rust.encode_batch)  # _fast: tokenizers >= 0.21
    return lambda texts: [e.ids for e in encode(texts, add_special_tokens=False)]


def worker(todo, events, settings: dict, parent: int) -> None:
    """A worker process: files from `todo` until None; events back on `events`."""
    try:
        encode = batch_encoder(settings["tokenizer"])
        while True:
            try:
                task = todo.get(timeout=1.0)
            except queue.Empty:
                if os.getppid() != parent:  # the prepare was killed: stop, not run on alone
                    return
                continue
            if task is None:
                return
            tokenize_file(task, encode, settings, events, parent)
    except (ValueError, OSError) as e:  # ConfigError is a ValueError
        events.put(("error", f"{e}"))
    except Exception as e:  # noqa: BLE001 - the parent prints one line, not this child's traceback
        events.put(("error", f"{type(e).__name__}: {e}"))
    except KeyboardInterrupt:
        pass


def _batches(documents: Iterator[str], skip: int) -> Iterator[list[str]]:
    batch: list[str] = []
    chars = 0
    for index, text in enumerate(documents):
        if index < skip:
            continue  # in a finished shard
        batch.append(text)
        chars += len(text)
        if len(batch) >= _BATCH_DOCUMENTS or chars >= _BATCH_CHARS:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


def tokenize_file(task: FileTask, encode, settings, events, parent: int) -> None:
    """One file into shards; each finished shard and the file's end reported on `events`.
    `settings` holds the tokenizer's `vocab_size` and `eos_id` as prepare loaded it."""
    dtype = indexed_dtype(settings["vocab_size"])
    eos_id = settings["eos_id"]
    eos = np.array([] if eos_id is None else [eos_id], dtype=np.int64)
    stats = ReadStats()
    documents = iter_documents(
        task.path,
        settings["fmt"],
        field=settings["field"],
        skip_bad_records=settings["skip_bad_records"],
        stats=stats,
    )
    part, first, index, writer = task.first_part, task.skip_documents, task.skip_documents, None
    tokens = count = 0
    last_report = time.monotonic()
    try:
        for batch in _batches(documents, task.skip_documents):
            for ids in encode(batch):
                if writer is None:
                    name = shard_name(task.name, part)
                    writer = IndexedWriter(Path(settings["folder"]) / name, dtype)
                writer.add_document(np.concatenate([np.asarray(ids, dtype=np.int64), eos]))
                tokens, count, index = tokens + len(ids) + len(eos), count + 1, index + 1
                if writer.tokens >= settings["shard_tokens"]:
                    events.put(("shard", _record(writer.close(), task, part, first, name)))
                    first, part, writer = index, part + 1, None
            if time.monotonic() - last_report > _PROGRESS_S:
                if os.getppid() != parent:  # the prepare was killed: stop, not run on alone
                    raise SystemExit(1)
                events.put(("tokens", (tokens, count)))
                tokens, count, last_report = 0, 0, time.monotonic()
        if writer is not None:
            events.put(("shard", _record(writer.close(), task, part, first, name)))
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    events.put(("tokens", (tokens, count)))
    events.put(("file", (task.name, stats.documents, stats.skipped)))


def _record(summary, task: FileTask, part: int, first: int, name: str) -> dict:
    base = Path(summary.prefix)
    return {
        "name": name,
        "source": task.name,
        "part": part,
        "first_document": first,
        "documents": summary.documents,
        "tokens": summary.tokens,
        "bin_sha256": summary.bin_sha256,
        "idx_sha256": summary.idx_sha256,
        "bin_bytes": base.with_name(base.name + ".bin").stat().st_size,
        "idx_bytes": base.with_name(base.name + ".idx").stat().st_size,
    }
