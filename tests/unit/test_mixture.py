"""Weighted mixtures of data sources (lightning_dist/lm/mixture.py, lm/sources.py): realised
shares, the stream independent of the world size and of where it resumes, a one-source mixture
reading as the plain sampler, and token files read as the same ids as text."""

from __future__ import annotations

import numpy as np
import pytest

from lightning_dist.lm.data import MixtureDataModule
from lightning_dist.lm.mixture import MixturePlan, MixtureSampler
from lightning_dist.lm.sampling import GlobalBatchSampler
from lightning_dist.options.data import parse_sources


def steps(sampler, count: int) -> list[list[int]]:
    """The first `count` steps of one rank, one list of indices per step."""
    per_step = sampler.grad_accumulation * sampler.micro_batch_size
    flat = list(sampler)
    return [flat[i * per_step : (i + 1) * per_step] for i in range(count)]


def test_three_sources_realise_their_weights_within_a_point_over_1000_steps():
    plan = MixturePlan([700, 300, 50], [0.5, 0.3, 0.2], global_batch_size=16, seed=3)
    drawn = np.zeros(3)
    for step in range(1000):
        for source, window in plan.step_samples(step):
            drawn[source] += 1
            assert 0 <= window < plan.lengths[source]
    shares = drawn / drawn.sum()
    assert np.abs(shares - [0.5, 0.3, 0.2]).max() < 0.01, shares
    # The 50-window source went through about 64 epochs, each in a new order.
    assert plan.drawn_at(1000) == drawn.astype(int).tolist()
    orders = {tuple(plan._window(2, e * 48 + i) for i in range(48)) for e in range(3)}
    assert len(orders) == 3 and all(sorted(o) != list(o) for o in orders)


def test_global_batches_are_the_same_set_on_1_2_and_4_ranks_and_after_a_resume():
    lengths, weights, g = [40, 25, 9], [0.5, 0.3, 0.2], 8
    offsets = [0, 40, 65]
    reference = None
    for dp, micro in ((1, 8), (1, 2), (2, 2), (4, 1), (4, 2)):
        ranks = [
            steps(MixtureSampler(MixturePlan(lengths, weights, g, 7), offsets, micro, r, dp), 6)
            for r in range(dp)
        ]
        batches = [sorted(i for rank in ranks for i in rank[k]) for k in range(6)]
        reference = reference or batches
        assert batches == reference, (dp, micro)
    # Resumed at step 4 on 2 ranks, from the saved draws: the same steps 5 and 6.
    saved = MixturePlan(lengths, weights, g, 7).drawn_at(4)
    resumed_plan = MixturePlan(lengths, weights, g, 7)
    resumed_plan.restore(4, saved)
    ranks = [
        steps(MixtureSampler(resumed_plan, offsets, 2, r, 2, start_step=4), 2) for r in range(2)
    ]
    assert [sorted(ranks[0][k] + ranks[1][k]) for k in range(2)] == reference[4:6]


def test_one_source_reads_as_the_plain_sampler():
    for epoch in range(3):
        plain = GlobalBatchSampler(50, 8, 2, 1, 2, seed=5, start_step=3)
        mixed = MixtureSampler(MixturePlan([50], [1.0], 8, 5), [0], 2, 1, 2, start_step=3)
        plain.set_epoch(epoch)
        mixed.set_epoch(epoch)
        assert list(plain) == list(mixed) and len(plain) == len(mixed)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"path": "a", "weight": 0}, r"data.sources\[0\].weight=0 must be a finite number above 0"),
        ({"path": "a", "weight": -1.5}, r"weight=-1.5 must be a finite number above 0"),
        ({"path": "a", "weight": float("nan")}, r"weight=nan must be a finite number"),
        ({"path": "a", "format": "csv"}, r"format='csv' is not one of text, tokens"),
        ({"format": "tokens"}, r"data.sources\[0\] \(format=tokens\) has no path"),
        ({"path": "a", "wieght": 1}, r"data.sources\[0\] has no key 'wieght'"),
        (
            {"path": "a", "format": "tokens", "stream": True},
            r"data.sources\[0\].stream=True: streaming .* reads formats text, jsonl",
        ),
        (
            {"path": "a", "stream": True, "shuffle_windows": 0},
            r"data.sources\[0\].shuffle_windows=0 must be a whole number of windows >= 1",
        ),
    ],
)
def test_bad_source_entries_name_the_entry(entry, message):
    with pytest.raises(ValueError, match=message):
        parse_sources([entry])


def test_token_files_read_the_ids_text_tokenizes_to(tmp_path):
    """The same corpus as text and as a uint16 token file (the byte tokenizer's ids, each file
    ended by its end-of-text id): the same windows, train and validation alike."""
    text = "".join(f"line {i}: the quick brown fox\n" for i in range(60))
    (tmp_path / "corpus.txt").write_text(text)
    ids = np.append(np.frombuffer(text.encode(), np.uint8), 256).astype("<u2")
    ids.tofile(tmp_path / "corpus.bin")
    common = dict(
        seq_len=16,
        global_batch_size=4,
        val_fraction=0.1,
        val_batches=1,
        cache_dir=str(tmp_path / "cache"),
        vocab_size=300,
    )
    as_text = MixtureDataModule(sources=[{"path": str(tmp_path / "corpus.txt")}], **common)
    as_tokens = MixtureDataModule(
        sources=[{"path": str(tmp_path / "corpus.bin"), "format": "tokens"}], **common
    )
    for dm in (as_text, as_tokens):
        dm.setup("fit")
    for split in ("train_set", "val_set"):
        a, b = getattr(as_text, split), getattr(as_tokens, split)
        assert len(a) == len(b) > 0
        assert all(bool((a[i] == b[i]).all()) for i in range(len(a)))
    assert as_tokens.inputs["sources"]["corpus.bin"]["tokens"] == len(ids)


