"""Unit tests for the tokenizers, the token cache, the datasets, the sampler and the datamodules."""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from lightning_dist.layout import batch_plan
from lightning_dist.lm.data import SyntheticDataModule, TextDataModule
from lightning_dist.lm.datasets import SyntheticTokens, TokenWindows
from lightning_dist.lm.sampling import GlobalBatchSampler
from lightning_dist.lm.token_cache import (
    TextCheck,
    build_token_cache,
    cache_key,
    default_cache_dir,
    default_corpus,
    invalid_utf8_bytes,
    resolve_files,
    split_files,
)
from lightning_dist.lm.tokenizer import ByteTokenizer, HFTokenizer, load_tokenizer


def write_corpus(root: Path, n: int, prefix: str = "doc") -> list[Path]:
    root.mkdir(parents=True, exist_ok=True)
    files = []
    for i in range(n):
        path = root / f"{prefix}_{i:03d}.txt"
        path.write_text(f"file {i}: " + "the quick brown fox jumps over the lazy dog. " * (i + 3))
        files.append(path)
    return files


def attach_dp(dm, rank: int, size: int) -> None:
    """Pretend the datamodule sits in a Trainer whose strategy has `size` data-parallel ranks."""
    kwargs = {"num_replicas": size, "rank": rank}
    dm.trainer = SimpleNamespace(strategy=SimpleNamespace(distributed_sampler_kwargs=kwargs))


# --- tokenizers -------------------------------------------------------------------------------


def test_byte_tokenizer_round_trip():
    tok = load_tokenizer(None)
    assert isinstance(tok, ByteTokenizer)
    assert (tok.vocab_size, tok.eos_id) == (257, 256)
    ids = tok.encode("héllo")
    assert ids.tolist() == list("héllo".encode())
    assert tok.encode(b"ab").tolist() == [97, 98]
    assert tok.decode([*ids.tolist(), tok.eos_id]) == "héllo"


def make_hf_tokenizer(path: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=["[UNK]", "<|endoftext|>"])
    tok.train_from_iterator(
        ["the quick brown fox", "jumps over the lazy dog", "file 1 2 3"], trainer
    )
    tok.save(str(path))
    return path


def test_hf_tokenizer_loads_and_encodes(tmp_path):
    tok = load_tokenizer(str(make_hf_tokenizer(tmp_path / "tokenizer.json")))
    assert isinstance(tok, HFTokenizer)
    assert tok.eos_id == tok._tok.token_to_id("<|endoftext|>")
    assert tok.vocab_size == tok._tok.get_vocab_size(with_added_tokens=True) > 5
    ids = tok.encode("the lazy fox")
    assert len(ids) == 3 and all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == "the lazy fox"
    assert tok.name.startswith("hf:tokenizer.json:")
    texts = ["the lazy fox", "", "file 1 2 jumps"]  # one call, the ids one by one would give
    assert [i.tolist() for i in tok.encode_batch(texts)] == [tok.encode(t).tolist() for t in texts]


def test_hf_tokenizer_missing_file_names_path(tmp_path):
    missing = tmp_path / "nope" / "tokenizer.json"
    with pytest.raises(FileNotFoundError, match="nope/tokenizer.json"):
        load_tokenizer(str(missing))


def test_text_datamodule_with_hf_tokenizer(tmp_path):
    write_corpus(tmp_path / "corpus", 6)
    tok_path = make_hf_tokenizer(tmp_path / "tokenizer.json")
    dm = TextDataModule(
        paths=[str(tmp_path / "corpus")],
        tokenizer=str(tok_path),
        seq_len=4,
        global_batch_size=2,
        val_fraction=0.3,
        val_batches=1,
        cache_dir=str(tmp_path / "cache"),
    )
    dm.prepare_data()
    dm.setup("fit")
    assert dm.cache.dtype == np.uint16
    batch = next(iter(dm.train_dataloader()))
    assert batch.dtype == torch.long and batch.shape == (2, 5)
    assert int(batch.max()) < dm.tokenizer_vocab_size


