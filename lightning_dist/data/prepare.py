"""Tokenize a corpus into indexed token shards, in parallel, resumably.

`prepare(...)` (and `python -m lightning_dist.data prepare`) expands the input globs, keeps its
slice of the files (file k belongs to slice k mod n: one slice per node or Slurm array task),
and hands the files to N worker processes (`shard_worker.py`). A worker streams one file's
documents (`records.iter_documents`), encodes them a batch at a time with its own
single-threaded tokenizer, appends the end-of-document token, and writes shards of at most
`shard_tokens` tokens (a document is never split) with `IndexedWriter`: under temporary names,
renamed when complete. The main process
records each finished shard in the manifest at once (`manifest.py`), so a prepare that is killed
and started again skips every finished shard, and within a half-done file skips the documents
those shards hold (they are read again, not tokenized again).

Memory is bounded per worker by one record plus one shard's index (12 bytes per document),
whatever the size of a file. Parallelism is across files: one huge file is one worker's.
"""

from __future__ import annotations

import fnmatch
import glob
import os
import queue
import sys
import time
from collections.abc import Callable
from pathlib import Path

from lightning_dist.data.manifest import (
    MANIFEST_FORMAT,
    manifest_name,
    read_manifest,
    write_manifest,
)
from lightning_dist.data.records import DEFAULT_FIELD, FORMATS
from lightning_dist.data.shard_worker import FileTask, shard_name, worker
from lightning_dist.runtime.console import print_line
from lightning_dist.runtime.refusal import ConfigError

