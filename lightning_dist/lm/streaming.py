"""Streamed sources (`data.sources[i].stream=true`): documents tokenized on the fly in the
DataLoader's workers, so the first step waits for one chunk of windows, not for the corpus.

The stream of a source is the same on every rank and every number of workers:

- epoch e reads the source's files (folders for hf_disk) in a permutation seeded by (seed,
  source, e), each file's documents in file order, less the validation documents
  (`held_out`);
- the documents are tokenized in `Block`s (at most `BLOCK_DOCUMENTS` documents or
  `BLOCK_CHARACTERS` characters of one file), each document ended by the end-of-text id, and
  laid end to end; window i of the epoch is `tokens[i*seq_len : i*seq_len + seq_len + 1]`, as
  `TokenWindows` cuts a prepared source (the epoch's last partial window is dropped);
- the windows are shuffled a chunk at a time, each chunk in a permutation seeded by (seed,
  source, epoch, chunk); chunks grow from `FIRST_CHUNK` windows, doubling, to `shuffle_windows`
  (so the first step waits for a small one);
- draw d of the source (`mixture.MixturePlan`) is the d-th window of that sequence, across
  epochs: an exhausted source starts its next epoch in a new order.

With `data.num_workers` = W, worker w tokenizes blocks w, w + W, ... and reads past the others
without tokenizing them; the DataLoader takes the blocks from its workers in turn, so they come
back in order. Every rank reads the whole stream and keeps its own samples of each global
batch: nothing depends on the number of ranks.

The position: a chunk's first window is found again from (epoch, file position, block, token
offset), so the checkpoint holds that, the chunk's number and the windows of it already drawn
(`WindowStream.position_at`); a resume on any number of ranks reads its file up to that block
again (without tokenizing) and tokenizes one chunk again.
"""

from __future__ import annotations

import contextlib
import itertools
from collections import deque
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, default_collate, get_worker_info

from lightning_dist.data.records import ReadStats, iter_documents
from lightning_dist.lm.datasets import TokenWindows, WindowSet, packed_window
from lightning_dist.lm.mixture import MixturePlan
from lightning_dist.lm.sampling import GlobalBatchSampler
from lightning_dist.lm.source_files import path_matches, record_files
from lightning_dist.lm.token_cache import find_files, relative_names, split_files
from lightning_dist.lm.tokenizer import load_tokenizer
from lightning_dist.options.data import DataSource
from lightning_dist.runtime.refusal import ConfigError

BLOCK_DOCUMENTS = 64
BLOCK_CHARACTERS = 1 << 18
"""A block, the unit a worker tokenizes, ends after this many documents or characters."""
FIRST_CHUNK = 64
"""Windows in an epoch's first chunk; each next chunk is twice as large, up to
`shuffle_windows`: the first step waits for 64 windows, not for a whole buffer."""
_FILE_ORDER, _CHUNK_ORDER = 0, 1  # seed tags: the two permutations never share a seed


class Skipped(NamedTuple):
    """Bad records skipped (`data.skip_bad_records`): how many, and where the first was."""

    records: int
    first: str

    def add(self, other: Skipped) -> Skipped:
        return Skipped(self.records + other.records, self.first or other.first)


StreamBlock = tuple[int, int, int, np.ndarray, Skipped]
"""(epoch, file position, block, token ids, bad records skipped since the block before)."""