def test_tokenizer_larger_than_model_vocab_raises(tmp_path):
    write_corpus(tmp_path / "corpus", 2)
    with pytest.raises(
        ValueError, match=r"tokenizer vocabulary 257 \(byte-level\).*vocab_size=100"
    ):
        TextDataModule(paths=[str(tmp_path / "corpus")], vocab_size=100)
    tok_path = make_hf_tokenizer(tmp_path / "tokenizer.json")
    with pytest.raises(ValueError, match="tokenizer.json.*vocab_size=3"):
        TextDataModule(paths=[str(tmp_path / "corpus")], tokenizer=str(tok_path), vocab_size=3)
    # Equal or larger model vocabularies are fine (models pad their vocabulary).
    assert (
        TextDataModule(
            paths=[str(tmp_path / "corpus")], vocab_size=320, seq_len=8
        ).tokenizer_vocab_size
        == 257
    )


# --- files ------------------------------------------------------------------------------------


def test_resolve_files_dirs_globs_and_dedup(tmp_path):
    (tmp_path / "sub").mkdir()
    for name in ["a.py", "b.txt", "c.md", "d.bin", "sub/e.py"]:
        (tmp_path / name).write_text("x")
    files = resolve_files([str(tmp_path), str(tmp_path / "a.py"), str(tmp_path / "d.bin")])
    names = [f.relative_to(tmp_path.resolve()).as_posix() for f in files]
    assert names == ["a.py", "b.txt", "c.md", "d.bin", "sub/e.py"]
    globbed = resolve_files([str(tmp_path / "**" / "*.py")])
    assert [f.name for f in globbed] == ["a.py", "e.py"]


def test_glob_matching_nothing_names_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"data.paths: 'corpus/\*.txt' matches no file"):
        resolve_files(["corpus/*.txt"])
    with pytest.raises(ValueError, match="'missing.txt' matches no file"):
        TextDataModule(paths=["missing.txt"])


def test_default_corpus_is_the_stdlib():
    files = resolve_files(None)
    assert files == resolve_files([])
    assert len(files) > 1000
    assert all(f.suffix == ".py" for f in files)
    assert not any({"site-packages", "dist-packages"} & set(f.parts) for f in files)
    assert any(f.name == "argparse.py" for f in files)
    assert files == sorted(set(files))


# --- the token cache --------------------------------------------------------------------------


def test_cache_reused_and_key_follows_content(tmp_path):
    files = write_corpus(tmp_path / "corpus", 5)
    cache_dir = tmp_path / "cache"
    tok = ByteTokenizer()
    first = build_token_cache(files, tok, val_fraction=0.2, cache_dir=cache_dir)
    assert first.built
    mtimes = {p: p.stat().st_mtime_ns for p in cache_dir.iterdir()}
    second = build_token_cache(files, tok, val_fraction=0.2, cache_dir=cache_dir)
    assert not second.built and second.key == first.key
    assert {p: p.stat().st_mtime_ns for p in cache_dir.iterdir()} == mtimes
    assert sorted(p.name for p in cache_dir.iterdir()) == sorted(
        f"{first.key}{s}" for s in (".train.bin", ".val.bin", ".json")
    )
    meta = first.meta
    assert meta["dtype"] == "uint16" and meta["files"] == {"train": 4, "val": 1}
    total = sum(len(f.read_bytes()) + 1 for f in files)  # one eos per document
    assert meta["tokens"]["train"] + meta["tokens"]["val"] == total

    files[2].write_text(files[2].read_text() + "!")
    assert cache_key(files, tok, 0.2) != first.key
    assert cache_key(files, tok, 0.3) != cache_key(files, tok, 0.2)
    assert build_token_cache(files, tok, val_fraction=0.2, cache_dir=cache_dir).built


