"""lightning_dist.data.indexed: Megatron-Core's indexed format byte for byte, nanoGPT token files,
and one-line refusals of truncated or corrupt files; the slices of a prepare (Slurm array steps,
a slice without its manifest)."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from lightning_dist.data.indexed import (
    IndexedDataset,
    IndexedWriter,
    read_token_file,
    write_indexed,
)
from lightning_dist.run.errors import ConfigError


def test_idx_bytes_are_the_published_layout(tmp_path):
    """Two documents, [5, 6, 7] and [8], as uint16: every byte of the .idx spelled out by hand."""
    summary = write_indexed(tmp_path / "d", [[5, 6, 7], [8]], np.uint16)
    expected = (
        b"MMIDIDX\x00\x00"  # magic
        + (1).to_bytes(8, "little")  # version
        + bytes([8])  # dtype code of uint16
        + (2).to_bytes(8, "little")  # sequences
        + (3).to_bytes(8, "little")  # document indices: documents + 1
        + (3).to_bytes(4, "little")
        + (1).to_bytes(4, "little")  # int32 lengths
        + (0).to_bytes(8, "little")
        + (6).to_bytes(8, "little")  # int64 byte offsets
        + (0).to_bytes(8, "little")
        + (1).to_bytes(8, "little")
        + (2).to_bytes(8, "little")
    )
    assert (tmp_path / "d.idx").read_bytes() == expected
    assert (tmp_path / "d.bin").read_bytes() == struct.pack("<4H", 5, 6, 7, 8)
    assert (summary.sequences, summary.documents, summary.tokens) == (2, 2, 4)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.bin", "d.idx"]  # no temporary left


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.int32, np.int64])
def test_round_trip_with_documents_of_several_sequences(tmp_path, dtype):
    rng = np.random.default_rng(0)
    docs = [
        [rng.integers(0, 200, rng.integers(0, 50)) for _ in range(rng.integers(1, 4))]
        for _ in range(30)
    ]
    with IndexedWriter(tmp_path / "r", dtype) as writer:
        for doc in docs:
            for sequence in doc:
                writer.add(sequence)
            writer.end_document()
    data = IndexedDataset(tmp_path / "r")
    flat = [s for doc in docs for s in doc]
    assert len(data) == len(flat) and data.num_documents == len(docs)
    assert data.dtype == np.dtype(dtype)
    for i, sequence in enumerate(flat):
        np.testing.assert_array_equal(data.get(i), sequence)
    assert data.document_boundaries.tolist() == [0, *np.cumsum([len(d) for d in docs]).tolist()]
    assert data.num_tokens == sum(len(s) for s in flat)


def test_a_multimodal_index_has_its_modes_read_past(tmp_path):
    write_indexed(tmp_path / "m", [[1, 2], [3]], np.int32)
    with open(tmp_path / "m.idx", "ab") as f:
        f.write(bytes([0, 1]))  # Megatron's int8 mode per sequence, after the document indices
    data = IndexedDataset(tmp_path / "m")
    assert [data.get(i).tolist() for i in range(len(data))] == [[1, 2], [3]]


def test_an_empty_dataset_and_an_aborted_writer(tmp_path):
    write_indexed(tmp_path / "e", [], np.uint16)
    assert len(IndexedDataset(tmp_path / "e")) == 0
    with pytest.raises(RuntimeError), IndexedWriter(tmp_path / "a", np.uint16) as writer:
        writer.add_document([1, 2])
        raise RuntimeError("killed")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.bin", "e.idx"]
    with pytest.raises(ValueError, match="token ids 0..70000 do not fit uint16"):
        write_indexed(tmp_path / "big", [np.array([0, 70000])], np.uint16)


def test_corrupt_and_truncated_files_are_one_line(tmp_path):
    write_indexed(tmp_path / "d", [[1, 2, 3], [4, 5]], np.int32)
    idx, bin_ = (tmp_path / "d.idx").read_bytes(), (tmp_path / "d.bin").read_bytes()
    cases = [
        ("truncated idx", idx[:-3], bin_, r"d.idx: \d+ bytes, but its header .* truncated or corrupt"),
        ("bad magic", b"XXIDIDX\x00\x00" + idx[9:], bin_, r"d.idx is not a Megatron indexed-dataset index"),
        ("short header", idx[:20], bin_, r"bad header"),
        ("bad version", idx[:9] + (2).to_bytes(8, "little") + idx[17:], bin_, r"index version 2"),
        ("bad dtype code", idx[:17] + bytes([9]) + idx[18:], bin_, r"dtype code 9 is not readable"),
        ("truncated bin", idx, bin_[:-4], r"d.bin: 16 bytes, but its index describes 20 bytes"),
        ("bad document indices", idx[:-8] + (7).to_bytes(8, "little"), bin_,
         r"document indices must run from 0 to the sequence count 2"),
    ]  # fmt: skip
    for name, idx_bytes, bin_bytes, pattern in cases:
        (tmp_path / "c.idx").write_bytes(idx_bytes)
        (tmp_path / "c.bin").write_bytes(bin_bytes)
        with pytest.raises(ConfigError, match=pattern.replace("d.", "c.")) as caught:
            IndexedDataset(tmp_path / "c")
        assert "\n" not in str(caught.value), name
    (tmp_path / "c.bin").unlink()
    with pytest.raises(ConfigError, match=r"c.bin does not exist"):
        IndexedDataset(tmp_path / "c")


def test_token_files_are_flat_little_endian(tmp_path):
    (tmp_path / "small.bin").write_bytes(struct.pack("<3H", 1, 65535, 7))
    assert read_token_file(tmp_path / "small.bin", 65536).tolist() == [1, 65535, 7]
    (tmp_path / "large.bin").write_bytes(struct.pack("<2I", 70000, 3))
    tokens = read_token_file(tmp_path / "large.bin", 128256)
    assert tokens.dtype == np.dtype("<u4") and tokens.tolist() == [70000, 3]
    (tmp_path / "odd.bin").write_bytes(b"\x01\x00\x02")
    with pytest.raises(ConfigError, match=r"odd.bin: 3 bytes is not a whole number of uint16"):
        read_token_file(tmp_path / "odd.bin", 50257)


def test_slurm_array_steps_and_missing_slices(tmp_path):
    from lightning_dist.data.__main__ import slice_of
    from lightning_dist.data.manifest import MANIFEST_FORMAT, manifest_name, verify, write_manifest

    array = {
        "SLURM_ARRAY_TASK_MIN": "0",
        "SLURM_ARRAY_TASK_STEP": "4",
        "SLURM_ARRAY_TASK_COUNT": "4",
    }
    assert [slice_of(None, None, {**array, "SLURM_ARRAY_TASK_ID": str(t)}) for t in (0, 4, 12)] == [
        (0, 4),
        (1, 4),
        (3, 4),
    ]
    assert slice_of(2, 5, {**array, "SLURM_ARRAY_TASK_ID": "8"}) == (2, 5)  # the options win
    assert slice_of(None, None, {}) == (0, 1)

    def manifest(i: int, n: int) -> None:
        write_manifest(
            tmp_path / manifest_name(i, n),
            {
                "format": MANIFEST_FORMAT,
                "tokenizer": {"name": "byte"},
                "dtype": "uint16",
                "slice": [i, n],
                "complete": True,
                "files": {},
                "shards": [],
            },
        )

    manifest(0, 3)
    manifest(2, 3)
    with pytest.raises(ConfigError, match=r"slice 1 of 3 has no manifest .* --shard-index 1 "):
        verify(tmp_path)
    manifest(1, 3)
    assert verify(tmp_path)["complete"]
    manifest(0, 1)
    with pytest.raises(ConfigError, match=r"holds manifests of 1 and 3 slices"):
        verify(tmp_path)