DEFAULT_SHARD_TOKENS = 1 << 26
"""Tokens per shard (64 Mi: 128 MiB of uint16): the unit of work lost to a kill."""
# Tokenizers run their own thread pool (Rayon) unless told otherwise; N workers of one thread
# each is what `--workers` promises, and what lets N workers scale on N cores.
_ONE_THREAD = {"RAYON_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}


def expand_inputs(patterns: list[str], fmt: str) -> list[Path]:
    """The files (folders for hf_disk) the globs match, sorted; ConfigError for a glob that
    matches nothing."""
    found: set[Path] = set()
    for pattern in patterns:
        matches = [Path(m) for m in glob.glob(os.path.expanduser(pattern), recursive=True)]
        matches = [m for m in matches if (m.is_dir() if fmt == "hf_disk" else not m.is_dir())]
        if not matches:
            raise ConfigError(
                f"--input {pattern!r} matches no {'folder' if fmt == 'hf_disk' else 'file'}"
            )
        found.update(m.resolve() for m in matches)
    return sorted(found)


def _could_match(pattern: str, path: Path) -> bool:
    """Whether the glob `pattern` (absolute) matches `path`: exactly, part by part, without
    `**`; with it, `*` may cross folders too (fnmatch's, a little wider than glob's)."""
    if "**" in pattern:
        return fnmatch.fnmatchcase(str(path), pattern)
    parts = Path(pattern).parts
    return len(parts) == len(path.parts) and all(
        fnmatch.fnmatchcase(p, q) for p, q in zip(path.parts, parts, strict=True)
    )


def check_output_outside_inputs(patterns: list[str], files: list[Path], output: Path) -> None:
    """ConfigError when the globs match, or would match once written, a file of the output
    folder: a prepare started again after a kill would read its own shards as input."""
    out = output.expanduser().resolve()
    written = [out / "manifest.json", out / "shard-00000.bin", out / "shard-00000.idx"]
    for pattern in patterns:
        absolute = os.path.abspath(os.path.expanduser(pattern))
        matched = [f for f in files if f.is_relative_to(out) and _could_match(absolute, f)]
        matched += [w for w in written if _could_match(absolute, w)]
        if matched:
            raise ConfigError(
                f"--output {str(output)!r} lies where --input {pattern!r} reads (it matches "
                f"{matched[0]}): prepare would read its own shards as input; give an --output "
                "outside the input, or an --input that does not reach it"
            )


def input_names(files: list[Path]) -> list[str]:
    """Each file's name relative to the files' common folder (stable when the corpus moves)."""
    if len(files) == 1:
        return [files[0].name]
    common = Path(os.path.commonpath([str(f) for f in files]))
    return [f.relative_to(common).as_posix() for f in files]


def prepare(
    inputs: list[str],
    output: str | os.PathLike,
    *,
    fmt: str = "jsonl",
    field: str | None = None,
    tokenizer: str | None = None,
    workers: int = 1,
    shard_index: int = 0,
    shard_count: int = 1,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    skip_bad_records: bool = False,
    progress: bool = True,
    on_shard: Callable[[dict], None] | None = None,
) -> dict:
    """Tokenize this slice of `inputs` into `output`; returns the slice's final manifest.

    `on_shard` is called here, in this process, with each finished shard's manifest record once
    the manifest on disk lists it."""
    from lightning_dist.data.indexed import indexed_dtype
    from lightning_dist.data.tokenizer import load_tokenizer

    if fmt not in FORMATS:
        raise ConfigError(f"--format {fmt!r} is not one of {', '.join(FORMATS)}")
    field = None if fmt == "text" else field or DEFAULT_FIELD
    if not 0 <= shard_index < shard_count:
        raise ConfigError(f"--shard-index {shard_index} must be in 0..{shard_count - 1}")
    for option, value in (("--workers", workers), ("--shard-tokens", shard_tokens)):
        if value < 1:
            raise ConfigError(f"{option} {value} must be 1 or more")
    if Path(output).exists() and not Path(output).is_dir():
        raise ConfigError(f"--output {str(output)!r} is a file, not a folder; give a folder")
    files = expand_inputs(inputs, fmt)
    check_output_outside_inputs(inputs, files, Path(output))
    names = input_names(files)
    mine = list(range(shard_index, len(files), shard_count))
    tok = load_tokenizer(tokenizer, "--tokenizer")
    folder = Path(output)
    folder.mkdir(parents=True, exist_ok=True)
    manifest_path = folder / manifest_name(shard_index, shard_count)
    fresh = {
        "format": MANIFEST_FORMAT,
        "tokenizer": {"name": tok.name, "vocab_size": tok.vocab_size, "eos_id": tok.eos_id},
        "dtype": indexed_dtype(tok.vocab_size).name,
        "input": {"format": fmt, "field": field},
        "slice": [shard_index, shard_count],
        "complete": False,
        "files": {},
        "shards": [],
    }
    manifest = _resume(manifest_path, fresh, folder) if manifest_path.exists() else fresh
    gone = sorted(set(manifest["files"]) - {names[i] for i in mine})
    if gone:  # its shards would stay listed beside the same documents under a new name
        raise ConfigError(
            f"{manifest_path} lists input {gone[0]!r}, which is not among this slice's inputs; "
            "give the same --input and slice as before, or prepare into a new --output"
        )
    tasks = []
    for i in mine:
        record = manifest["files"].setdefault(
            names[i], {"bytes": _size(files[i]), "complete": False, "documents": 0, "skipped": 0}
        )
        if record["bytes"] != _size(files[i]):
            raise ConfigError(
                f"{files[i]} changed since {manifest_path} was written ({record['bytes']} -> "
                f"{_size(files[i])} bytes); prepare into a new --output"
            )
        if record["complete"]:
            continue
        done = [s for s in manifest["shards"] if s["source"] == names[i]]
        tasks.append(
            FileTask(str(files[i]), names[i], sum(s["documents"] for s in done), len(done))
        )
        _remove_temporaries(folder, names[i])
    write_manifest(manifest_path, manifest)
    settings = dict(
        tokenizer=tokenizer,
        vocab_size=tok.vocab_size,
        eos_id=tok.eos_id,
        fmt=fmt,
        field=field,
        folder=str(folder),
        shard_tokens=shard_tokens,
        skip_bad_records=skip_bad_records,
    )
    if tasks:
        count = min(workers, len(tasks))
        _run_workers(tasks, settings, count, manifest, manifest_path, progress, on_shard)
    manifest["complete"] = True
    write_manifest(manifest_path, manifest)
    return manifest


def _size(path: Path) -> int:
    if path.is_dir():  # an hf_disk folder: its files together
        return sum(p.stat().st_size for p in sorted(path.iterdir()) if p.is_file())
    return path.stat().st_size


def _resume(path: Path, fresh: dict, folder: Path) -> dict:
    """The manifest of an earlier prepare of this slice, less shards whose files are gone or of
    the wrong size (and every later part of their file, which is redone); ConfigError when it
    was made with another tokenizer or input format."""
    old = read_manifest(path)
    for key in ("tokenizer", "dtype", "input", "slice"):
        if old.get(key) != fresh[key]:
            raise ConfigError(
                f"{path} was prepared with {key} {old.get(key)}, not {fresh[key]}; prepare into a "
                "new --output (or delete that folder)"
            )
    kept, broken = [], set()
    for shard in sorted(old["shards"], key=lambda s: (s["source"], s["part"])):
        if shard["source"] not in broken and all(
            _file_size(folder / f"{shard['name']}.{kind}") == shard[f"{kind}_bytes"]
            for kind in ("bin", "idx")
        ):
            kept.append(shard)
            continue
        broken.add(shard["source"])
        old["files"].get(shard["source"], {})["complete"] = False
    old["shards"] = kept
    old["complete"] = False
    return old


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return -1


def _remove_temporaries(folder: Path, source: str) -> None:
    # Left by a killed worker of this slice (no other slice writes shards of this file).
    prefix = shard_name(source, 0)[:-5]
    for leftover in folder.glob(f"{glob.escape(prefix)}*.tmp-*"):
        leftover.unlink(missing_ok=True)


def _run_workers(tasks, settings, count, manifest, manifest_path, progress, on_shard) -> None:
    import multiprocessing

    # spawn: a fresh interpreter per worker, so no tokenizer thread pool is inherited by fork.
    context = multiprocessing.get_context("spawn")
    todo, events = context.Queue(), context.Queue()
    for task in sorted(tasks, key=lambda t: -_size(Path(t.path))):  # largest first
        todo.put(task)
    for _ in range(count):
        todo.put(None)
    saved = {key: os.environ.get(key) for key in _ONE_THREAD}
    os.environ.update(_ONE_THREAD)  # inherited by the spawned workers
    try:
        procs = [
            context.Process(target=worker, args=(todo, events, settings, os.getpid()), daemon=True)
            for _ in range(count)
        ]
        for proc in procs:
            proc.start()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    meter = _Progress(len(tasks), progress)
    try:
        _collect(events, procs, len(tasks), manifest, manifest_path, meter, on_shard)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
            proc.join()
        meter.close()
    if progress:
        print_line(meter.line())


def _collect(events, procs, files_left, manifest, manifest_path, meter, on_shard) -> None:
    while files_left:
        try:
            kind, payload = events.get(timeout=0.5)
        except queue.Empty:
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if dead:
                raise ConfigError(
                    f"a prepare worker exited with status {dead[0].exitcode} (killed, or out of "
                    "memory?); run the same command again: finished shards are kept"
                ) from None
            continue
        if kind == "error":
            raise ConfigError(payload)
        if kind == "shard":
            manifest["shards"].append(payload)
            write_manifest(manifest_path, manifest)
            if on_shard is not None:
                on_shard(payload)
        elif kind == "file":
            name, documents, skipped = payload
            manifest["files"][name].update(complete=True, documents=documents, skipped=skipped)
            write_manifest(manifest_path, manifest)
            files_left -= 1
            meter.file_done()
        elif kind == "tokens":
            meter.add(*payload)


class _Progress:
    """Files done, tokens and tokens/s: a live bar at a terminal, else a line every 10 s."""

    def __init__(self, files: int, enabled: bool):
        self.files, self.files_done, self.tokens, self.documents = files, 0, 0, 0
        self.start = self.last_line = time.monotonic()
        self.enabled = enabled
        self.bar = None
        if enabled and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import Progress

            self.bar = Progress(console=Console(stderr=True), transient=True)
            self.bar.start()
            self.task = self.bar.add_task("prepare", total=files)

    def add(self, tokens: int, documents: int) -> None:
        self.tokens, self.documents = self.tokens + tokens, self.documents + documents
        self._show()

    def file_done(self) -> None:
        self.files_done += 1
        self._show()

    def line(self) -> str:
        rate = self.tokens / max(time.monotonic() - self.start, 1e-9)
        return (
            f"prepare: {self.files_done}/{self.files} files, {self.documents:,} documents, "
            f"{self.tokens:,} tokens, {rate:,.0f} tokens/s"
        )

    def _show(self) -> None:
        if self.bar is not None:
            self.bar.update(self.task, completed=self.files_done, description=self.line())
        elif self.enabled and time.monotonic() - self.last_line >= 10:
            print_line(self.line())
            self.last_line = time.monotonic()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