def test_failed_build_leaves_nothing(tmp_path):
    files = write_corpus(tmp_path / "corpus", 3)

    class Broken(ByteTokenizer):
        calls = 0

        def encode(self, text):
            Broken.calls += 1
            if Broken.calls == 2:
                raise RuntimeError("killed mid-way")
            return super().encode(text)

    cache_dir = tmp_path / "cache"
    with pytest.raises(RuntimeError, match="killed"):
        build_token_cache(files, Broken(), val_fraction=0.3, cache_dir=cache_dir)
    assert list(cache_dir.iterdir()) == []


def test_split_is_by_file_disjoint_and_deterministic(tmp_path):
    files = write_corpus(tmp_path / "corpus", 40)
    names = [f.name for f in files]
    is_val = split_files(names, 0.1)
    assert is_val == split_files(list(names), 0.1)
    assert 0 < sum(is_val) < len(files)
    cache = build_token_cache(files, ByteTokenizer(), val_fraction=0.1, cache_dir=tmp_path / "c")

    def joined(chosen):
        return b"".join(f.read_bytes() + b"\x00" for f in chosen)

    # eos (256) is stored as-is; map it to a NUL byte to compare against the file contents.
    def as_bytes(split):
        arr = np.asarray(cache.tokens(split)).astype(np.int64)
        assert (arr <= 256).all()
        return bytes(np.where(arr == 256, 0, arr).astype(np.uint8))

    assert as_bytes("val") == joined([f for f, v in zip(files, is_val, strict=True) if v])
    assert as_bytes("train") == joined([f for f, v in zip(files, is_val, strict=True) if not v])
    # Two files and a tiny fraction still give one file to each side.
    assert sorted(split_files(["a.txt", "b.txt"], 0.001)) == [False, True]


def test_single_file_splits_its_tail(tmp_path):
    [file] = write_corpus(tmp_path / "corpus", 1)
    cache = build_token_cache([file], ByteTokenizer(), val_fraction=0.25, cache_dir=tmp_path / "c")
    n = len(file.read_bytes()) + 1
    assert cache.meta["tokens"] == {"train": n - int(n * 0.25), "val": int(n * 0.25)}
    whole = np.concatenate([cache.tokens("train"), cache.tokens("val")])
    assert whole[-1] == 256 and bytes(whole[:-1].astype(np.uint8)) == file.read_bytes()


def test_cache_dir_env_var(tmp_path, monkeypatch):
    monkeypatch.setenv("LIGHTNING_DIST_CACHE", str(tmp_path / "envcache"))
    assert default_cache_dir() == tmp_path / "envcache" / "tokens"
    write_corpus(tmp_path / "corpus", 3)
    dm = TextDataModule(paths=[str(tmp_path / "corpus")], seq_len=8, global_batch_size=2)
    dm.prepare_data()
    assert dm.cache.directory == tmp_path / "envcache" / "tokens"
    assert dm.cache.path("train").is_file()


# --- datasets ---------------------------------------------------------------------------------


def test_token_windows_overlap_by_one():
    tokens = np.arange(100, dtype=np.uint16)
    ds = TokenWindows(tokens, seq_len=8)
    assert len(ds) == 99 // 8
    for i in range(len(ds)):
        w = ds[i]
        assert w.dtype == torch.long and w.shape == (9,)
        assert w.tolist() == list(range(8 * i, 8 * i + 9))
    assert ds[0][-1] == ds[1][0]
    with pytest.raises(IndexError):
        ds[len(ds)]
    with pytest.raises(ValueError, match="val split has 8 tokens.*seq_len=8"):
        TokenWindows(tokens[:8], seq_len=8, split="val")


