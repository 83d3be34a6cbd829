"""lightning_dist.data.records: every format, both compressions, and every bad input as one line."""

from __future__ import annotations

import gzip
import json
import os
import random
from pathlib import Path

import pytest

from lightning_dist.data.records import ReadStats, iter_documents
from lightning_dist.run.errors import ConfigError

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
zstandard = pytest.importorskip("zstandard")

DOCS = ["first document\nwith two lines", "second ünïcode 🙂", "", "x" * 5000]


def jsonl_bytes(docs=DOCS, field="text") -> bytes:
    return b"".join(json.dumps({"id": i, field: d}).encode() + b"\n" for i, d in enumerate(docs))


def compress(data: bytes, suffix: str) -> bytes:
    if suffix == ".gz":
        return gzip.compress(data)
    if suffix == ".zst":
        return zstandard.ZstdCompressor().compress(data)
    return data


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("suffix", ["", ".gz", ".zst"])
def test_jsonl_and_text_read_every_compression(tmp_path, suffix):
    path = write(tmp_path / f"a.jsonl{suffix}", compress(jsonl_bytes() + b"\n", suffix))
    assert list(iter_documents(path, "jsonl")) == DOCS
    text = write(tmp_path / f"a.txt{suffix}", compress(DOCS[1].encode(), suffix))
    assert list(iter_documents(text, "text")) == [DOCS[1]]


def test_zstd_of_several_frames_and_a_named_field(tmp_path):
    frames = b"".join(zstandard.ZstdCompressor().compress(jsonl_bytes([d], "body")) for d in DOCS)
    path = write(tmp_path / "multi.jsonl.zst", frames)
    assert list(iter_documents(path, "jsonl", field="body")) == DOCS


def test_zstd_frame_that_ends_exactly_where_a_read_ends(tmp_path):
    # The reader takes 256 KiB of compressed bytes at a time: a first frame of exactly that
    # size leaves no unused data, and the second frame must still start a new decompressor.
    compressor = zstandard.ZstdCompressor()

    def noise(n: int) -> bytes:  # incompressible, no NUL: zstd stores it in raw blocks
        return random.Random(0).randbytes(n).replace(b"\0", b"x")

    overhead = len(compressor.compress(noise(200_000))) - 200_000
    first = compressor.compress(noise((1 << 18) - overhead))
    assert len(first) == 1 << 18
    path = write(tmp_path / "two.txt.zst", first + compressor.compress(b"tail"))
    (doc,) = iter_documents(path, "text")
    assert doc.endswith("tail") and len(doc) > 100_000


def test_a_highly_compressed_zstd_inflates_a_bounded_piece_at_a_time(tmp_path):
    import tracemalloc

    from lightning_dist.data.records import open_stream

    path = tmp_path / "zeros.txt.zst"
    with open(path, "wb") as raw, zstandard.ZstdCompressor().stream_writer(raw) as out:
        for _ in range(192):
            out.write(bytes(1 << 20))  # 192 MiB of zeros in a few KiB
    assert path.stat().st_size < 1 << 18  # one read of the raw file holds all of it
    tracemalloc.start()
    with open_stream(path) as stream:
        total = sum(len(chunk) for chunk in iter(lambda: stream.read(1 << 20), b""))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert total == 192 << 20 and peak < 48 << 20, peak


def test_parquet_reads_batches_of_a_column(tmp_path):
    many = [f"doc {i}" for i in range(2500)]  # more than one batch, several row groups
    table = pa.table({"id": list(range(len(many))), "content": many})
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=700)
    assert list(iter_documents(tmp_path / "a.parquet", "parquet", field="content")) == many


