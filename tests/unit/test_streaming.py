"""Streamed sources (lightning_dist/lm/streaming.py), in one process: the global batch of each
step is the same set on 1, 2 and 4 ranks; W tokenizing workers, taken in turn, give the blocks
of one (a unit test starts no process: each worker's part is read here as the DataLoader's
worker w of W reads it); a resume from the
checkpoint's stream positions (or, without them, from the start) continues the stream exactly,
across chunk and epoch boundaries; each epoch reads its windows in a new order."""

from __future__ import annotations

import dataclasses
import itertools
import json

import pytest
import torch

from lightning_dist.data.records import BadRecord
from lightning_dist.lm.data import MixtureDataModule
from lightning_dist.lm.sampling import GlobalBatchSampler
from lightning_dist.lm.streaming import WindowStream

G, STEPS = 8, 30


def corpus(folder) -> list[dict]:
    """A jsonl source (3 files) and a text source small enough to pass several epochs."""
    (folder / "records").mkdir()
    (folder / "text").mkdir()
    for f in range(3):
        lines = [
            json.dumps({"body": f"record {f}-{k} " + "word " * (k % 13 + 2)}) for k in range(90)
        ]
        (folder / "records" / f"{f}.jsonl").write_text("\n".join(lines) + "\n")
    for i in range(5):
        (folder / "text" / f"{i}.txt").write_text("".join(f"line {j} of {i}\n" for j in range(9)))
    return [
        {"path": str(folder / "records"), "format": "jsonl", "field": "body", "stream": True,
         "shuffle_windows": 7, "weight": 0.6},
        {"path": str(folder / "text"), "stream": True, "shuffle_windows": 5, "weight": 0.4},
    ]  # fmt: skip


def read(sources, *, rank=0, ranks=1, micro=G, start=0, streams=None, drawn=None, **settings):
    """Steps start .. STEPS - 1 of one rank: a list of micro-batches per step."""
    dm = MixtureDataModule(
        sources=sources,
        seq_len=12,
        global_batch_size=G,
        val_batches=1,
        val_fraction=0.2,
        seed=3,
        **settings,
    )
    dm.setup("fit")
    if drawn is not None:
        dm.plan_of_samples.restore(start, drawn)
    sampler = GlobalBatchSampler(G, G, micro, rank, ranks)
    dm.train_set.start(sampler, start, streams)
    batches = iter(dm.train_set)
    per_step = sampler.grad_accumulation
    out = [[next(batches) for _ in range(per_step)] for _ in range(start, STEPS)]
    return out, dm


