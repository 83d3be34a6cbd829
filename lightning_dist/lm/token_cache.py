"""Finding the corpus files, and tokenizing them once into a memory-mapped cache.

The cache lives in `<cache_dir>/<key>.{train,val}.bin` plus `<key>.json`. The key is a sha256 over
the tokenizer, the validation setting, and the relative path and bytes of every file, so any
change to the corpus or the tokenizer makes a new cache and an unchanged one is reused. Files are
written to a temporary name and moved into place with `os.replace`, the metadata last, so a run
killed mid-way never leaves a cache that looks complete.
"""

from __future__ import annotations

import codecs
import fnmatch
import glob
import hashlib
import json
import logging
import os
import re
import stat
import sys
import sysconfig
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lightning_dist.lm.tokenizer import ByteTokenizer, HFTokenizer

log = logging.getLogger(__name__)

TEXT_SUFFIXES = (".py", ".txt", ".md")
"""File types taken from a directory given in `data.paths`."""
CACHE_FORMAT = 1
"""Bumped whenever the layout of the cache files changes, so old caches are not misread."""
_EXCLUDED_DIRS = {"site-packages", "dist-packages"}


def default_corpus() -> list[Path]:
    """Every `.py` file of this interpreter's standard library, without installed packages."""
    root = Path(sysconfig.get_paths()["stdlib"]).resolve()
    files = []
    for folder, subdirs, names in os.walk(root):
        # Pruning site-packages here, rather than filtering afterwards, skips walking every
        # installed package (torch alone has thousands of files).
        subdirs[:] = [d for d in subdirs if d not in _EXCLUDED_DIRS]
        files.extend(Path(folder, n) for n in names if n.endswith(".py"))
    return sorted({p for p in files if p.is_file()})


def resolve_files(
    paths: Sequence[str] | str | None, *, follow_symlinks: bool = False
) -> list[Path]:
    """Expand `data.paths` into a sorted, deduplicated list of absolute file paths.

    Each entry is a file, a directory (all `*.py`, `*.txt` and `*.md` files under it,
    recursively) or a glob pattern (`**` matches across directories; a directory it matches is
    expanded like a directory entry). `None` or an empty list means the default corpus: the
    standard library's `.py` files. An entry that matches no file raises ValueError naming it.
    Symlinks under a directory or glob root are followed only while they stay inside that root,
    unless `follow_symlinks` (see `find_files`).
    """
    return find_files(paths, follow_symlinks=follow_symlinks)[0]


def find_files(
    paths: Sequence[str] | str | None, *, follow_symlinks: bool = False
) -> tuple[list[Path], int]:
    """`resolve_files`, and how many symlinks were skipped because they lead out of their root
    (a `sub/link -> /etc` under a corpus folder must not pull /etc in)."""
    if paths is None:
        return default_corpus(), 0
    if isinstance(paths, str | os.PathLike):
        paths = [paths]
    entries = [str(p) for p in paths]
    if not entries:
        return default_corpus(), 0
    found: set[Path] = set()
    skipped = 0
    for entry in entries:
        walker = _Walker(follow_symlinks)
        matches = walker.expand(entry)
        skipped += walker.skipped
        if not matches:
            raise ValueError(f"data.paths: {entry!r} matches no file")
        found.update(matches)
    return sorted(found), skipped