@dataclass(frozen=True)
class StreamSpec:
    """What a worker needs to read one streamed source (plain values: it is pickled)."""

    name: str
    format: str
    files: tuple[str, ...]
    """Files (folders for hf_disk), sorted: permuted per epoch."""
    field: str | None
    skip_bad_records: bool
    tokenizer_path: str | None
    val_fraction: float
    val_files: tuple[bool, ...]
    """format text (a file is a document): the files held out for validation."""
    seed: tuple[int, int]
    """(run seed, source index): every permutation of the source is seeded from it."""

    def documents(
        self, index: int, stats: ReadStats | None = None
    ) -> Generator[tuple[bool, str], None, None]:
        """(held out for validation, text) of each document of file `index`, in file order;
        the bad records skipped are counted in `stats` (`data.skip_bad_records`)."""

        path = self.files[index]
        if self.format == "text":
            for text in iter_documents(path, "text"):
                yield self.val_files[index], text
            return
        texts = iter_documents(
            path,
            self.format,
            field=self.field,
            skip_bad_records=self.skip_bad_records,
            stats=stats,
            quiet=True,
        )
        for k, text in enumerate(texts):
            yield held_out(k, self.val_fraction), text

    def blocks(self, index: int) -> Iterator[tuple[list[str], Skipped]]:
        """The training documents of file `index`, in blocks, each with the bad records skipped
        since the block before it."""
        block: list[str] = []
        characters = 0
        stats, counted = ReadStats(), 0
        for is_val, text in self.documents(index, stats):
            if is_val:
                continue
            block.append(text)
            characters += len(text)
            if len(block) >= BLOCK_DOCUMENTS or characters >= BLOCK_CHARACTERS:
                yield block, Skipped(stats.skipped - counted, stats.first_skipped)
                block, characters, counted = [], 0, stats.skipped
        if block or stats.skipped > counted:
            yield block, Skipped(stats.skipped - counted, stats.first_skipped)

    def file_order(self, epoch: int) -> list[int]:
        """The files of `epoch`, in the order they are read."""
        rng = np.random.default_rng([*self.seed, _FILE_ORDER, epoch])
        return rng.permutation(len(self.files)).tolist()


def held_out(k: int, fraction: float) -> bool:
    """Whether a file's k-th record is a validation document: evenly spaced, `fraction` of
    them, the first at about k = 1 / (2 fraction) (so a file of a few records has one)."""
    return int((k + 1) * fraction + 0.5) > int(k * fraction + 0.5)


def tokenize(tokenizer: Any, texts: list[str]) -> np.ndarray:
    """The ids of `texts`, each ended by the end-of-text id when the tokenizer has one."""
    end = np.array([] if tokenizer.eos_id is None else [tokenizer.eos_id], np.int64)
    pieces = [np.concatenate([ids, end]).astype(np.int32) for ids in tokenizer.encode_batch(texts)]
    return np.concatenate(pieces) if pieces else np.zeros(0, np.int32)


class BlockStream(IterableDataset):
    """The tokenized blocks of a source's stream from `start` = (epoch, file position, block),
    epoch after epoch: `StreamBlock`s. In a DataLoader worker, only every W-th block is
    tokenized (see the module docstring), and a refusal is its last item (`_in_worker`)."""

    def __init__(self, spec: StreamSpec, start: tuple[int, int, int]):
        self.spec, self.start = spec, start

    def __iter__(self) -> Iterator[StreamBlock | ConfigError]:
        info = get_worker_info()
        if info is None:
            return self._blocks(0, 1)
        return self._in_worker(info.id, info.num_workers)

    def _in_worker(self, worker: int, workers: int) -> Iterator[StreamBlock | ConfigError]:
        """A worker's blocks, then, for a refusal (a bad record), the error itself as its last
        item: the training process raises it (`WindowStream`), as one line, where the
        DataLoader would re-raise it with the worker's traceback in its message."""
        try:
            yield from self._blocks(worker, workers)
        except ConfigError as e:
            yield e

    def _blocks(self, worker: int, workers: int) -> Iterator[StreamBlock]:
        tokenizer = load_tokenizer(self.spec.tokenizer_path)
        epoch, first_position, first_block = self.start
        ordinal = 0
        while True:
            order, blocks = self.spec.file_order(epoch), 0
            for position in range(first_position, len(order)):
                for block, (texts, skipped) in enumerate(self.spec.blocks(order[position])):
                    if block < first_block:
                        continue
                    if ordinal % workers == worker:
                        yield epoch, position, block, tokenize(tokenizer, texts), skipped
                    ordinal, blocks = ordinal + 1, blocks + 1
                first_block = 0
            if blocks == 0 and first_position == 0:
                raise ConfigError(
                    f"streamed source {self.spec.name!r} holds no training "
                    "document (every one is held out for validation)"
                )
            epoch, first_position = epoch + 1, 0


