"""Data sources: each entry of `data.sources` (`options.data.DataSource`) as token windows.

A source is found and checked when it is built (its files, its sizes, its ids against the
model's vocabulary), so a bad source fails before any process starts; its tokens are prepared
in `prepare()` (once per node: the token cache of text) and opened in `windows()` on every rank.
Every source gives the same kind of samples: `TokenWindows` of `seq_len + 1` ids, train and
validation split apart.

- `TextSource` (format `text`): files tokenized once into the content-hashed token cache
  (`token_cache.py`); `data=text` is this source alone.
- `RecordSource` (formats `jsonl`, `parquet`, `hf_disk`): the text field of each record one
  document (read by `data/records.py`), tokenized into the token cache like text.
- `ChatSource` (format `chat`, `lm/chat.py`): chat records of supervised fine-tuning, each
  window with the loss mask of the assistant's tokens.
- `TokenFileSource` and `megatron_source` (formats `tokens`, `megatron`, `lm/token_sources.py`):
  arrays of ids read as they are.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from lightning_dist.lm.datasets import SplitTooSmall, TokenWindows, WindowSet
from lightning_dist.lm.source_files import path_matches, record_files
from lightning_dist.lm.streaming import StreamedSource
from lightning_dist.lm.token_cache import (
    TokenCache,
    build_token_cache,
    cache_key,
    default_cache_dir,
    file_sizes,
    find_files,
    open_token_cache,
    relative_names,
    split_files,
)
from lightning_dist.lm.token_sources import TokenFileSource, megatron_source
from lightning_dist.lm.tokenizer import ByteTokenizer, HFTokenizer, describe, load_tokenizer
from lightning_dist.options.data import DataSource

log = logging.getLogger(__name__)

COMPRESSED_SUFFIXES = (".gz", ".zst")
"""Text and JSON Lines files decompressed as they are read (`data/records.py`)."""


def _renamed(error: ValueError, where: str) -> ValueError:
    """The token cache's errors name `data.paths`; a source of a mixture is `where`."""
    if where == "data.paths":
        return error
    return ValueError(str(error).replace("data.paths", where))


