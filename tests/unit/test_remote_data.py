"""Remote sources (lightning_dist/data/remote.py) against a real S3-protocol server process:
moto's standalone server, started once for this module on 127.0.0.1 and a free port, stopped
after. It proves the s3fs/fsspec path end to end over HTTP (listing, globs, ETags, downloads,
credentials taken from the environment); not real S3's latency, consistency, throttling or
authentication (moto accepts any key).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest

from lightning_dist.data.remote import fetch_remote_sources
from lightning_dist.lm.data import MixtureDataModule
from tests.dist.world import free_port

SECRET_KEY = "planted-remote-secret-0000"
DOCS = [json.dumps({"text": f"document {i} " + "word " * (20 + i)}) for i in range(40)]


@pytest.fixture(scope="module")
def s3():
    """An S3 endpoint (moto_server) with bucket `corpus`: two JSON Lines shards and a token
    file; yields (endpoint_url, boto3 client). AWS credentials for it are in the environment
    while the module runs."""
    pytest.importorskip("moto")
    boto3 = pytest.importorskip("boto3")
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    saved = {
        k: os.environ.get(k)
        for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")
    }
    os.environ.update(
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY=SECRET_KEY,
        AWS_DEFAULT_REGION="us-east-1",
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(endpoint, timeout=1)
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("moto_server did not start") from None
                time.sleep(0.1)
        client = boto3.client("s3", endpoint_url=endpoint)
        client.create_bucket(Bucket="corpus")
        for part in range(2):
            body = "\n".join(DOCS[part * 20 : (part + 1) * 20]) + "\n"
            client.put_object(Bucket="corpus", Key=f"docs/part-{part}.jsonl", Body=body.encode())
        ids = (np.arange(3000) % 250).astype("<u2")
        client.put_object(Bucket="corpus", Key="ids/a.bin", Body=ids.tobytes())
        yield endpoint, client
    finally:
        server.terminate()
        server.wait(timeout=10)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _module(sources, cache_dir, **kwargs) -> MixtureDataModule:
    return MixtureDataModule(
        sources=sources,
        seq_len=32,
        global_batch_size=4,
        vocab_size=512,
        cache_dir=str(cache_dir),
        **kwargs,
    )


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(np.array_equal(np.asarray(a), np.asarray(b)))


def test_remote_sources_read_like_their_local_copies(s3, tmp_path, caplog):
    endpoint, _ = s3
    options = {"endpoint_url": endpoint}
    remote = [
        {"path": "s3://corpus/docs/*.jsonl", "format": "jsonl", "storage_options": options},
        {"path": "s3://corpus/ids/a.bin", "format": "tokens", "storage_options": options,
         "weight": 0.5},
    ]  # fmt: skip
    local_dir = tmp_path / "local"
    (local_dir / "docs").mkdir(parents=True)
    for part in range(2):
        body = "\n".join(DOCS[part * 20 : (part + 1) * 20]) + "\n"
        (local_dir / "docs" / f"part-{part}.jsonl").write_text(body)
    (local_dir / "a.bin").write_bytes((np.arange(3000) % 250).astype("<u2").tobytes())
    local = [
        {"path": str(local_dir / "docs/*.jsonl"), "format": "jsonl", "name": "docs"},
        {"path": str(local_dir / "a.bin"), "format": "tokens", "weight": 0.5, "name": "a.bin"},
    ]
    with caplog.at_level(logging.INFO):
        from_s3 = _module(remote, tmp_path / "cache")
    assert from_s3.names == ["docs", "a.bin"]  # named by their URLs
    assert "3 remote files" in caplog.text and "3 copied" in caplog.text
    assert SECRET_KEY not in caplog.text
    from_disk = _module(local, tmp_path / "cache_local")
    for module in (from_s3, from_disk):
        module.setup("fit")
    batch = next(iter(from_s3.train_dataloader()))
    expected = next(iter(from_disk.train_dataloader()))
    assert _same(batch, expected)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        _module(remote, tmp_path / "cache")  # a second run finds every copy fresh
    assert "0 copied" in caplog.text and "3 found in the cache" in caplog.text


def test_cache_cap_evicts_least_recently_used_and_refuses_a_shard_above_it(s3, tmp_path):
    endpoint, client = s3
    options = {"endpoint_url": endpoint}
    root = tmp_path / "remote"

    def fetch(path: str, cap: int) -> list[str]:
        request = {
            "paths": [path],
            "format": "jsonl",
            "where": "data.sources[0].path",
            "storage_options": options,
        }
        return fetch_remote_sources([request], cache_root=root, cap_bytes=cap)[0]

    part0 = client.head_object(Bucket="corpus", Key="docs/part-0.jsonl")["ContentLength"]
    part1 = client.head_object(Bucket="corpus", Key="docs/part-1.jsonl")["ContentLength"]
    cap = max(part0, part1) + 10  # room for one shard
    (first,) = fetch("s3://corpus/docs/part-0.jsonl", cap)
    (second,) = fetch("s3://corpus/docs/part-1.jsonl", cap)
    assert not os.path.exists(first) and os.path.getsize(second) == part1  # part-0 evicted
    with pytest.raises(
        ValueError, match=r"part-0.jsonl has \d+ bytes, above data.remote_cache_gib"
    ):
        fetch("s3://corpus/docs/part-0.jsonl", part0 - 1)
    with pytest.raises(ValueError, match="the run's 2 remote files hold"):
        fetch("s3://corpus/docs/*.jsonl", cap)
    with pytest.raises(ValueError, match="'s3://corpus/nothing/\\*.jsonl' matches no remote file"):
        fetch("s3://corpus/nothing/*.jsonl", cap)
    with pytest.raises(ValueError, match="'s3://no-such-bucket/a.jsonl' matches no remote file"):
        fetch("s3://no-such-bucket/a.jsonl", cap)
    # A changed object (same key, new ETag) is copied again.
    client.put_object(Bucket="corpus", Key="docs/part-9.jsonl", Body=b'{"text": "old"}\n')
    (copy,) = fetch("s3://corpus/docs/part-9.jsonl", cap)
    client.put_object(Bucket="corpus", Key="docs/part-9.jsonl", Body=b'{"text": "new"}\n')
    assert fetch("s3://corpus/docs/part-9.jsonl", cap) == [copy]
    assert open(copy).read() == '{"text": "new"}\n'