def write_megatron(prefix, documents: list[np.ndarray]) -> None:
    """An indexed dataset in Megatron-Core's documented layout (uint16 tokens, one sequence per
    document), written here byte by byte rather than by our writer."""
    import struct

    lengths = np.array([len(d) for d in documents], "<i4")
    pointers = np.concatenate([[0], np.cumsum(lengths[:-1]) * 2]).astype("<i8")
    bounds = np.arange(len(documents) + 1, dtype="<i8")
    header = b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, len(documents), len(bounds))
    with open(f"{prefix}.idx", "wb") as f:
        f.write(header + lengths.tobytes() + pointers.tobytes() + bounds.tobytes())
    np.concatenate(documents).astype("<u2").tofile(f"{prefix}.bin")


def save_to_disk(folder, columns: dict[str, list]) -> None:
    """A folder as `datasets.Dataset.save_to_disk` writes it (an Arrow stream file that its
    state.json lists), written with pyarrow: importing `datasets` costs seconds
    (tests/dist/test_mixture_resume_dist.py trains on one `datasets` wrote)."""
    import json

    import pyarrow as pa

    folder.mkdir()
    table = pa.table(columns)
    with pa.OSFile(str(folder / "data-00000-of-00001.arrow"), "wb") as sink:
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
    state = {"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}
    (folder / "state.json").write_text(json.dumps(state))


def test_hf_datasets_on_disk_and_megatron_read_the_tokens_text_reads(tmp_path):
    """One document three ways: a text file, the record of a `datasets.save_to_disk` folder,
    and a Megatron indexed dataset of its byte ids: the same windows, train and validation."""
    text = "".join(f"row {i}: a lazy dog sleeps\n" for i in range(70))
    (tmp_path / "doc.txt").write_text(text)
    save_to_disk(tmp_path / "hf", {"body": [text]})
    ids = np.append(np.frombuffer(text.encode(), np.uint8), 256)
    write_megatron(tmp_path / "mega", [ids[:300], ids[300:]])  # a document split in two
    common = dict(
        seq_len=16,
        global_batch_size=4,
        val_fraction=0.1,
        val_batches=1,
        cache_dir=str(tmp_path / "cache"),
        vocab_size=300,
    )
    entries = {
        "text": {"path": str(tmp_path / "doc.txt")},
        "hf_disk": {"path": str(tmp_path / "hf"), "format": "hf_disk", "field": "body"},
        "megatron": {"path": str(tmp_path / "mega"), "format": "megatron"},
    }
    read = {}
    for fmt, entry in entries.items():
        dm = MixtureDataModule(sources=[entry], **common)
        dm.prepare_data()
        dm.setup("fit")
        read[fmt] = [[w.tolist() for w in ds] for ds in (dm.train_set, dm.val_set)]
    assert read["text"][0] and read["text"][1]
    assert read["hf_disk"] == read["text"] and read["megatron"] == read["text"]


def test_compressed_text_reads_as_the_plain_file(tmp_path):
    import gzip

    text = "".join(f"{i} zipped words here\n" for i in range(40))
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "doc.txt").write_text(text)
    (tmp_path / "doc.txt.gz").write_bytes(gzip.compress(text.encode()))
    common = dict(
        seq_len=16,
        global_batch_size=4,
        val_fraction=0.1,
        val_batches=1,
        cache_dir=str(tmp_path / "cache"),
        vocab_size=300,
    )
    read = []
    for path in (tmp_path / "plain" / "doc.txt", tmp_path / "doc.txt.gz"):
        dm = MixtureDataModule(sources=[{"path": str(path)}], **common)
        dm.setup("fit")
        read.append([w.tolist() for w in dm.train_set])
    assert read[0] and read[0] == read[1]


def test_the_checkpoint_holds_the_draws_and_a_resume_starts_from_them(tmp_path):
    from types import SimpleNamespace

    for i, n in enumerate((3000, 1200)):
        np.random.default_rng(i).integers(0, 300, n).astype("<u2").tofile(tmp_path / f"{i}.bin")
    kwargs = dict(
        sources=[
            {"path": str(tmp_path / f"{i}.bin"), "format": "tokens", "weight": w}
            for i, w in enumerate((0.7, 0.3))
        ],
        seq_len=8,
        global_batch_size=4,
        val_batches=1,
        vocab_size=300,
    )
    first = MixtureDataModule(**kwargs)
    first.setup("fit")
    first.trainer = SimpleNamespace(global_step=5)
    state = first.state_dict()
    assert state["global_step"] == 5 and state["mixture"]["drawn"] == [14, 6]
    step6 = list(first.train_dataloader())[5]
    resumed = MixtureDataModule(**kwargs)
    resumed.load_state_dict(state)
    assert bool((next(iter(resumed.train_dataloader())) == step6).all())
    assert 1 not in resumed.plan_of_samples._marks  # restored at step 5, not replayed from 0


def test_sources_are_named_by_their_path_and_names_are_unique():
    sources = parse_sources(
        [
            {"path": "corpus/web/*.jsonl", "format": "jsonl"},
            {"path": "corpus/code.txt"},
            {"path": ["a", "b"]},
            {},
        ]
    )
    assert [s.label(i) for i, s in enumerate(sources)] == ["web", "code.txt", "source2", "stdlib"]
    with pytest.raises(
        ValueError, match=r"data.sources\[1\] is named 'web' like data.sources\[0\]"
    ):
        parse_sources([{"path": "x/web"}, {"path": "y/web/"}])
