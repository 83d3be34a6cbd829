"""A checkpoint is hashed once per node when it is read: real files, real SHA-256, real separate
processes, forked from the test process (which has imported lightning_dist already, so that
several start at the same moment without each paying for `import torch`), each with its own file
descriptors and locks and the test's own temporary directory for the node's records
(`tempfile.tempdir`), never the machine's. One hashes and the others trust it; all refuse a byte
changed (even under the old size and modification time) and a record made for another manifest;
a record folder others can write is not used; the others wait for the hashing process and go on
when it is killed. (The one-process check is tests/unit/test_checkpoint_verify.py.)"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import stat
import tempfile
import time
from pathlib import Path

import pytest

from lightning_dist.checkpoint.manifest import (
    MANIFEST,
    CheckpointError,
    read_manifest,
    verify_files,
    write_manifest,
)
from tests.unit.test_checkpoint_verify import SHARD, _checkpoint, _tmp

N = 4  # processes of one node


@pytest.fixture(scope="module")
def context():
    return multiprocessing.get_context("fork")


def _verify(folder: str, tmp: str, barrier, results) -> None:
    tempfile.tempdir = tmp
    manifest = read_manifest(Path(folder))
    if barrier is not None:
        barrier.wait(timeout=60)
    try:
        results.put(("hashed" if verify_files(Path(folder), manifest) else "trusted", ""))
    except CheckpointError as error:
        results.put(("refused", str(error)))


def _run(context, folder: Path, tmp: Path, n: int = N) -> list[tuple[str, str]]:
    """`verify_files` in `n` new processes released together; (outcome, error) of each."""
    barrier, results = context.Barrier(n), context.Queue()
    processes = [
        context.Process(target=_verify, args=(str(folder), str(tmp), barrier, results))
        for _ in range(n)
    ]
    for process in processes:
        process.start()
    outcomes = [results.get(timeout=60) for _ in processes]
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0
    return sorted(outcomes)


def _flip_a_byte(path: Path, *, mtime_ns: int) -> None:
    """One byte changed in place (same size), then the modification time set to `mtime_ns`."""
    with open(path, "r+b") as f:
        f.seek(1000)
        byte = f.read(1)[0]
        f.seek(1000)
        f.write(bytes([byte ^ 1]))
    os.utime(path, ns=(path.stat().st_atime_ns, mtime_ns))


def test_the_processes_of_a_node_hash_a_checkpoint_once_and_all_refuse_a_changed_byte(
    context, tmp_path
):
    folder, tmp = _checkpoint(tmp_path), _tmp(tmp_path)
    assert [o for o, _ in _run(context, folder, tmp)] == ["hashed"] + ["trusted"] * (N - 1)
    records = tmp / f"lightning_dist-{os.getuid()}" / "verified"
    assert stat.S_IMODE(records.stat().st_mode) == stat.S_IMODE(records.parent.stat().st_mode)
    assert stat.S_IMODE(records.stat().st_mode) == 0o700

    shard = folder / SHARD
    _flip_a_byte(shard, mtime_ns=shard.stat().st_mtime_ns + 1_000_000_000)
    refused = _run(context, folder, tmp)
    assert [o for o, _ in refused] == ["refused"] * N
    for _, error in refused:
        assert f"{folder}: {SHARD} does not match its hash in {MANIFEST}" in error

    # The byte put back: the record of the failure is not trusted for the new times.
    _flip_a_byte(shard, mtime_ns=shard.stat().st_mtime_ns + 1_000_000_000)
    assert [o for o, _ in _run(context, folder, tmp)] == ["hashed"] + ["trusted"] * (N - 1)


def test_a_record_made_for_another_manifest_is_not_trusted(context, tmp_path):
    folder, tmp = _checkpoint(tmp_path), _tmp(tmp_path)
    assert _run(context, folder, tmp, 1) == [("hashed", "")]
    # The files untouched (sizes and times as recorded), the manifest claims another hash.
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["files"]["__0_0.distcp"] = "0" * 64
    (folder / MANIFEST).write_text(json.dumps(manifest))
    refused = _run(context, folder, tmp, 2)
    assert [o for o, _ in refused] == ["refused"] * 2
    assert all("__0_0.distcp does not match its hash" in error for _, error in refused)
    # Rewritten by the writer (another step, the true hashes): hashed again, once.
    write_manifest(folder, {"step": 2})
    assert [o for o, _ in _run(context, folder, tmp, 2)] == ["hashed", "trusted"]


def test_a_byte_changed_under_the_old_size_and_modification_time_is_caught(context, tmp_path):
    folder, tmp = _checkpoint(tmp_path), _tmp(tmp_path)
    assert _run(context, folder, tmp, 1) == [("hashed", "")]
    shard = folder / SHARD
    _flip_a_byte(shard, mtime_ns=shard.stat().st_mtime_ns)  # as `cp -p` or `touch -r` would
    assert [o for o, _ in _run(context, folder, tmp, 2)] == ["refused"] * 2


def test_a_record_folder_others_can_write_is_not_used(context, tmp_path):
    folder, tmp = _checkpoint(tmp_path), _tmp(tmp_path)
    shared = tmp / f"lightning_dist-{os.getuid()}"
    shared.mkdir()
    shared.chmod(0o777)
    assert [o for o, _ in _run(context, folder, tmp, 2)] == ["hashed", "hashed"]
    assert not (shared / "verified").exists()


def _hold_the_lock(folder: str, tmp: str, held) -> None:
    from lightning_dist.checkpoint.manifest import _manifest_digest, _node_record

    tempfile.tempdir = tmp
    with _node_record(Path(folder).resolve(), _manifest_digest(read_manifest(Path(folder)))):
        held.set()
        time.sleep(60)


def test_the_others_wait_for_the_process_hashing_and_go_on_when_it_is_killed(context, tmp_path):
    folder, tmp = _checkpoint(tmp_path), _tmp(tmp_path)
    held, results = context.Event(), context.Queue()
    holder = context.Process(target=_hold_the_lock, args=(str(folder), str(tmp), held))
    holder.start()
    assert held.wait(timeout=60)
    waiting = [
        context.Process(target=_verify, args=(str(folder), str(tmp), None, results))
        for _ in range(2)
    ]
    for process in waiting:
        process.start()
    time.sleep(0.5)
    assert results.empty()  # they wait on the lock instead of hashing beside the holder
    os.kill(holder.pid, signal.SIGKILL)  # dies holding it: the kernel releases the lock
    holder.join(timeout=60)
    assert sorted(results.get(timeout=60)[0] for _ in waiting) == ["hashed", "trusted"]
    for process in waiting:
        process.join(timeout=60)
        assert process.exitcode == 0
