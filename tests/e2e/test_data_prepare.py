"""lightning_dist.data.prepare: worker processes tokenize a tiny corpus into indexed shards that
hold exactly its documents; a prepare killed mid-way resumes without redoing finished shards;
verify catches corrupt shards and mixed tokenizers."""

from __future__ import annotations

import gzip
import json
import multiprocessing
import os
import signal
from pathlib import Path

import numpy as np
import pytest

from lightning_dist.data.__main__ import main
from lightning_dist.data.indexed import IndexedDataset
from lightning_dist.data.manifest import load_manifests, verify
from lightning_dist.data.prepare import prepare
from lightning_dist.run.errors import ConfigError

pytest.importorskip("zstandard")


def corpus(folder: Path) -> dict[str, list[str]]:
    """Three JSON Lines files (one gzip-compressed) of 120 documents of varied length."""
    folder.mkdir()
    docs = {}
    for k, name in enumerate(["a.jsonl", "b.jsonl.gz", "sub/c.jsonl"]):
        texts = [f"doc {k}.{i} ünï " + "word " * ((i * 7 + k) % 40) for i in range(120)]
        data = "".join(json.dumps({"text": t}) + "\n" for t in texts).encode()
        (folder / name).parent.mkdir(exist_ok=True)
        (folder / name).write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
        docs[name] = texts
    return docs


def read_back(folder: Path) -> dict[str, list[str]]:
    """Every shard's documents, per source file in part order, decoded from byte tokens."""
    out: dict[str, list[str]] = {}
    for shard in sorted(load_manifests(folder)["shards"], key=lambda s: (s["source"], s["part"])):
        data = IndexedDataset(folder / shard["name"])
        for i in range(len(data)):
            tokens = data.get(i)
            assert tokens[-1] == 256  # the byte tokenizer's end of document
            out.setdefault(shard["source"], []).append(bytes(tokens[:-1].astype(np.uint8)).decode())
    return out


def test_two_workers_write_every_document_once(tmp_path):
    docs = corpus(tmp_path / "in")
    manifest = prepare(
        [str(tmp_path / "in/**/*.jsonl*")],
        tmp_path / "out",
        workers=2,
        shard_tokens=2000,
        progress=False,
    )
    assert read_back(tmp_path / "out") == docs
    assert manifest["complete"] and len(manifest["shards"]) > 6
    assert {f: r["documents"] for f, r in manifest["files"].items()} == dict.fromkeys(docs, 120)
    assert verify(tmp_path / "out")["tokenizer"]["name"] == "byte"

    # A tokenizer.json: the worker's batch encoding gives the ids the data pipeline's encode does.
    from lightning_dist.lm.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(word_tokenizer(tmp_path))
    prepare(
        [str(tmp_path / "in/a.jsonl")],
        tmp_path / "words",
        tokenizer=str(tokenizer.path),
        progress=False,
    )
    shard = load_manifests(tmp_path / "words")["shards"][0]
    data = IndexedDataset(tmp_path / "words" / shard["name"])
    expected = [[*tokenizer.encode(text).tolist(), tokenizer.eos_id] for text in docs["a.jsonl"]]
    assert [data.get(i).tolist() for i in range(len(data))] == expected
    assert {3} < {t for doc in expected for t in doc}  # real words, not only [UNK]


def test_a_killed_prepare_resumes_without_redoing_finished_shards(tmp_path):
    docs = corpus(tmp_path / "in")
    args = ([str(tmp_path / "in/**/*.jsonl*")], tmp_path / "out")
    kw = dict(workers=2, shard_tokens=1500, progress=False)

    class Killed(Exception):
        pass

    def kill_after_two(record: dict) -> None:
        if len(load_manifests(tmp_path / "out")["shards"]) == 2:
            for child in multiprocessing.active_children():  # the workers prepare started
                os.kill(child.pid, signal.SIGKILL)
            raise Killed  # and this process dies with them: the manifest lists two shards

    with pytest.raises(Killed):
        prepare(*args, **kw, on_shard=kill_after_two)
    finished = {
        s["name"]: os.stat(tmp_path / "out" / f"{s['name']}.bin")
        for s in load_manifests(tmp_path / "out")["shards"]
    }
    assert len(finished) == 2
    redone = []
    prepare(*args, **kw, on_shard=lambda record: redone.append(record["name"]))
    assert not set(redone) & set(finished)  # none of the finished shards was tokenized again
    for name, before in finished.items():
        after = os.stat(tmp_path / "out" / f"{name}.bin")
        assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert read_back(tmp_path / "out") == docs
    assert not [p for p in (tmp_path / "out").iterdir() if ".tmp-" in p.name]
    assert prepare(*args, **kw, on_shard=redone.append) and len(redone) == len(set(redone))


