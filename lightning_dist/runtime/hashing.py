"""The sha256 of a file, read in pieces: the one digest of the checkpoint manifests
(`checkpoint/manifest.py`) and of prepared token shards (`data/manifest.py`)."""

from __future__ import annotations

import hashlib
import os

CHUNK_BYTES = 1 << 20


def file_sha256(path: str | os.PathLike) -> str:
    """The hex sha256 of a file, read `CHUNK_BYTES` at a time."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()