def special_file_kind(path: Path) -> str:
    """What a path that is neither a regular file nor a folder is, in a few words."""
    mode = path.stat().st_mode
    kinds = (
        (stat.S_ISFIFO, "a named pipe (FIFO)"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    )
    return next((name for test, name in kinds if test(mode)), "a special file")


class _Walker:
    """Directory walks and glob matching that follow a symlink only inside the entry's root.

    Glob semantics are those of `glob.glob(recursive=True)`: `*`, `?` and `[...]` match within
    one path segment and not a leading dot, `**` matches any number of directories.
    """

    def __init__(self, follow_symlinks: bool):
        self.follow = follow_symlinks
        self.skipped = 0
        self.root = Path("/")

    def expand(self, entry: str) -> list[Path]:
        path = Path(entry).expanduser()
        if path.is_file():  # named explicitly: taken wherever a link leads
            return [path.resolve()]
        if path.exists() and not path.is_dir():  # a named pipe, socket or device: no text file
            raise ValueError(
                f"data.paths: {entry!r} is {special_file_kind(path)}, not a regular file; point "
                "data.paths at text files or folders of them"
            )
        if path.is_dir():
            self.root = path.resolve()
            return self._text_files(path, self.root, frozenset())
        parts = path.parts
        fixed = next((i for i, part in enumerate(parts) if glob.has_magic(part)), len(parts))
        base = Path(*parts[:fixed]) if fixed else Path(".")
        if not base.is_dir():
            return []
        self.root = base.resolve()
        out: list[Path] = []
        for match, is_dir in self._glob(base, self.root, parts[fixed:], frozenset()):
            out.extend(
                self._text_files(match, match.resolve(), frozenset())
                if is_dir
                else [match.resolve()]
            )
        return out

    def _children(self, folder: Path, real: Path, ancestors: frozenset):
        """(path, real path, is_dir) of each entry of `folder`, by the symlink rule."""
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as e:
            raise ValueError(f"data.paths: cannot list {folder} ({e.strerror})") from e
        for entry in entries:
            path = Path(entry.path)
            child_real = real / entry.name
            if entry.is_symlink():
                child_real = path.resolve()
                if not child_real.exists():
                    continue  # dangling
                if not self.follow and not child_real.is_relative_to(self.root):
                    self.skipped += 1
                    continue
            is_dir = entry.is_dir()
            if is_dir and (child_real in ancestors or child_real == real):
                continue  # a link back up the tree would loop
            yield path, child_real, is_dir

    def _text_files(self, folder: Path, real: Path, ancestors: frozenset) -> list[Path]:
        out = []
        for path, child_real, is_dir in self._children(folder, real, ancestors):
            if is_dir:
                out.extend(self._text_files(path, child_real, ancestors | {real}))
            elif path.suffix in TEXT_SUFFIXES and path.is_file():
                out.append(child_real)
        return out

    def _glob(self, folder: Path, real: Path, segments: tuple[str, ...], ancestors: frozenset):
        """(path, is_dir) of everything under `folder` that the pattern segments match."""
        head, rest = segments[0], segments[1:]
        if head == "**":
            if rest:
                yield from self._glob(folder, real, rest, ancestors)
            for path, child_real, is_dir in self._children(folder, real, ancestors):
                if path.name.startswith("."):
                    continue
                if not rest:
                    yield path, is_dir
                if is_dir:
                    yield from self._glob(path, child_real, segments, ancestors | {real})
            return
        for path, child_real, is_dir in self._children(folder, real, ancestors):
            if path.name.startswith(".") and not head.startswith("."):
                continue
            if not fnmatch.fnmatchcase(path.name, head):
                continue
            if not rest:
                yield path, is_dir
            elif is_dir:
                yield from self._glob(path, child_real, rest, ancestors | {real})


def file_sizes(files: Sequence[Path]) -> list[int]:
    """The size of each file in bytes; ValueError naming the first that cannot be read."""
    sizes = []
    for file in files:
        try:
            fd = os.open(file, os.O_RDONLY)
        except OSError as e:
            raise ValueError(
                f"data.paths: cannot read {file} ({e.strerror}); fix its permissions or leave it "
                "out of data.paths"
            ) from e
        try:
            sizes.append(os.fstat(fd).st_size)
        finally:
            os.close(fd)
    return sizes


def default_cache_dir() -> Path:
    """`$LIGHTNING_DIST_CACHE/tokens` when the variable is set, else `~/.cache/lightning_dist/tokens`."""
    base = os.environ.get("LIGHTNING_DIST_CACHE")
    root = Path(base).expanduser() if base else Path.home() / ".cache" / "lightning_dist"
    return root / "tokens"


def relative_names(files: Sequence[Path]) -> list[str]:
    """Paths relative to the files' common folder: stable across machines, used for the split."""
    if len(files) == 1:
        return [files[0].name]
    common = Path(os.path.commonpath([str(f.parent) for f in files]))
    return [f.relative_to(common).as_posix() for f in files]


def split_files(names: Sequence[str], val_fraction: float) -> list[bool]:
    """Which files go to validation (True), chosen by a stable hash of each relative name.

    A file is held out when sha256(name) mod 1000 < val_fraction * 1000. With two or more files
    at least one is held out and at least one is kept for training. A single file is not split
    here: the cache builder holds out the last `val_fraction` of its tokens instead.
    """
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"data.val_fraction={val_fraction} must be between 0 and 1 (exclusive)")
    if len(names) < 2:
        return [False] * len(names)
    buckets = [int.from_bytes(hashlib.sha256(n.encode()).digest()[:8], "big") for n in names]
    is_val = [b % 1000 < val_fraction * 1000 for b in buckets]
    if not any(is_val):
        is_val[min(range(len(names)), key=lambda i: (buckets[i], names[i]))] = True
    if all(is_val):
        is_val[max(range(len(names)), key=lambda i: (buckets[i], names[i]))] = False
    return is_val