def test_refusals_and_verify(tmp_path, capsys):
    corpus(tmp_path / "in")
    (tmp_path / "in" / "bad.jsonl").write_bytes(b'{"text": "a"}\n{"text": \n')
    pattern = str(tmp_path / "in/*.jsonl")
    with pytest.raises(ConfigError, match=r"bad.jsonl:2: not valid JSON"):
        prepare([pattern], tmp_path / "bad", progress=False)
    prepare([pattern], tmp_path / "skip", skip_bad_records=True, progress=False)
    assert load_manifests(tmp_path / "skip")["files"]["bad.jsonl"]["skipped"] == 1
    with pytest.raises(ConfigError, match=r"lists input 'bad.jsonl', which is not among"):
        prepare([str(tmp_path / "in/a.jsonl")], tmp_path / "skip", progress=False)
    with pytest.raises(ConfigError, match=r"--input '.*nothing\*' matches no file"):
        prepare([str(tmp_path / "nothing*")], tmp_path / "x")
    with pytest.raises(ConfigError, match=r"--shard-index 2 must be in 0..1"):
        prepare([pattern], tmp_path / "x", shard_index=2, shard_count=2)
    with pytest.raises(ConfigError, match=r"/in/\*\*' reads \(it matches .*/in/x/manifest.json\)"):
        prepare([str(tmp_path / "in/**")], tmp_path / "in/x")  # a restart would read its shards
    with pytest.raises(ConfigError, match=r"--output '.*a.jsonl' is a file, not a folder"):
        prepare([pattern], tmp_path / "in/a.jsonl")
    with pytest.raises(ValueError, match=r"--tokenizer: '.*a.jsonl' is not a tokenizer.json"):
        prepare([pattern], tmp_path / "x", tokenizer=str(tmp_path / "in/a.jsonl"))
    with pytest.raises(SystemExit) as zero:  # 0 is not the default
        main(
            [
                "prepare",
                "--input",
                pattern,
                "--output",
                str(tmp_path / "x"),
                "--shard-tokens",
                "0",
                "--workers",
                "1",
            ]
        )
    assert zero.value.code == 2
    assert capsys.readouterr().err == "error: --shard-tokens 0 must be 1 or more\n"

    pattern = str(tmp_path / "in/a.jsonl")
    out = tmp_path / "out"
    prepare([pattern], out, shard_count=2, shard_index=0, progress=False)
    tokenizer = word_tokenizer(tmp_path)
    with pytest.raises(ConfigError, match=r"was prepared with tokenizer"):
        prepare([pattern], out, shard_count=2, shard_index=0, tokenizer=tokenizer)
    prepare([pattern], out, shard_count=2, shard_index=1, tokenizer=tokenizer, progress=False)
    with pytest.raises(
        ConfigError, match=r"shards of tokenizer hf:words.json:\w+ beside shards of byte"
    ):
        verify(out)
    shard = load_manifests(tmp_path / "skip")["shards"][0]["name"]
    path = tmp_path / "skip" / f"{shard}.bin"
    path.write_bytes(b"\x00" + path.read_bytes()[1:])
    with pytest.raises(ConfigError, match=rf"{shard}.bin: checksum or size does not match"):
        verify(tmp_path / "skip")


def word_tokenizer(folder: Path) -> str:
    tokenizers = pytest.importorskip("tokenizers")
    words = {"[UNK]": 0, "<|endoftext|>": 1, "doc": 2, "word": 3}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(words, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.save(str(folder / "words.json"))
    return str(folder / "words.json")


def test_the_command_line_prepares_and_refuses_in_one_line(tmp_path):
    import subprocess
    import sys

    corpus(tmp_path / "in")
    (tmp_path / "bad.jsonl").write_bytes(b'{"body": "a"}\n')
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "lightning_dist.data", *args],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    done = run(
        "prepare",
        "--input",
        str(tmp_path / "in/*.jsonl"),
        "--output",
        str(tmp_path / "o"),
        "--workers",
        "1",
        "--shard-tokens",
        "5000",
    )
    assert done.returncode == 0, done.stderr
    assert "prepare: 1/1 files, 120 documents" in done.stderr
    assert run("verify", str(tmp_path / "o")).stdout.endswith(": ok\n")
    bad = run("prepare", "--input", str(tmp_path / "bad.jsonl"), "--output", str(tmp_path / "b"))
    assert bad.returncode == 2
    assert bad.stderr.splitlines() == [
        f"error: {tmp_path}/bad.jsonl:1: no field 'text' (the record's fields: 'body'); set the field that holds the text (train.py: data.sources[i].field; prepare: --field)"
    ]
