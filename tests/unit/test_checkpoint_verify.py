"""A checkpoint is hashed once per node when it is read, in one process (real files, real
SHA-256): the second read of the same manifest trusts the node's record, and a changed manifest
is checked again and refused. The node's records go to the test's own temporary directory
(`tempfile.tempdir`), never the machine's. (Separate processes of one node are
tests/dist/test_checkpoint_verify_procs.py.)"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from lightning_dist.checkpoint.manifest import (
    CheckpointError,
    read_manifest,
    verify_files,
    write_manifest,
)

SHARD = "__1_0.distcp"


def _checkpoint(tmp_path: Path) -> Path:
    """A folder shaped like a checkpoint, 16 MiB of random shards (tens of milliseconds of
    SHA-256, long enough for processes started together to overlap), with its manifest."""
    folder = tmp_path / "step1.ckpt"
    folder.mkdir()
    for name, size in (
        ("__0_0.distcp", 8 << 20),
        (SHARD, 8 << 20),
        (".metadata", 4096),
        ("meta.pt", 1024),
    ):
        (folder / name).write_bytes(os.urandom(size))
    write_manifest(folder, {"step": 1})
    return folder


def _tmp(tmp_path: Path) -> Path:
    tmp = tmp_path / "tmp"
    tmp.mkdir(mode=0o700)
    return tmp


def test_in_one_process_a_changed_manifest_is_checked_again(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(_tmp(tmp_path)))
    folder = _checkpoint(tmp_path)
    manifest = read_manifest(folder)
    assert verify_files(folder, manifest) is True
    assert verify_files(folder, manifest) is False  # the train.py check, then the load
    manifest["files"]["__0_0.distcp"] = "0" * 64
    with pytest.raises(CheckpointError, match="__0_0.distcp does not match its hash"):
        verify_files(folder, manifest)