class TextSource:
    """Text files, each one document, tokenized once into the token cache.

    `where` names the setting in errors (`data.paths`, or `data.sources[i].path`)."""

    def __init__(
        self,
        spec: DataSource,
        *,
        name: str,
        where: str,
        tokenizer: ByteTokenizer | HFTokenizer,
        seq_len: int,
        val_fraction: float,
        cache_dir: str | None,
        follow_symlinks: bool,
    ):
        self.spec, self.name, self.where = spec, name, where
        self.tokenizer, self.seq_len, self.val_fraction = tokenizer, seq_len, val_fraction
        self.cache_dir = cache_dir
        self.val_tokens: int | None = None
        """The validation split's tokens, known before tokenizing for the byte tokenizer."""
        try:
            split_files([], val_fraction)  # validates the fraction now rather than at prepare
            self.files, skipped = self._find(follow_symlinks)
            sizes = file_sizes(self.files)
            # Read once here, before any process waits on another: the key, and the text check
            # (before the sizes: a small compressed file is refused as not text, not as short).
            self.key = cache_key(self.files, tokenizer, val_fraction, reader=self.reader)
            self._check_compressed_text()
            self._check_splits(sizes)
            cached = open_token_cache(self.key, self.cache_dir)
            if cached is not None:  # tokenized by an earlier run: its counts are exact
                self._check_train_tokens(cached.meta["tokens"]["train"], "data.paths")
        except ValueError as e:
            raise _renamed(e, where) from e
        self.inputs = {
            "files": len(self.files),
            "bytes": sum(sizes),
            "first_paths": [str(f) for f in self.files[:5]],
            "skipped_symlinks": skipped,
        }
        """What the source reads: logged here and written to summary.json's `data`."""
        log.info(
            "Reading %d files, %d bytes (%s%s); %d symlinks leading out of %s skipped",
            len(self.files),
            sum(sizes),
            ", ".join(str(f) for f in self.files[:5]),
            ", ..." if len(self.files) > 5 else "",
            skipped,
            where,
        )
        self.cache: TokenCache | None = None

    @property
    def reader(self) -> str:
        """How documents come out of the files, in the cache key: "" (each file one document,
        its bytes checked as text), or "text:decompressed" when a file is .gz or .zst."""
        compressed = any(f.name.endswith(COMPRESSED_SUFFIXES) for f in self.files)
        return "text:decompressed" if compressed else ""

    def _find(self, follow_symlinks: bool) -> tuple[list[Path], int]:
        """The files whose bytes make the cache key, and the symlinks skipped finding them."""
        return find_files(self.spec.path, follow_symlinks=follow_symlinks)

    def _read(self) -> tuple[list[Path], Callable[[Path], Iterable[str]] | None]:
        """The files the cache tokenizes, and how to read documents out of each (None: whole)."""
        if not self.reader:
            return self.files, None
        from lightning_dist.data.records import iter_documents

        return self.files, lambda file: iter_documents(file, "text")

    def _check_compressed_text(self) -> None:
        """The text check of compressed files (the cache key reads their compressed bytes)."""
        if self.reader != "text:decompressed":
            return
        from lightning_dist.data.records import check_text_head

        for file in self.files:
            if file.name.endswith(COMPRESSED_SUFFIXES):
                check_text_head(file)

    def _check_splits(self, sizes: list[int]) -> None:
        """Each split holds a window, checked now rather than after the processes start: from
        the file sizes, exactly for the byte tokenizer (one id per byte, plus end of text)."""
        where = f"data.paths ({len(sizes)} files, {sum(sizes)} bytes)"
        if sum(sizes) == 0:
            raise ValueError(f"{where} holds no text; add non-empty files to data.paths")
        if self.tokenizer.name != "byte" or self.reader:
            return  # other tokenizers' and records' counts are known after tokenizing
        eos = self.tokenizer.eos_id is not None
        self._check_byte_tokens(self.files, [n + eos for n in sizes], where)

    def _check_byte_tokens(self, files: list[Path], per_file: list[int], where: str) -> None:
        """Each split holds a window, given each file's count of byte-tokenizer ids: split as
        the token cache splits them (`build_token_cache`)."""
        if len(per_file) == 1:
            held_out = max(1, int(per_file[0] * self.val_fraction))
            counts = {"train": per_file[0] - held_out, "val": held_out}
        else:
            is_val = split_files(relative_names(files), self.val_fraction)
            counts = {
                "train": sum(n for n, v in zip(per_file, is_val, strict=True) if not v),
                "val": sum(n for n, v in zip(per_file, is_val, strict=True) if v),
            }
        self.val_tokens = counts["val"]  # held to the batch by the datamodule's check
        self._check_train_tokens(counts["train"], where)

    def _check_train_tokens(self, train: int, where: str) -> None:
        if train < self.seq_len + 1:
            raise ValueError(
                f"{where}: the train split has {train} tokens, too few for one window "
                f"of data.seq_len={self.seq_len} (needs {self.seq_len + 1}); add text or lower "
                "data.seq_len"
            )

    def prepare(self) -> None:
        """Tokenize the files into the cache unless an identical cache exists."""
        files, documents = self._read()
        self.cache = build_token_cache(
            files,
            self.tokenizer,
            val_fraction=self.val_fraction,
            cache_dir=self.cache_dir,
            key=self.key,
            documents=documents,
        )

    def windows(self, split: str, separator: int | None) -> WindowSet:
        """The split's windows over the cache (built here if `prepare` did not run)."""
        if self.cache is None:
            self.cache = open_token_cache(self.key, self.cache_dir)
        if self.cache is None:
            # Used without a Trainer, or the cache folder is not shared with local rank 0.
            self.prepare()
        assert self.cache is not None  # prepared just above
        tokens = self.cache.tokens(split)
        if split == "val" and len(tokens) <= self.seq_len:
            return []  # no validation window: the datamodule's check_validation says so if used
        try:
            return TokenWindows(tokens, self.seq_len, split=split, separator=separator)
        except SplitTooSmall as e:  # other tokenizers' counts are known once tokenized
            raise SplitTooSmall(f"{self.where}: {e}") from e