def test_token_windows_pickle_reopens_memmap(tmp_path):
    path = tmp_path / "t.bin"
    np.arange(50, dtype=np.uint16).tofile(path)
    ds = TokenWindows(np.memmap(path, dtype=np.uint16, mode="r"), seq_len=4)
    blob = pickle.dumps(ds)
    assert len(blob) < 1000  # the path travels, not the tokens
    again = pickle.loads(blob)
    assert isinstance(again.tokens, np.memmap)
    assert all(torch.equal(ds[i], again[i]) for i in range(len(ds)))


def test_synthetic_tokens_deterministic():
    a = SyntheticTokens(16, seq_len=10, vocab_size=50, seed=3)
    b = SyntheticTokens(16, seq_len=10, vocab_size=50, seed=3)
    c = SyntheticTokens(16, seq_len=10, vocab_size=50, seed=4)
    assert all(torch.equal(a[i], b[i]) for i in range(16))
    assert not torch.equal(a[0], c[0]) and not torch.equal(a[0], a[1])
    stacked = torch.stack([a[i] for i in range(16)])
    assert stacked.shape == (16, 11) and stacked.dtype == torch.long
    assert 0 <= int(stacked.min()) and int(stacked.max()) < 50
    # Reading in another order gives the same windows: nothing depends on global RNG state.
    torch.manual_seed(123)
    assert torch.equal(a[5], b[5])


# --- batching ---------------------------------------------------------------------------------


def test_batch_plan():
    assert batch_plan(16, 4, None) == (4, 1)
    assert batch_plan(16, 2, 2) == (2, 4)
    with pytest.raises(ValueError) as err:
        batch_plan(10, 4, 1)
    assert str(err.value) == (
        "data.global_batch_size=10 is not divisible by data-parallel size 4 x "
        "data.per_rank_batch_size=1 = 4; the nearest valid values are data.global_batch_size=8 "
        "and data.global_batch_size=12"
    )
    with pytest.raises(ValueError, match="global_batch_size=10 .* data-parallel size 4"):
        batch_plan(10, 4, None)
    with pytest.raises(
        ValueError, match="size 32; the nearest valid value is data.global_batch_size=32$"
    ):
        batch_plan(16, 32, None)  # 4 nodes of dgx_h100 under fsdp, the default batch


def test_a_pipeline_batch_error_suggests_only_values_that_pass():
    from lightning_dist.layout import Layout

    layout = Layout(pp=2, dp_shard=2, microbatches=4)
    with pytest.raises(
        ValueError,
        match=r"valid values are data.per_rank_batch_size=4 and data.per_rank_batch_size=12$",
    ):
        layout.check_batch(24, 6)  # 8 divides by 4 but not 24 / dp = 12
    for suggested in (4, 12):
        layout.check_batch(24, suggested)
        batch_plan(24, 2, suggested)
    with pytest.raises(ValueError, match="no value of data.per_rank_batch_size fits"):
        layout.check_batch(12, 3)


def steps_of(sampler: GlobalBatchSampler) -> list[list[int]]:
    stream = list(sampler)
    per_step = sampler.grad_accumulation * sampler.micro_batch_size
    assert len(stream) == len(sampler) == sampler.steps_per_epoch * per_step
    return [stream[k * per_step : (k + 1) * per_step] for k in range(sampler.steps_per_epoch)]


LAYOUTS = [(1, 12), (1, 3), (2, 6), (2, 2), (4, 3), (4, 1)]


