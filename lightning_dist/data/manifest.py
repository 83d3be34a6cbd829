"""The manifest of a prepared folder: which token shards are finished, what made them, and
their checksums; and `verify`, which checks a folder against its manifests.

A prepare of slice i of n writes `manifest.json` (n = 1) or `manifest-<i>-of-<n>.json`, so the
nodes or Slurm array tasks that prepare one corpus into one shared folder never write the same
file. A manifest is rewritten whole (to a temporary name, then renamed) after every finished
shard, so a killed prepare leaves the last complete one.

    {"format": 1, "tokenizer": {"name", "vocab_size", "eos_id"}, "dtype": "uint16",
     "input": {"format", "field"}, "slice": [i, n], "complete": false,
     "files": {"<input name>": {"bytes", "complete", "documents", "skipped"}},
     "shards": [{"name", "source", "part", "first_document", "documents", "tokens",
                 "bin_sha256", "idx_sha256", "bin_bytes", "idx_bytes"}, ...]}
"""

from __future__ import annotations

import json
import os
import re
import uuid
from pathlib import Path

from lightning_dist.runtime.hashing import file_sha256
from lightning_dist.runtime.refusal import ConfigError

MANIFEST_FORMAT = 1
_MANIFEST_NAME = re.compile(r"manifest(-\d+-of-\d+)?\.json")


def manifest_name(shard_index: int, shard_count: int) -> str:
    """The manifest file of one slice of a prepare."""
    if shard_count == 1:
        return "manifest.json"
    return f"manifest-{shard_index:05d}-of-{shard_count:05d}.json"


def manifest_files(directory: str | os.PathLike) -> list[Path]:
    """Every manifest in a prepared folder, sorted."""
    folder = Path(directory)
    if not folder.is_dir():
        raise ConfigError(f"{folder} is not a folder of prepared shards")
    found = sorted(p for p in folder.iterdir() if _MANIFEST_NAME.fullmatch(p.name))
    if not found:
        raise ConfigError(f"{folder} holds no manifest.json; prepare it first")
    return found


def read_manifest(path: Path) -> dict:
    """One manifest; ConfigError when it is not one of ours."""
    try:
        manifest = json.loads(path.read_bytes())
        if manifest["format"] != MANIFEST_FORMAT:
            raise ValueError(f"format {manifest['format']}, expected {MANIFEST_FORMAT}")
        manifest["tokenizer"]["name"], manifest["shards"]  # noqa: B018 (present, or KeyError)
        for shard in manifest["shards"]:  # a shard's files are read beside the manifest only
            name = str(shard["name"])
            if not name or Path(name).name != name or name in (".", ".."):
                raise ValueError(f"shard name {name!r} leads out of its folder")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{path} is not a prepare manifest ({e})") from e
    return manifest


def write_manifest(path: Path, manifest: dict) -> None:
    """Replace `path` with `manifest` in one rename."""
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    tmp.write_text(json.dumps(manifest, indent=1) + "\n")
    os.replace(tmp, path)


def load_manifests(directory: str | os.PathLike) -> dict:
    """All manifests of a folder as one: their shards together, and the one tokenizer and dtype
    they share. Shards of different tokenizers in one folder are refused."""
    merged: dict | None = None
    for path in manifest_files(directory):
        manifest = read_manifest(path)
        if merged is None:
            merged = {**manifest, "shards": [], "files": {}, "complete": True}
        elif manifest["tokenizer"] != merged["tokenizer"] or manifest["dtype"] != merged["dtype"]:
            raise ConfigError(
                f"{path}: shards of tokenizer {manifest['tokenizer']['name']} beside shards of "
                f"{merged['tokenizer']['name']} in {directory}; prepare each tokenizer into its "
                "own folder"
            )
        merged["shards"] += manifest["shards"]
        merged["files"].update(manifest["files"])
        merged["complete"] = merged["complete"] and manifest["complete"]
    assert merged is not None
    return merged


def _check_slices(folder: Path) -> None:
    """ConfigError when the manifests are not every slice of one prepare: a slice whose node or
    array task never wrote its manifest would leave its files out unseen."""
    slices = [tuple(read_manifest(p).get("slice", (0, 1))) for p in manifest_files(folder)]
    counts = sorted({n for _, n in slices})
    if len(counts) > 1:
        raise ConfigError(
            f"{folder} holds manifests of {' and '.join(map(str, counts))} "
            "slices; prepare each slicing into its own folder"
        )
    missing = sorted(set(range(counts[0])) - {i for i, _ in slices})
    if missing:
        raise ConfigError(
            f"{folder}: slice {missing[0]} of {counts[0]} has no manifest "
            f"({manifest_name(missing[0], counts[0])}; {len(missing)} missing): run prepare "
            f"with --shard-index {missing[0]} --shard-count {counts[0]}"
        )


def verify(directory: str | os.PathLike, *, checksums: bool = True) -> dict:
    """Check every shard a folder's manifests list: both files there, their sizes, and (when
    `checksums`) their sha256; and that every slice of the prepare wrote its manifest. Returns the merged manifest; ConfigError in one line naming the
    first shard that fails, or tokenizers that differ."""
    folder = Path(directory)
    merged = load_manifests(folder)
    _check_slices(folder)
    for shard in merged["shards"]:
        for kind in ("bin", "idx"):
            path = folder / f"{shard['name']}.{kind}"
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                raise ConfigError(f"{path} is missing (listed in the manifest)") from None
            if size != shard[f"{kind}_bytes"] or (
                checksums and file_sha256(path) != shard[f"{kind}_sha256"]
            ):
                raise ConfigError(
                    f"{path}: checksum or size does not match the manifest; the shard is "
                    "corrupt or truncated: delete it and run prepare again to redo it"
                )
    return merged