class RecordSource(TextSource):
    """Records of JSON Lines, Parquet or a `datasets.save_to_disk` folder (`data/records.py`
    reads them, streamed): the text of `field` in each record is one document. Tokenized into
    the token cache like text, keyed by the files' bytes and how they are read."""

    def __init__(self, spec: DataSource, *, skip_bad_records: bool = False, **kwargs):
        self.skip_bad_records = skip_bad_records
        super().__init__(spec, **kwargs)
        if open_token_cache(self.key, self.cache_dir) is None:  # else checked as text is
            # Every record is read now, on every rank, so a bad one stops all of them in one
            # line; found later, in prepare_data on one rank, it would leave the others waiting.
            files, documents = self._read()
            assert documents is not None  # records are always read through records.py
            records, text_bytes = [0] * len(files), [0] * len(files)
            for i, file in enumerate(files):
                for text in documents(file):
                    records[i] += 1
                    text_bytes[i] += len(text.encode())
            self._check_record_text(files, records, text_bytes)

    def _check_record_text(self, files: list[Path], records: list[int], text: list[int]) -> None:
        """Before any process starts, not after: records that hold no text (an empty Parquet
        file, empty strings), and, for the byte tokenizer (one id per byte and one end of
        text per record), too few ids for a window of each split."""
        where = f"{self.where} ({len(files)} files, {sum(records)} records)"
        field = self.spec.field or "text"
        if sum(text) == 0:
            raise ValueError(
                f"{where} holds no text in field {field!r}; add records with text, or set "
                f"{self.where.removesuffix('.path')}.field to the field that holds it"
            )
        if self.tokenizer.name == "byte":
            eos = self.tokenizer.eos_id is not None
            per_file = [n + eos * r for n, r in zip(text, records, strict=True)]
            self._check_byte_tokens(files, per_file, where)

    @property
    def reader(self) -> str:
        skip = ":skip_bad_records" if self.skip_bad_records else ""
        return f"{self.spec.format}:{self.spec.field or 'text'}{skip}"

    def _find(self, follow_symlinks: bool) -> tuple[list[Path], int]:
        fmt = self.spec.format
        if fmt == "hf_disk":  # folders: every file of each is part of the key
            self.folders = path_matches(self.spec.path, self.where, folders=True)
            return [f for d in self.folders for f in sorted(d.rglob("*")) if f.is_file()], 0
        return record_files(self.spec.path, fmt, self.where), 0

    def _read(self) -> tuple[list[Path], Callable[[Path], Iterable[str]] | None]:
        from lightning_dist.data.records import iter_documents

        fmt, field, skip = self.spec.format, self.spec.field, self.skip_bad_records
        if fmt == "hf_disk":  # one folder is read as a whole, named by its state.json
            return [d / "state.json" for d in self.folders], lambda state: iter_documents(
                state.parent, fmt, field=field, skip_bad_records=skip
            )
        return self.files, lambda file: iter_documents(
            file, fmt, field=field, skip_bad_records=skip
        )


def checked_tokenizer(
    path: str | None, *, pack_documents: bool, vocab_size: int | None, formats: list[str]
) -> tuple[ByteTokenizer | HFTokenizer, int | None]:
    """`data.tokenizer` loaded, and the id that ends documents under `pack_documents` (None
    without): ValueError when packing has no end-of-text id, or when a source it tokenizes
    would make ids the model (`vocab_size`) has no embedding for."""
    tokenizer = load_tokenizer(path)
    if pack_documents and tokenizer.eos_id is None:
        raise ValueError(
            f"data.pack_documents=true needs an end-of-text token between documents, and "
            f"tokenizer {describe(tokenizer)} has none; use a tokenizer with one (or "
            "the byte-level one, data.tokenizer=null) or data.pack_documents=false"
        )
    tokenizes = any(f not in ("tokens", "megatron") for f in formats)
    if vocab_size is not None and tokenizer.vocab_size > vocab_size and tokenizes:
        raise ValueError(
            f"tokenizer vocabulary {tokenizer.vocab_size} ({describe(tokenizer)}) is larger "
            f"than model vocab_size={vocab_size}; use a model with vocab_size >= "
            f"{tokenizer.vocab_size} or a smaller tokenizer"
        )
    return tokenizer, tokenizer.eos_id if pack_documents else None