@pytest.mark.parametrize("epoch", [0, 1])
def test_global_batch_is_the_same_set_for_every_layout(epoch):
    num_samples, gbs = 103, 12
    reference = None
    for dp, micro in LAYOUTS:
        per_rank = []
        for rank in range(dp):
            sampler = GlobalBatchSampler(num_samples, gbs, micro, rank, dp, seed=7)
            sampler.set_epoch(epoch)
            per_rank.append(steps_of(sampler))
        steps = []
        for k in range(num_samples // gbs):
            union = [i for r in range(dp) for i in per_rank[r][k]]
            assert len(set(union)) == gbs  # ranks are disjoint within a step
            steps.append(set(union))
        if reference is None:
            reference = steps
        assert steps == reference, f"dp={dp} micro={micro}"
    all_seen = set().union(*reference)
    assert len(all_seen) == (num_samples // gbs) * gbs


def test_set_epoch_and_shuffle():
    sampler = GlobalBatchSampler(40, 8, 8, 0, 1, seed=1)
    epoch0 = list(sampler)
    sampler.set_epoch(1)
    epoch1 = list(sampler)
    assert epoch0 != epoch1 and sorted(epoch0) == sorted(epoch1) == list(range(40))
    sampler.set_epoch(0)
    assert list(sampler) == epoch0
    plain = GlobalBatchSampler(42, 8, 2, 1, 2, shuffle=False)
    assert list(plain)[:4] == [2, 3, 6, 7]
    with pytest.raises(ValueError, match="5 samples.*global_batch_size=8"):
        GlobalBatchSampler(5, 8, 8, 0, 1)


def test_datamodule_batches_match_across_world_sizes():
    def step_sets(dp, micro):
        loaders = []
        for rank in range(dp):
            dm = SyntheticDataModule(
                vocab_size=97,
                seq_len=6,
                global_batch_size=8,
                micro_batch_size=micro,
                num_samples=50,
            )
            attach_dp(dm, rank, dp)
            _, accum = dm.plan()
            loaders.append(list(dm.train_dataloader()))
        steps = []
        for k in range(50 // 8):
            rows = [
                tuple(row.tolist())
                for batches in loaders
                for batch in batches[k * accum : (k + 1) * accum]
                for row in batch
            ]
            assert all(len(r) == 7 for r in rows)
            steps.append(sorted(rows))
        return steps

    reference = step_sets(1, None)
    assert step_sets(2, 2) == reference
    assert step_sets(4, None) == reference


@pytest.mark.parametrize("dp", [1, 2, 4])
def test_val_shards_disjoint_and_equal(dp):
    shards = []
    for rank in range(dp):
        dm = SyntheticDataModule(
            vocab_size=31, seq_len=4, global_batch_size=8, val_samples=100, val_batches=3
        )
        attach_dp(dm, rank, dp)
        rows = [tuple(r.tolist()) for batch in dm.val_dataloader() for r in batch]
        shards.append(rows)
    assert len({len(s) for s in shards}) == 1
    everything = [r for s in shards for r in s]
    expected = [tuple(dm.val_set[i].tolist()) for i in range(24)]
    assert everything == expected  # contiguous shards of the first val_batches * G windows


def test_text_datamodule_end_to_end(tmp_path):
    write_corpus(tmp_path / "corpus", 8)
    kwargs = dict(
        paths=[str(tmp_path / "corpus" / "*.txt")],
        seq_len=16,
        global_batch_size=4,
        micro_batch_size=1,
        val_fraction=0.25,
        val_batches=1,
        cache_dir=str(tmp_path / "cache"),
        vocab_size=320,
    )
    dm = TextDataModule(**kwargs)
    dm.prepare_data()
    dm.setup("fit")
    assert (dm.seq_len, dm.global_batch_size, dm.micro_batch_size) == (16, 4, 1)
    attach_dp(dm, 1, 2)
    assert dm.plan() == (1, 2)
    train = list(dm.train_dataloader())
    assert train[0].shape == (1, 17) and train[0].dtype == torch.long
    assert len(train) == len(dm.train_set) // 4 * 2
    assert next(iter(dm.val_dataloader())).shape == (1, 17)
    # A second datamodule (another rank, or a rerun) opens the same cache without rebuilding.
    other = TextDataModule(**kwargs)
    other.setup("fit")
    assert not other.cache.built and other.cache.key == dm.cache.key


def test_text_datamodule_short_val_split_is_clear(tmp_path):
    write_corpus(tmp_path / "corpus", 1)
    # Known from the file sizes, so the run's build stage refuses it before any process (when
    # it validates: tests/unit/test_bad_inputs.py).
    dm = TextDataModule(
        paths=[str(tmp_path / "corpus")], seq_len=100, val_fraction=0.01, cache_dir=str(tmp_path)
    )
    with pytest.raises(ValueError, match="validation split has 0 windows .*data.val_fraction"):
        dm.check_validation(1, 1)


@pytest.fixture(scope="session")
def stdlib_cache_dir(tmp_path_factory):
    """The default corpus tokenized once per test session (about a second or two)."""
    cache_dir = tmp_path_factory.mktemp("stdlib_tokens")
    dm = TextDataModule(seq_len=256, global_batch_size=16, cache_dir=str(cache_dir))
    dm.prepare_data()
    assert dm.cache.built
    return cache_dir


def test_default_corpus_cache(stdlib_cache_dir):
    dm = TextDataModule(seq_len=256, global_batch_size=16, cache_dir=str(stdlib_cache_dir))
    dm.setup("fit")
    assert not dm.cache.built
    meta = dm.cache.meta
    assert meta["files"]["train"] + meta["files"]["val"] == len(dm.files) > 1000
    assert 0 < meta["files"]["val"] < 0.05 * len(dm.files)
    assert len(dm.train_set) > 50_000 and len(dm.val_set) >= 4 * 16
    batch = next(iter(dm.train_dataloader()))
    assert batch.shape == (16, 257) and int(batch.max()) <= 256
    assert os.path.getsize(dm.cache.path("train")) == 2 * meta["tokens"]["train"]


def test_progress_bar_path_builds_the_same_cache(tmp_path, monkeypatch):
    files = write_corpus(tmp_path / "corpus", 4)
    plain = build_token_cache(files, ByteTokenizer(), val_fraction=0.3, cache_dir=tmp_path / "a")
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    bar = build_token_cache(files, ByteTokenizer(), val_fraction=0.3, cache_dir=tmp_path / "b")
    assert bar.built and bar.meta == plain.meta
    assert bar.path("train").read_bytes() == plain.path("train").read_bytes()


def test_trainer_keeps_sampler_and_reshuffles_each_epoch():
    import lightning.pytorch as pl

    class Recorder(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(1))
            self.seen: list[tuple[int, list[int]]] = []

        def training_step(self, batch, batch_idx):
            self.seen.append((self.current_epoch, batch[:, 0].tolist()))
            return (batch.float().mean() * self.weight).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)

    dm = SyntheticDataModule(vocab_size=1000, seq_len=4, global_batch_size=4, num_samples=12)
    model = Recorder()
    trainer = pl.Trainer(
        max_epochs=2,
        use_distributed_sampler=False,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, dm)
    expected = {}
    for epoch in (0, 1):
        sampler = GlobalBatchSampler(12, 4, 4, 0, 1, seed=0)
        sampler.set_epoch(epoch)
        expected[epoch] = [[int(dm.train_set[i][0]) for i in s] for s in steps_of(sampler)]
    assert [s for e, s in model.seen if e == 0] == expected[0]
    assert [s for e, s in model.seen if e == 1] == expected[1] != expected[0]


def test_invalid_utf8_bytes_are_counted_one_by_one():
    assert invalid_utf8_bytes("héllo ✓".encode()) == 0
    assert invalid_utf8_bytes(b"ab\xff\xfecd") == 2
    assert invalid_utf8_bytes("é".encode()[:1] + b"x") == 1  # a truncated sequence


def test_the_default_corpus_is_text_though_it_holds_koi8_r():
    check = TextCheck()
    koi8 = []
    for file in default_corpus():
        data = file.read_bytes()
        check.add(file, data)
        if file.name == "module_koi8_r.py":
            koi8.append(invalid_utf8_bytes(data) / len(data))
    check.finish()  # raises if not text
    assert check.invalid / check.total < 0.001
    assert not koi8 or koi8[0] > 0.3  # a file the rule over all files must let through