class WindowStream:
    """One source's windows, draw after draw (`take`), from a saved `position` or the start."""

    def __init__(
        self,
        spec: StreamSpec,
        *,
        seq_len: int,
        shuffle_windows: int,
        num_workers: int,
        position: dict[str, int] | None,
        keep_draws: int,
    ):
        self.spec, self.seq_len, self.shuffle_windows = spec, seq_len, shuffle_windows
        self.keep_draws = keep_draws
        at = position or {
            "draw": 0,
            "epoch": 0,
            "chunk": 0,
            "file_position": 0,
            "block": 0,
            "offset": 0,
            "skip": 0,
        }
        self.draw, self.epoch, self.chunk_index = at["draw"] - at["skip"], at["epoch"], at["chunk"]
        start = (at["epoch"], at["file_position"], at["block"])
        blocks = BlockStream(spec, start)
        self.blocks: Iterator[StreamBlock | ConfigError] = (
            iter(DataLoader(blocks, batch_size=None, num_workers=num_workers))
            if num_workers
            else iter(blocks)
        )
        self.buffer = np.zeros(0, np.int32)
        self.segments: list[list[int]] = []
        """[start in buffer, file position, block, offset in block] of each block in buffer."""
        self.first_offset = at["offset"]
        self.pending: StreamBlock | None = None
        self.skipped = Skipped(0, "")
        """The bad records skipped in the blocks read (`data.skip_bad_records`)."""
        self.chunk: list[np.ndarray] = []
        self.used = 0
        self.history: deque[dict[str, int]] = deque()
        self.epoch_windows = 1 if position else 0
        for _ in range(at["skip"]):
            self.take(self.draw)

    def take(self, draw: int) -> np.ndarray:
        """Window `draw` of the stream: the draws must come in order, one after another."""
        if draw != self.draw:
            raise RuntimeError(f"stream {self.spec.name!r} is at draw {self.draw}, not {draw}")
        if self.used == len(self.chunk):
            self._fill_chunk()
        window = self.chunk[self.used]
        self.used, self.draw = self.used + 1, self.draw + 1
        return window

    def close(self) -> None:
        """Stop reading: the files of the stream are closed (workers stop with their loader)."""
        close = getattr(self.blocks, "close", None)  # a generator (no workers) has one
        if close is not None:
            close()

    def position_at(self, draw: int) -> dict[str, int]:
        """Where draw `draw` is (the checkpoint's entry): its chunk's start, and the skip."""
        for entry in reversed(self.history):
            if entry["first_draw"] <= draw:
                found = {k: v for k, v in entry.items() if k != "first_draw"}
                return {"draw": draw, **found, "skip": draw - entry["first_draw"]}
        raise RuntimeError(f"stream {self.spec.name!r} no longer knows where draw {draw} was")

    def _fill_chunk(self) -> None:
        windows: list[np.ndarray] = []
        length = self.seq_len + 1
        size = min(self.shuffle_windows, FIRST_CHUNK << min(self.chunk_index, 30))
        while len(windows) < size:
            if len(self.buffer) >= length:
                if not windows:
                    self._record_start()
                windows.append(self.buffer[:length])
                self._advance(self.seq_len)
            elif not self._append_block():
                break  # the epoch ends: its last chunk is shorter
        if not windows:  # the epoch ended on a chunk's boundary
            if self.epoch_windows == 0:
                raise ConfigError(
                    f"streamed source {self.spec.name!r} holds fewer tokens than "
                    f"one window of data.seq_len={self.seq_len}"
                )
            self._next_epoch()
            return self._fill_chunk()
        rng = np.random.default_rng([*self.spec.seed, _CHUNK_ORDER, self.epoch, self.chunk_index])
        self.chunk = [windows[i] for i in rng.permutation(len(windows))]
        self.used, self.chunk_index = 0, self.chunk_index + 1
        self.epoch_windows += len(windows)

    def _record_start(self) -> None:
        start, position, block, offset = self.segments[0]
        self.history.append(
            {
                "first_draw": self.draw,
                "epoch": self.epoch,
                "chunk": self.chunk_index,
                "file_position": position,
                "block": block,
                "offset": offset - start,
            }
        )
        while len(self.history) > 1 and self.history[1]["first_draw"] < self.draw - self.keep_draws:
            self.history.popleft()

    def _advance(self, n: int) -> None:
        self.buffer = self.buffer[n:]
        for segment in self.segments:
            segment[0] -= n
        while len(self.segments) > 1 and self.segments[1][0] <= 0:
            self.segments.pop(0)

    def _append_block(self) -> bool:
        """Append the epoch's next block; False (holding it back) when it opens the next."""
        item = self.pending if self.pending is not None else next(self.blocks)
        if isinstance(item, ConfigError):  # a worker's refusal (`BlockStream._in_worker`)
            raise item
        epoch, position, block, ids, skipped = item
        if epoch != self.epoch:
            self.pending = item
            return False
        self.pending = None
        self.skipped = self.skipped.add(skipped)
        ids = np.asarray(ids, dtype=np.int32)[self.first_offset :]
        self.segments.append([len(self.buffer), position, block, self.first_offset])
        self.buffer = np.concatenate([self.buffer, ids]) if len(self.buffer) else ids
        self.first_offset = 0
        return True

    def _next_epoch(self) -> None:
        self.epoch, self.chunk_index, self.epoch_windows = self.epoch + 1, 0, 0
        self.buffer, self.segments = np.zeros(0, np.int32), []