def test_the_stream_is_the_same_on_any_ranks_and_resumes_exactly(tmp_path):
    sources = corpus(tmp_path)
    one, dm = read(sources)
    reference = [torch.cat(step) for step in one]
    for ranks, micro in ((2, 2), (4, 1)):
        per_rank = [read(sources, rank=r, ranks=ranks, micro=micro)[0] for r in range(ranks)]
        for step in range(STEPS):
            # micro-step a of rank r holds global positions (a * ranks + r) * micro ...
            pieces = [
                per_rank[r][step][a] for a in range(G // (micro * ranks)) for r in range(ranks)
            ]
            assert torch.equal(torch.cat(pieces), reference[step]), (ranks, step)
    assert dm.train_set.streams[1].epoch >= 2, "the text source passes several epochs"
    for at in (11, 17, 23):
        drawn = dm.plan_of_samples.drawn_at(at)
        positions = dm.train_set.positions_at(drawn)
        assert positions["text"]["draw"] == drawn[1]
        for streams in (positions, None):  # from the saved position; replayed from the start
            resumed, _ = read(sources, start=at, streams=streams, drawn=drawn)
            assert all(
                torch.equal(torch.cat(s), r) for s, r in zip(resumed, reference[at:], strict=True)
            ), (at, streams)


def test_an_exhausted_source_starts_its_next_epoch_in_a_new_order(tmp_path):
    _, dm = read(corpus(tmp_path))
    spec = dm.sources[1].spec  # the text source: one chunk holds a whole epoch

    def epochs(count: int) -> list[list[tuple]]:
        stream = WindowStream(
            spec, seq_len=12, shuffle_windows=1000, num_workers=0, position=None, keep_draws=G
        )
        by_epoch: dict[int, list[tuple]] = {}
        while len(by_epoch) <= count:
            window = stream.take(stream.draw)
            by_epoch.setdefault(stream.epoch, []).append(tuple(window.tolist()))
        return [by_epoch[e] for e in range(count)]

    first = epochs(3)
    assert len({tuple(e) for e in first}) == 3  # a new order every epoch
    assert max(map(len, first)) - min(map(len, first)) <= 1  # the same tokens, cut anew
    tokens = [sorted(t for w in e for t in w[:-1]) for e in first]
    assert all(abs(len(t) - len(tokens[0])) <= 12 for t in tokens)
    assert epochs(3) == first  # and the same orders when read again


def test_workers_taken_in_turn_give_the_blocks_of_one_reader(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from lightning_dist.lm import streaming

    _, dm = read(corpus(tmp_path))
    spec = dm.sources[0].spec
    spec = dataclasses.replace(spec, files=spec.files * 3)  # more blocks than workers x 2

    def blocks(worker: int | None, workers: int, count: int) -> list:
        info = None if worker is None else SimpleNamespace(id=worker, num_workers=workers)
        monkeypatch.setattr(streaming, "get_worker_info", lambda: info)
        out = itertools.islice(streaming.BlockStream(spec, (0, 1, 0)), count)
        return [(e, p, b, ids.tolist(), skipped) for e, p, b, ids, skipped in out]

    alone = blocks(None, 1, 12)
    for workers in (2, 3):
        parts = [blocks(w, workers, 12 // workers) for w in range(workers)]
        in_turn = [parts[i % workers][i // workers] for i in range(12)]
        assert in_turn == alone, workers


def test_a_bad_record_reached_mid_stream_stops_with_its_line_or_is_skipped_with_a_count(
    tmp_path, monkeypatch
):
    """Line 150 is in the second block (64 training documents each): the stream stops there
    with the one-line `BadRecord` naming file:line and the fix. A DataLoader worker (worker 0
    of 1, read in this process) yields the error itself after its good blocks, for the training
    process to raise (the DataLoader would re-raise it with the worker's traceback in its
    message). Skipped, it is counted (summary.json's `skipped_records`, the closing block)."""
    from types import SimpleNamespace

    from lightning_dist.lm import streaming
    from lightning_dist.runtime.record import summary_block

    lines = [json.dumps({"body": f"record {k} " + "word " * 4}) for k in range(200)]
    bad = {"json": '{"body": "cut short', "field": json.dumps({"text": "no body"})}
    for name, line in bad.items():
        (tmp_path / f"{name}.jsonl").write_text("\n".join([*lines[:149], line, *lines[150:]]))
    source = {"format": "jsonl", "field": "body", "stream": True, "shuffle_windows": 7}
    out, dm = read([{**source, "path": str(tmp_path / "json.jsonl")}], skip_bad_records=True)
    assert len(out) == STEPS
    first = f"{tmp_path / 'json.jsonl'}:150: not valid JSON (Invalid control character at)"
    assert dm.skipped_records() == {"json.jsonl": {"count": 1, "first": first}}
    block = summary_block({"skipped_records": dm.skipped_records()})
    assert (
        f"warning: source json.jsonl: skipped 1 bad record(s) (data.skip_bad_records=true; the first: {first})"
        in block
    )
    why = {"json": "not valid JSON (", "field": "no field 'body'"}
    for name in bad:
        with pytest.raises(BadRecord) as raised:
            read([{**source, "path": str(tmp_path / f"{name}.jsonl")}])
        message = str(raised.value)
        assert message.startswith(f"{tmp_path / name}.jsonl:150: {why[name]}"), message
        assert "data.skip_bad_records=true" in message and "\n" not in message, message
    spec = dataclasses.replace(dm.sources[0].spec, skip_bad_records=False)
    monkeypatch.setattr(streaming, "get_worker_info", lambda: SimpleNamespace(id=0, num_workers=1))
    items = list(streaming.BlockStream(spec, (0, 0, 0)))
    assert len(items) == 2 and isinstance(items[1], BadRecord) and items[1].where == first