@dataclass(frozen=True)
class TokenCache:
    """Where a built cache lives and what it holds."""

    key: str
    directory: Path
    meta: dict
    built: bool
    """True when this call tokenized the corpus; False when an existing cache was reused."""

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.meta["dtype"])

    def path(self, split: str) -> Path:
        """The token file of `split` ("train" or "val")."""
        return self.directory / f"{self.key}.{split}.bin"

    def tokens(self, split: str) -> np.ndarray:
        """The tokens of `split` as a read-only memory map (an empty array when there are none)."""
        if self.meta["tokens"][split] == 0:
            return np.zeros(0, dtype=self.dtype)
        return np.memmap(self.path(split), dtype=self.dtype, mode="r")


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits, else uint32: halves the cache for vocabularies up to 65,535."""
    return np.dtype(np.uint16 if vocab_size <= 65535 else np.uint32)


MAX_NOT_UTF8 = 0.3
"""The share of the corpus's bytes that may be invalid UTF-8. The default corpus holds a few
legitimately non-UTF-8 sources (the standard library's `test/encoded_modules/module_koi8_r.py`
is 42% such bytes), so the rule is over all files together; a NUL byte is refused in any file."""


_ESCAPED_BYTE = re.compile("[\udc80-\udcff]")
_DECODE_CHUNK = 1 << 20


def invalid_utf8_bytes(data: bytes) -> int:
    """How many bytes of `data` are not part of valid UTF-8 (decoded 1 MiB at a time: a large
    file costs no more than a few MiB of text)."""
    if data.isascii():
        return 0
    decoder = codecs.getincrementaldecoder("utf-8")("surrogateescape")
    view, count = memoryview(data), 0
    for start in range(0, len(data), _DECODE_CHUNK):  # each undecodable byte: one surrogate
        text = decoder.decode(
            view[start : start + _DECODE_CHUNK], final=start + _DECODE_CHUNK >= len(data)
        )
        count += len(_ESCAPED_BYTE.findall(text))
    return count


COMPRESSED_MAGIC = (
    (b"\x1f\x8b", "gzip-compressed"), (b"\x28\xb5\x2f\xfd", "zstd-compressed"),
    (b"\xfd7zXZ\x00", "xz-compressed"),
    (b"PK\x03\x04", "a zip archive"),
)  # fmt: skip
"""The first bytes of the compressed formats a corpus is often shipped in."""


class TextCheck:
    """Fed each file's bytes as the cache key reads them: refuses data that is not text (a NUL
    byte in a file, or more than `MAX_NOT_UTF8` of all bytes invalid UTF-8), with ValueError
    naming the file."""

    def __init__(self) -> None:
        self.total = self.invalid = 0
        self.worst: tuple[int, Path | None] = (0, None)

    def add(self, file: Path, data: bytes) -> None:
        packed = next((name for magic, name in COMPRESSED_MAGIC if data.startswith(magic)), None)
        if packed:  # checked first: compressed bytes hold NULs too, which would say less
            raise ValueError(
                f"data.paths: {file} is {packed}, not text; decompress it or leave it out of "
                "data.paths"
            )
        if b"\0" in data:
            raise ValueError(
                f"data.paths: {file} is not text (it holds NUL bytes at offset "
                f"{data.index(0)}); remove it from data.paths or point data.paths at text files"
            )
        invalid = invalid_utf8_bytes(data)
        self.total, self.invalid = self.total + len(data), self.invalid + invalid
        self.worst = max(self.worst, (invalid, file), key=lambda w: w[0])

    def finish(self) -> None:
        if self.total and self.invalid / self.total > MAX_NOT_UTF8:
            count, file = self.worst
            raise ValueError(
                f"data.paths is not text: {self.invalid / self.total:.0%} of its "
                f"{self.total} bytes are not valid UTF-8 (at most {MAX_NOT_UTF8:.0%}); the "
                f"worst file is {file} ({count} such bytes); convert it to UTF-8 or leave it "
                "out of data.paths"
            )


def cache_key(
    files: Sequence[Path],
    tokenizer: ByteTokenizer | HFTokenizer,
    val_fraction: float,
    reader: str = "",
) -> str:
    """The content hash that names a cache (reads every file once). Files read as text (no
    `reader`) are refused when they are not text (`TextCheck`); `reader` names how records are
    read out of other files (e.g. "jsonl:text") and is part of the key."""
    h = hashlib.sha256()
    h.update(
        f"format={CACHE_FORMAT}\0tok={tokenizer.name}\0vocab={tokenizer.vocab_size}\0".encode()
    )
    h.update(f"eos={tokenizer.eos_id}\0val_fraction={val_fraction!r}\0".encode())
    if reader:  # absent for text files, so their keys stay those of earlier caches
        h.update(f"reader={reader}\0".encode())
    text = TextCheck()
    for name, file in zip(relative_names(files), files, strict=True):
        data = file.read_bytes()
        if not reader:
            text.add(file, data)
        # Length-prefixing keeps (name, bytes) boundaries unambiguous.
        h.update(f"{len(name)}:{name}{len(data)}:".encode())
        h.update(data)
    text.finish()
    return h.hexdigest()[:32]


def build_token_cache(
    files: Sequence[Path],
    tokenizer: ByteTokenizer | HFTokenizer,
    *,
    val_fraction: float,
    cache_dir: str | Path | None = None,
    key: str | None = None,
    documents: Callable[[Path], Iterable[str | bytes]] | None = None,
) -> TokenCache:
    """Tokenize `files` into the cache, or reuse the cache when one with the same key exists.
    Each file is one document, or the documents `documents(file)` reads out of it (records);
    the end-of-text id ends each document."""
    directory = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    key = key or cache_key(files, tokenizer, val_fraction)
    existing = open_token_cache(key, directory)
    if existing is not None:
        return existing
    directory.mkdir(parents=True, exist_ok=True)
    names = relative_names(files)
    is_val = split_files(names, val_fraction)
    dtype = token_dtype(tokenizer.vocab_size)
    start = time.perf_counter()
    log.info("Tokenizing %d files with %s into %s", len(files), tokenizer.name, directory)
    suffix = _tmp_suffix()
    tmp = {s: directory / f"{key}.{s}.bin{suffix}" for s in ("train", "val")}
    counts = {"train": 0, "val": 0}
    try:
        with open(tmp["train"], "wb") as train_f, open(tmp["val"], "wb") as val_f:
            for i in _progress(range(len(files)), total=len(files)):
                ids = _file_ids(files[i], tokenizer, documents).astype(dtype, copy=False)
                if len(files) == 1:
                    n_val = max(1, int(len(ids) * val_fraction))
                    train_f.write(ids[: len(ids) - n_val].tobytes())
                    val_f.write(ids[len(ids) - n_val :].tobytes())
                    counts["train"] += len(ids) - n_val
                    counts["val"] += n_val
                else:
                    split = "val" if is_val[i] else "train"
                    (val_f if is_val[i] else train_f).write(ids.tobytes())
                    counts[split] += len(ids)
        for split, path in tmp.items():
            os.replace(path, directory / f"{key}.{split}.bin")
    finally:
        for path in tmp.values():
            path.unlink(missing_ok=True)
    meta = {
        "format": CACHE_FORMAT,
        "dtype": dtype.name,
        "tokenizer": tokenizer.name,
        "vocab_size": tokenizer.vocab_size,
        "eos_id": tokenizer.eos_id,
        "val_fraction": val_fraction,
        "tokens": counts,
        "files": {"train": len(files) - sum(is_val), "val": sum(is_val)},
        "split": "tokens" if len(files) == 1 else "files",
    }
    _write_json_atomic(directory / f"{key}.json", meta)
    log.info(
        "Tokenized %d train / %d val tokens from %d files in %.1fs",
        counts["train"],
        counts["val"],
        len(files),
        time.perf_counter() - start,
    )
    return TokenCache(key=key, directory=directory, meta=meta, built=True)


def _file_ids(
    file: Path,
    tokenizer: ByteTokenizer | HFTokenizer,
    documents: Callable[[Path], Iterable[str | bytes]] | None,
) -> np.ndarray:
    """The ids of one file's documents, each ended by the end-of-text id (when there is one)."""
    texts = documents(file) if documents is not None else [file.read_bytes()]
    end = np.asarray([] if tokenizer.eos_id is None else [tokenizer.eos_id], dtype=np.int64)
    pieces = [np.concatenate([tokenizer.encode(text).astype(np.int64), end]) for text in texts]
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)