def test_hf_disk_reads_the_arrow_files_of_save_to_disk(tmp_path):
    datasets = pytest.importorskip("datasets")
    many = [f"row {i} " * (i % 7) for i in range(300)]
    dataset = datasets.Dataset.from_dict({"text": many, "n": list(range(300))})
    dataset.save_to_disk(str(tmp_path / "ds"), num_shards=3)
    assert list(iter_documents(tmp_path / "ds", "hf_disk")) == many
    datasets.DatasetDict({"train": dataset}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(ConfigError, match="DatasetDict; name one split's folder \\(train\\)"):
        iter_documents(tmp_path / "dd", "hf_disk")


def test_skip_bad_records_counts_them(tmp_path, capsys):
    lines = [b'{"text": "a"}', b"{not json", b'{"text": 3}', b"[1]", b'{"text": "b"}', b'{"x": 1}']
    path = write(tmp_path / "bad.jsonl", b"\n".join(lines) + b"\n")
    stats = ReadStats()
    assert list(iter_documents(path, "jsonl", skip_bad_records=True, stats=stats)) == ["a", "b"]
    assert (stats.documents, stats.skipped) == (2, 4)
    assert stats.first_skipped.startswith(f"{path}:2: not valid JSON")
    assert f"warning: {path}: skipped 4 bad records" in capsys.readouterr().err
    table = pa.table({"text": ["a", None, "b"]})
    pq.write_table(table, tmp_path / "null.parquet")
    assert list(iter_documents(tmp_path / "null.parquet", "parquet", skip_bad_records=True)) == [
        "a",
        "b",
    ]


def _bad_inputs(tmp: Path) -> list[tuple[str, Path, str, dict, str]]:
    """(name, path, format, keywords, the pattern the one-line error must match)."""
    good = jsonl_bytes()
    os.mkfifo(tmp / "fifo.jsonl")
    pq.write_table(pa.table({"body": ["a"], "n": [1]}), tmp / "cols.parquet")
    pq.write_table(pa.table({"text": [1, 2]}), tmp / "ints.parquet")
    (tmp / "hf").mkdir()
    write(
        tmp / "hf" / "state.json",
        json.dumps({"_data_files": [{"filename": "../a.arrow"}]}).encode(),
    )
    zst = zstandard.ZstdCompressor().compress(good * 50)
    gz = gzip.compress(good * 50)
    return [
        ("malformed line", write(tmp / "m.jsonl", good + b'{"text": "a",\n'), "jsonl", {},
         r"m.jsonl:5: not valid JSON .*data.skip_bad_records=true"),
        ("not an object", write(tmp / "o.jsonl", good + b'"just a string"\n'), "jsonl", {},
         r"o.jsonl:5: a JSON str, not an object"),
        ("missing field", write(tmp / "f.jsonl", good), "jsonl", {"field": "body"},
         r"f.jsonl:1: no field 'body' \(the record's fields: 'id', 'text'\)"),
        ("missing field skipped", write(tmp / "g.jsonl", good), "jsonl",
         {"field": "body", "skip_bad_records": True}, r"g.jsonl:1: no field 'body'"),
        ("field not a string", write(tmp / "s.jsonl", good + b'{"text": null}\n'), "jsonl", {},
         r"s.jsonl:5: field 'text' is NoneType, not a string"),
        ("invalid utf-8", write(tmp / "u.jsonl", b'{"text": "\xff\xfe"}\n'), "jsonl", {},
         r"u.jsonl:1: not valid JSON"),
        ("lone surrogate", write(tmp / "l.jsonl", b'{"text": "a\\ud800"}\n'), "jsonl", {},
         r"l.jsonl:1: field 'text' holds an unpaired surrogate"),
        ("fifo", tmp / "fifo.jsonl", "jsonl", {}, r"fifo.jsonl is not a regular file \(a FIFO\)"),
        ("folder", tmp, "text", {}, r"is not a regular file \(a folder\)"),
        ("missing file", tmp / "nope.jsonl", "jsonl", {}, r"nope.jsonl does not exist"),
        ("unknown format", write(tmp / "x.csv", b"a"), "csv", {}, r"format 'csv' is not one of"),
        ("truncated zstd", write(tmp / "t.jsonl.zst", zst[: len(zst) // 2]), "jsonl", {},
         r"t.jsonl.zst: corrupt zstd file \(the file ends inside a frame\)"),
        ("garbage zstd", write(tmp / "z.jsonl.zst", b"not zstd at all"), "jsonl", {},
         r"z.jsonl.zst: corrupt zstd file"),
        ("truncated gzip", write(tmp / "t.jsonl.gz", gz[: len(gz) // 2]), "jsonl", {},
         r"t.jsonl.gz: corrupt gzip file"),
        ("garbage gzip", write(tmp / "z.txt.gz", b"not gzip at all"), "text", {},
         r"z.txt.gz: corrupt gzip file"),
        ("binary text", write(tmp / "b.txt", b"ab\0cd"), "text", {},
         r"b.txt is not text \(a NUL byte at offset 2\)"),
        ("missing column", tmp / "cols.parquet", "parquet", {},
         r"cols.parquet: no column 'text' \(its columns: body, n\)"),
        ("column not text", tmp / "ints.parquet", "parquet", {},
         r"ints.parquet: column 'text' is int64, not a string"),
        ("not parquet", write(tmp / "n.parquet", b"PAR1 but not really"), "parquet", {},
         r"n.parquet is not a readable Parquet file"),
        ("compressed parquet", write(tmp / "c.parquet.zst", b"x"), "parquet", {},
         r"c.parquet.zst: a parquet file is compressed inside"),
        ("null in parquet", _null_parquet(tmp), "parquet", {},
         r"null.parquet: row 2: column 'text' is null"),
        ("not save_to_disk", tmp / "cols.parquet", "hf_disk", {}, r"not a datasets.save_to_disk"),
        ("state leads outside", tmp / "hf", "hf_disk", {},
         r"state.json: data file '../a.arrow' is not a file name in"),
    ]  # fmt: skip


def _null_parquet(tmp: Path) -> Path:
    pq.write_table(pa.table({"text": ["a", None]}), tmp / "null.parquet")
    return tmp / "null.parquet"


def test_every_bad_input_is_one_line_naming_the_file(tmp_path):
    for name, path, fmt, keywords, pattern in _bad_inputs(tmp_path):
        with pytest.raises(ConfigError) as caught:
            list(iter_documents(path, fmt, **keywords))
        message = str(caught.value)
        assert "\n" not in message, name
        assert __import__("re").search(pattern, message), (name, message)


def test_a_long_text_file_is_refused_not_read_whole(tmp_path, monkeypatch):
    import lightning_dist.data.records as records

    monkeypatch.setattr(records, "MAX_TEXT_BYTES", 100)
    monkeypatch.setattr(records, "MAX_LINE_BYTES", 100)
    write(tmp_path / "big.txt", b"a" * 101)
    with pytest.raises(ConfigError, match="over 0 MiB; split it"):
        list(iter_documents(tmp_path / "big.txt", "text"))
    write(tmp_path / "long.jsonl", b'{"text": "' + b"a" * 200 + b'"}\n')
    with pytest.raises(ConfigError, match="long.jsonl:1: a record longer than"):
        list(iter_documents(tmp_path / "long.jsonl", "jsonl"))