def build_source(
    spec: DataSource,
    *,
    index: int,
    where: str,
    tokenizer: ByteTokenizer | HFTokenizer,
    seq_len: int,
    val_fraction: float,
    cache_dir: str | None,
    follow_symlinks: bool,
    vocab_size: int | None,
    skip_bad_records: bool = False,
    seed: int = 0,
    val_windows: int = 0,
):
    """The source of one `data.sources` entry (checked now: files, sizes, ids, records); a
    streamed one (`stream=true`) reads `val_windows` validation windows and nothing else."""
    name = spec.label(index)
    if spec.stream:
        try:
            return StreamedSource(
                spec,
                index=index,
                name=name,
                where=f"{where}.path",
                tokenizer=tokenizer,
                seq_len=seq_len,
                val_fraction=val_fraction,
                seed=seed,
                follow_symlinks=follow_symlinks,
                skip_bad_records=skip_bad_records,
                val_windows=val_windows,
            )
        except ValueError as e:  # the text finder names data.paths
            raise _renamed(e, f"{where}.path") from e
    if spec.format == "text":
        files_key = where if where == "data.paths" else f"{where}.path"
        return TextSource(
            spec,
            name=name,
            where=files_key,
            tokenizer=tokenizer,
            seq_len=seq_len,
            val_fraction=val_fraction,
            cache_dir=cache_dir,
            follow_symlinks=follow_symlinks,
        )
    if spec.format == "tokens":
        return TokenFileSource(
            spec,
            name=name,
            where=where,
            seq_len=seq_len,
            val_fraction=val_fraction,
            vocab_size=vocab_size,
        )
    if spec.format == "chat":
        from lightning_dist.lm.chat import ChatSource

        files = record_files(spec.path, "chat", f"{where}.path")
        return ChatSource(
            spec,
            name=name,
            where=f"{where}.path",
            tokenizer=tokenizer,
            tokenizer_path=getattr(tokenizer, "path", None),
            seq_len=seq_len,
            val_fraction=val_fraction,
            files=files,
            skip_bad_records=skip_bad_records,
        )
    if spec.format == "megatron":
        return megatron_source(
            spec,
            name=name,
            where=where,
            seq_len=seq_len,
            val_fraction=val_fraction,
            vocab_size=vocab_size,
        )
    return RecordSource(
        spec,
        name=name,
        where=f"{where}.path",
        tokenizer=tokenizer,
        seq_len=seq_len,
        val_fraction=val_fraction,
        cache_dir=cache_dir,
        follow_symlinks=follow_symlinks,
        skip_bad_records=skip_bad_records,
    )


def local_specs(
    specs: list[DataSource], where: list[str], *, cache_dir: str | None, cap_gib: float
) -> list[DataSource]:
    """The sources with every URL path replaced by its local copies (`data/remote.py`; one
    line for an unknown protocol, missing credentials, no match, shards above the cap), each
    keeping the name its URL gives it."""
    from lightning_dist.data.remote import cache_folder, fetch_remote_sources, is_url

    def entries(spec: DataSource) -> list[str]:
        return [spec.path] if isinstance(spec.path, str) else list(spec.path or [])

    remote = [i for i, spec in enumerate(specs) if any(is_url(p) for p in entries(specs[i]))]
    if not remote:
        return specs
    if not (isinstance(cap_gib, int | float) and cap_gib > 0):
        raise ValueError(f"data.remote_cache_gib={cap_gib!r} must be a number above 0")
    from omegaconf import OmegaConf

    def options(spec: DataSource) -> Any:  # Hydra hands nested options over as DictConfig
        opts = spec.storage_options
        return OmegaConf.to_container(opts, resolve=True) if OmegaConf.is_config(opts) else opts

    requests = [
        {
            "paths": entries(specs[i]),
            "format": specs[i].format,
            "where": where[i] if where[i] == "data.paths" else f"{where[i]}.path",
            "storage_options": options(specs[i]),
        }
        for i in remote
    ]
    root = cache_folder(cache_dir or default_cache_dir())
    local = fetch_remote_sources(requests, cache_root=root, cap_bytes=int(cap_gib * 2**30))
    out = list(specs)
    for i, paths in zip(remote, local, strict=True):
        out[i] = dataclasses.replace(specs[i], path=paths, name=specs[i].label(i))
    return out