class StreamedMixture(IterableDataset):
    """One rank's micro-batches of a mixture with streamed sources, step after step: each step's
    samples drawn by `plan` (streamed sources' windows from their `WindowStream`, the others'
    from `train_sets`), this rank's positions of them (`sampler.rank_positions`) collated.
    Iterated in the training process (its DataLoader has no workers; the streams have)."""

    def __init__(
        self,
        plan: MixturePlan,
        train_sets: list[WindowSet | None],
        specs: list[StreamSpec | None],
        shuffle_windows: list[int],
        *,
        seq_len: int,
        num_workers: int,
        separator: int | None,
    ):
        self.plan, self.train_sets, self.specs = plan, train_sets, specs
        self.shuffle_windows, self.seq_len = shuffle_windows, seq_len
        self.num_workers, self.separator = num_workers, separator
        self.sampler: GlobalBatchSampler | None = None
        self.start_step = 0
        self.positions: dict[str, dict[str, int]] = {}
        self.streams: dict[int, WindowStream] = {}

    def start(
        self,
        sampler: GlobalBatchSampler,
        start_step: int,
        positions: dict[str, dict[str, int]] | None,
    ) -> None:
        """Read as `sampler`'s rank from `start_step`, the streams from their saved positions
        (by source name; a stream without one reads from its start up to its draws)."""
        self.sampler, self.start_step, self.positions = sampler, start_step, positions or {}

    def positions_at(self, drawn: list[int]) -> dict[str, dict[str, int]]:
        """Each started stream's position at its draws `drawn[s]` (the checkpoint's entry)."""
        return {
            self.specs[s].name: stream.position_at(drawn[s])  # type: ignore[union-attr]
            for s, stream in self.streams.items()
        }

    def skipped_records(self) -> dict[str, dict[str, Any]]:
        """The bad records each started stream skipped (`data.skip_bad_records`), by source
        name, where there were any: summary.json's `skipped_records`."""
        return {
            self.specs[s].name: {"count": skipped.records, "first": skipped.first}  # type: ignore[union-attr]
            for s, stream in self.streams.items()
            if (skipped := stream.skipped).records
        }

    def __iter__(self) -> Iterator[Any]:
        sampler = self.sampler
        assert sampler is not None, "StreamedMixture.start() sets the rank's sampler"
        drawn = self.plan.drawn_at(self.start_step)
        self.streams = {}
        for s, spec in enumerate(self.specs):
            if spec is None:
                continue
            saved = self.positions.get(spec.name)
            stream = WindowStream(
                spec,
                seq_len=self.seq_len,
                shuffle_windows=self.shuffle_windows[s],
                num_workers=self.num_workers,
                position=saved if saved and saved["draw"] == drawn[s] else None,
                keep_draws=32 * self.plan.global_batch_size,
            )
            while stream.draw < drawn[s]:  # no saved position: read up to the draws
                stream.take(stream.draw)
            self.streams[s] = stream
        try:
            for step in itertools.count(self.start_step):
                samples = self.plan.step_samples(step)
                taken = [self.streams[s].take(i) if s in self.streams else None for s, i in samples]
                for micro_step in range(sampler.grad_accumulation):
                    positions = sampler.rank_positions(micro_step)
                    yield default_collate([self._sample(samples[p], taken[p]) for p in positions])
        finally:
            for stream in self.streams.values():
                stream.close()

    def _sample(self, sample: tuple[int, int], window: np.ndarray | None) -> Any:
        source, index = sample
        if window is None:
            return self.train_sets[source][index]  # type: ignore[index]
        return packed_window(torch.from_numpy(window.astype(np.int64)), self.separator)


