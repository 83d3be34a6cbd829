"""`manifest.json`: what a checkpoint folder holds, written last, checked first.

The manifest names the format and its version, the step, the model's arguments, the layout and
strategy that wrote it, the data position, the precision, the library versions, and a SHA-256 of
every other file in the folder. Loading reads it before anything else: a missing or unreadable
manifest, a future version, or a file whose bytes differ from its hash stops the load with one
line, before any file is deserialised. Plain JSON; nothing here imports Lightning.
`CheckpointError` is checkpoint/safe.py's, one class for every refusal.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from lightning_dist.checkpoint.safe import CheckpointError

__all__ = ["FORMAT", "MANIFEST", "VERSION", "CheckpointError", "open_manifest", "write_manifest"]

FORMAT = "lightning_dist.checkpoint"
VERSION = 1
MANIFEST = "manifest.json"
_CHUNK = 1 << 20


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def file_hashes(folder: Path) -> dict[str, str]:
    """{relative name: sha256} of every file in `folder` except the manifest."""
    return {
        str(p.relative_to(folder)): sha256_of(p)
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }


def write_manifest(folder: Path, fields: dict[str, Any]) -> dict[str, Any]:
    """Hash the folder's files and write `manifest.json` (under a temporary name, then renamed:
    the manifest's presence is what makes the checkpoint complete)."""
    folder = Path(folder)
    manifest = {"format": FORMAT, "version": VERSION, **fields, "files": file_hashes(folder)}
    temporary = folder / (MANIFEST + ".tmp")
    temporary.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    temporary.replace(folder / MANIFEST)
    return manifest


def read_manifest(folder: Path) -> dict[str, Any]:
    """The manifest of `folder`, checked for format and version; CheckpointError if it is not
    a checkpoint of this format that this version can read."""
    folder = Path(folder)
    if not folder.exists():
        raise CheckpointError(f"checkpoint {folder} does not exist; check trainer.ckpt_path")
    if folder.is_file():
        raise CheckpointError(
            f"checkpoint {folder} is a single file, not a lightning_dist checkpoint folder "
            "(the format before version 1); resume from a step<N>.ckpt folder written by this "
            "version"
        )
    path = folder / MANIFEST
    if not path.is_file():
        raise CheckpointError(
            f"checkpoint {folder} has no {MANIFEST}: the save did not finish (or it predates "
            "the format); resume from an earlier complete step<N>.ckpt"
        )
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(
            f"checkpoint {folder}: {MANIFEST} is not valid JSON ({type(e).__name__}); the "
            "checkpoint is damaged, resume from another one"
        ) from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(
            f"checkpoint {folder}: {MANIFEST} does not describe a {FORMAT} checkpoint"
        )
    version = manifest.get("version")
    if not isinstance(version, int) or version > VERSION:
        raise CheckpointError(
            f"checkpoint {folder} has format version {version!r}, newer than this lightning_dist "
            f"reads (version {VERSION}); upgrade lightning_dist to load it"
        )
    return manifest


def verify_files(folder: Path, manifest: dict[str, Any]) -> None:
    """Every file the manifest names is there with its recorded hash, and nothing else is;
    CheckpointError naming the first file that is missing, extra or changed."""
    folder = Path(folder)
    recorded: dict[str, str] = manifest.get("files") or {}
    if not recorded:
        raise CheckpointError(f"checkpoint {folder}: {MANIFEST} lists no files; it is damaged")
    present = {
        str(p.relative_to(folder))
        for p in folder.rglob("*")
        if p.is_file() and p.name not in (MANIFEST, MANIFEST + ".tmp")
    }
    for name in sorted(recorded):
        if name not in present:
            raise CheckpointError(
                f"checkpoint {folder} is partial: {name} is missing; resume from another one"
            )
    extra = sorted(present - set(recorded))
    if extra:
        raise CheckpointError(
            f"checkpoint {folder} holds {extra[0]}, a file its {MANIFEST} does not list; "
            "remove it or resume from another checkpoint"
        )
    stamp = _file_stamps(folder, recorded)
    if _verified.get(folder.resolve()) == stamp:
        return  # hashed by this process already (train.py's check, then the load), unchanged
    for name, expected in sorted(recorded.items()):
        if sha256_of(folder / name) != expected:
            raise CheckpointError(
                f"checkpoint {folder}: {name} does not match its hash in {MANIFEST} "
                "(truncated or modified); resume from another checkpoint"
            )
    _verified[folder.resolve()] = stamp


_verified: dict[Path, tuple] = {}
"""Folders this process has hashed, with the size and mtime of each file then: the check before
launch and the load in the same process read every byte once, not twice."""


def _file_stamps(folder: Path, names) -> tuple:
    return tuple(
        (n, (folder / n).stat().st_size, (folder / n).stat().st_mtime_ns) for n in sorted(names)
    )


def open_manifest(folder: Path) -> dict[str, Any]:
    """`read_manifest` then `verify_files`: the manifest of a checkpoint safe to deserialise."""
    manifest = read_manifest(folder)
    verify_files(folder, manifest)
    return manifest