def open_token_cache(key: str, cache_dir: str | Path | None = None) -> TokenCache | None:
    """The complete cache with this key, or None when there is none (or it is damaged)."""
    directory = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    meta_path = directory / f"{key}.json"
    if not meta_path.is_file():
        return None
    try:
        meta = json.loads(meta_path.read_text())
        itemsize = np.dtype(meta["dtype"]).itemsize
        for split in ("train", "val"):
            size = (directory / f"{key}.{split}.bin").stat().st_size
            if size != meta["tokens"][split] * itemsize:
                return None
    except (OSError, ValueError, KeyError, TypeError):
        # A damaged or foreign cache is rebuilt rather than trusted.
        return None
    return TokenCache(key=key, directory=directory, meta=meta, built=False)


def _write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + _tmp_suffix())
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def _tmp_suffix() -> str:
    # Unique per process even across hosts that share the cache folder (pids can collide).
    return f".tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _progress(items: Iterable[int], total: int) -> Iterable[int]:
    # A live bar only helps a person at a terminal; in logs and CI it would be noise.
    if not sys.stderr.isatty():
        yield from items
        return
    from rich.console import Console
    from rich.progress import Progress

    with Progress(console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task("Tokenizing", total=total)
        for item in items:
            yield item
            progress.advance(task)