def validation_windows(
    spec: StreamSpec, *, seq_len: int, windows: int, separator: int | None
) -> WindowSet:
    """The first `windows` validation windows of a streamed source (its held-out documents in
    file order, tokenized now: only as many as those windows need); [] when it has none."""
    tokenizer = load_tokenizer(spec.tokenizer_path)
    wanted = windows * seq_len + 1
    pieces, count = [], 0
    for index in range(len(spec.files)):
        with contextlib.closing(spec.documents(index)) as documents:  # closed now, not at exit
            for is_val, text in documents:
                if is_val:
                    pieces.append(tokenize(tokenizer, [text]))
                    count += len(pieces[-1])
                if count >= wanted:
                    break
        if count >= wanted:
            break
    if count < seq_len + 1:
        return []
    tokens = np.concatenate(pieces)[:wanted]
    return TokenWindows(tokens, seq_len, split="val", separator=separator)


class StreamedSource:
    """A source read as a stream (`stream=true`): found and checked now (its files, the first
    record of the first one), nothing tokenized before training but the validation windows."""

    def __init__(
        self,
        spec: DataSource,
        *,
        index: int,
        name: str,
        where: str,
        tokenizer: Any,
        seq_len: int,
        val_fraction: float,
        seed: int,
        follow_symlinks: bool,
        skip_bad_records: bool,
        val_windows: int,
    ):

        self.name, self.seq_len, self.val_windows = name, seq_len, val_windows
        fmt = spec.format
        if fmt == "text":
            files = find_files(spec.path, follow_symlinks=follow_symlinks)[0]
        elif fmt == "hf_disk":
            files = path_matches(spec.path, where, folders=True)
        else:
            files = record_files(spec.path, fmt, where)
        val_files = split_files(relative_names(files), val_fraction) if fmt == "text" else []
        path = getattr(tokenizer, "path", None)
        self.spec = StreamSpec(
            name=name,
            format=fmt,
            files=tuple(str(f) for f in files),
            field=spec.field,
            skip_bad_records=skip_bad_records,
            tokenizer_path=None if path is None else str(path),
            val_fraction=val_fraction,
            val_files=tuple(val_files),
            seed=(seed, index),
        )
        self.shuffle_windows = spec.shuffle_windows
        with contextlib.closing(self.spec.documents(0)) as documents:
            next(documents, None)  # a wrong field or format: one line, now
        self.inputs = {"files": len(files), "streamed": True,
                       "shuffle_bytes": self.shuffle_windows * (seq_len + 1) * 4,
                       "first_paths": [str(f) for f in files[:5]]}  # fmt: skip
        """What the source reads, and its largest chunk's bytes (per rank): summary.json's
        `data`."""

    def prepare(self) -> None:
        """Nothing to prepare: the stream is tokenized while the run trains."""

    def windows(self, split: str, separator: int | None) -> WindowSet | None:
        """The validation windows (read now); None for train (the stream, `StreamedMixture`)."""
        if split == "train":
            return None
        return validation_windows(
            self.spec, seq_len=self.seq_len, windows=self.val_windows, separator=separator
        )
