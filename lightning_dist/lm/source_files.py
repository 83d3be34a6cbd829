"""Which files a source's `path` names: files, folders' files of the format, globs' matches, or
a list of them (for the prepared sources of `lm/sources.py` and the streamed ones of
`lm/streaming.py`). One `ValueError` naming `data.sources[i].path` when nothing matches."""

from __future__ import annotations

import glob
from pathlib import Path

RECORD_SUFFIXES = {
    "jsonl": (".jsonl", ".json", ".jsonl.gz", ".jsonl.zst", ".json.gz", ".json.zst"),
    "parquet": (".parquet",),
    "chat": (".jsonl", ".json", ".jsonl.gz", ".jsonl.zst", ".json.gz", ".json.zst"),
}
"""The files taken from a folder given as the path of a jsonl or parquet source."""


def record_files(path: str | list[str] | None, fmt: str, where: str) -> list[Path]:
    """The files of a jsonl, parquet or chat source: files, folders' files, globs' matches."""
    found = []
    for match in path_matches(path, where):
        if match.is_dir():
            found += [
                f
                for f in sorted(match.rglob("*"))
                if f.is_file() and f.name.endswith(RECORD_SUFFIXES[fmt])
            ]
        else:
            found.append(match)
    if not found:
        raise ValueError(f"{where}={path!r} holds no {fmt} file")
    return sorted(set(found))


def path_matches(path: str | list[str] | None, where: str, *, folders: bool = False) -> list[Path]:
    """The files and folders that a path, a glob, or a list of them names."""
    entries = [path] if isinstance(path, str) else list(path or [])
    out = []
    for entry in entries:
        found = [Path(p) for p in sorted(glob.glob(str(Path(entry).expanduser()), recursive=True))]
        found = [p for p in found if (p.is_dir() if folders else p.exists())]
        if not found:
            raise ValueError(f"{where}={entry!r} matches no {'folder' if folders else 'file'}")
        out += found
    return out
