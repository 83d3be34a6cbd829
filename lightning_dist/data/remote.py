"""Remote sources: a `data.sources[i].path` that is an fsspec URL (`s3://bucket/prefix/*.jsonl`,
`gs://...`, any protocol fsspec knows) is listed, its shards are copied into a local cache, and
the source reads those copies with the same readers as local files.

The cache lives in `<cache_dir>/remote/<protocol>/<bucket>/<key>` and holds at most
`data.remote_cache_gib`. A copy is kept while the remote object's size and ETag (or modification
time) are unchanged, recorded next to it in `<file>.remote.json`; each use touches it, and copies
of other runs are evicted least recently used first to make room. Every shard of one run must fit
in the cap together (the token files are memory-mapped for the whole run), so a run whose shards
need more, or one shard above the cap, is refused in one line before any download.

Credentials are fsspec's and the cloud SDK's own (for `s3://`: the AWS environment variables,
`~/.aws`, instance roles), or `data.sources[i].storage_options`; they are never logged: a URL is
logged with any `user:password@` part redacted (`runtime/redaction.py`), and `storage_options`'s
secret keys are redacted wherever the config is written.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightning_dist.runtime.redaction import redact_text

log = logging.getLogger(__name__)

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")
_SIDE = ".remote.json"
_CREDENTIAL_OPTIONS = {"key", "secret", "token", "anon", "profile", "session"}
"""storage_options that say how an s3:// source authenticates, so the AWS chain is not asked."""


def is_url(path: Any) -> bool:
    """Whether a path names remote storage (`protocol://...`)."""
    return isinstance(path, str) and bool(_URL.match(path))


def _filesystem(url: str, storage_options: Mapping[str, Any], where: str):
    """fsspec's filesystem for `url` and the path inside it; ValueError (one line) when the
    protocol is unknown or its package is missing, or when s3 has no credentials."""
    import fsspec

    protocol = url.split("://", 1)[0]
    try:
        fsspec.get_filesystem_class(protocol)  # its package is there
    except (ValueError, ImportError) as e:
        known = ", ".join(p + "://" for p in ("s3", "gs", "az", "hf", "http", "https", "memory"))
        raise ValueError(
            f"{where}={redact_text(url)!r}: protocol {protocol!r} is not one fsspec can read "
            f"({str(e).splitlines()[0]}); use a local path or one of {known}"
        ) from None
    options = dict(storage_options)
    if protocol in ("s3", "s3a") and not _CREDENTIAL_OPTIONS & set(options):
        _check_aws_credentials(url, where)
    # fsspec keeps one filesystem per options: its client is made once per process
    fs, path = fsspec.core.url_to_fs(url, **options)
    fs.invalidate_cache()  # but its listings are read afresh: a changed object must show
    return fs, path


def _check_aws_credentials(url: str, where: str) -> None:
    import botocore.session

    if botocore.session.Session().get_credentials() is None:
        raise ValueError(
            f"{where}={redact_text(url)!r} needs AWS credentials and none were found: set "
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, ~/.aws/credentials, an "
            f"instance role), or {where.rsplit('.', 1)[0]}.storage_options={{anon: true}} for a "
            "public bucket"
        )


def _listing(fs, path: str, url: str, fmt: str, where: str) -> dict[str, dict]:
    """The remote files that `path` (a file, a folder, a glob) names, with their details."""
    candidates = [path]
    if fmt == "megatron" and not path.endswith((".bin", ".idx")):
        candidates = [path + ".bin", path + ".idx", path]  # a prefix names its .bin and .idx
    found: dict[str, dict] = {}
    try:
        for pattern in candidates:
            if any(c in pattern for c in "*?["):
                found |= {
                    p: d
                    for p, d in fs.glob(pattern, detail=True).items()
                    if d.get("type") == "file"
                }
                continue
            if not fs.exists(pattern):
                continue
            if fs.isdir(pattern):
                found |= fs.find(pattern, detail=True)
            else:
                found[pattern] = fs.info(pattern)
    except (PermissionError, OSError) as e:
        raise ValueError(
            f"{where}={redact_text(url)!r} cannot be listed: {redact_text(str(e).splitlines()[0])}"
        ) from None
    if fmt == "megatron":  # each index with its data file
        for name in list(found):
            sibling = name[:-4] + (".bin" if name.endswith(".idx") else ".idx")
            if name.endswith((".bin", ".idx")) and sibling not in found and fs.exists(sibling):
                found[sibling] = fs.info(sibling)
    if not found:
        raise ValueError(
            f"{where}={redact_text(url)!r} matches no remote file; check the bucket, "
            "the key and the glob"
        )
    return found


def _version(details: Mapping[str, Any]) -> str:
    """What says the remote object changed: its ETag, else its modification time."""
    for key in ("ETag", "etag", "md5Hash", "LastModified", "mtime", "updated", "created"):
        if details.get(key) is not None:
            return f"{key}:{details[key]}"
    return ""


class RemoteCache:
    """Local copies of remote shards under `root`, at most `cap_bytes` in all."""

    def __init__(self, root: Path, cap_bytes: int):
        self.root, self.cap_bytes = root, cap_bytes

    def local_path(self, protocol: str, remote: str) -> Path:
        """Where the copy of `remote` lives: its key under the protocol, made safe."""
        parts = [p for p in remote.split("/") if p not in ("", ".", "..")]
        return self.root / protocol / Path(*parts)

    def _copies(self) -> list[Path]:
        return (
            [
                p
                for p in self.root.rglob("*")
                if p.is_file()
                and not p.name.endswith(_SIDE)
                and ".part-" not in p.name
                and p.parent != self.root
            ]
            if self.root.exists()
            else []
        )

    def make_room(self, keep: set[Path], needed: int) -> None:
        """Evict copies not in `keep`, least recently used first, until `needed` more fit."""
        copies = self._copies()
        used = sum(p.stat().st_size for p in copies)
        for old in sorted((p for p in copies if p not in keep), key=lambda p: p.stat().st_mtime):
            if used + needed <= self.cap_bytes:
                break
            used -= old.stat().st_size
            old.unlink(missing_ok=True)
            Path(str(old) + _SIDE).unlink(missing_ok=True)
            log.info("Evicted %s from the remote cache (least recently used)", old)

    def fresh(self, local: Path, size: int, version: str) -> bool:
        """Whether `local` is a complete copy of this version of the remote object."""
        side = Path(str(local) + _SIDE)
        if not (local.is_file() and side.is_file()) or local.stat().st_size != size:
            return False
        try:
            return json.loads(side.read_text()) == {"size": size, "version": version}
        except (OSError, ValueError):
            return False

    def download(self, fs, remote: str, local: Path, size: int, version: str) -> None:
        """Copy `remote` to `local` through a temporary name, so that ranks copying the same
        shard at once, or a copy cut short, never leave a partial file under the final name."""
        local.parent.mkdir(parents=True, exist_ok=True)
        part = local.with_name(f"{local.name}.part-{os.getpid()}")
        fs.get_file(remote, str(part))
        os.replace(part, local)
        Path(str(local) + _SIDE).write_text(json.dumps({"size": size, "version": version}))


def fetch_remote_sources(
    requests: list[dict[str, Any]], *, cache_root: Path, cap_bytes: int
) -> list[list[str]]:
    """For each request (`paths`, `format`, `storage_options`, `where`: one source), the local
    paths it reads in place of its URLs (local entries are kept): the files copied into the
    cache, or for `hf_disk` the copied folders and for `megatron` the copied prefixes.

    All sources are planned first, so that the cap counts them together and no source's copies
    are evicted for another's; the copying holds a lock on the cache, so the ranks of a node
    copy each shard once (the first copies, the others find it fresh). ValueError, one line,
    for an unknown protocol, missing credentials, a URL that matches nothing, or shards above
    `cap_bytes`."""
    import fcntl

    cache = RemoteCache(cache_root, cap_bytes)
    plan: list[tuple[Any, str, Path, int, str, str]] = []
    out: list[list[str]] = []
    for request in requests:
        fmt, where = request["format"], request["where"]
        local_entries: list[str] = []
        for entry in request["paths"]:
            if not is_url(entry):
                local_entries.append(entry)
                continue
            protocol = entry.split("://", 1)[0]
            fs, path = _filesystem(entry, request.get("storage_options") or {}, where)
            found = _listing(fs, path, entry, fmt, where)
            for remote, details in sorted(found.items()):
                local = cache.local_path(protocol, remote)
                size = int(details.get("size") or 0)
                plan.append((fs, remote, local, size, _version(details), where))
            copies = {r: str(cache.local_path(protocol, r)) for r in sorted(found)}
            if fmt == "hf_disk":  # folders: the copy of each folder that holds a state.json
                local_entries += sorted(
                    {str(Path(c).parent) for r, c in copies.items() if r.endswith("/state.json")}
                )
            elif fmt == "megatron":
                local_entries += sorted({c[:-4] for c in copies.values() if c.endswith(".idx")})
            else:
                local_entries += list(copies.values())
        out.append(local_entries)
    if not plan:
        return out
    _check_cap(plan, cap_bytes)
    cache_root.mkdir(parents=True, exist_ok=True)
    with open(cache_root / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        missing = [item for item in plan if not cache.fresh(*item[2:5])]
        cache.make_room({item[2] for item in plan}, sum(item[3] for item in missing))
        start = time.perf_counter()
        for fs, remote, local, size, version, _ in missing:
            cache.download(fs, remote, local, size, version)
        now = time.time()
        for item in plan:  # this run used them: the last to be evicted
            os.utime(item[2], (now, now))
    log.info(
        "%d remote files, %d bytes: %d copied into %s in %.1f s, %d found in the cache",
        len(plan),
        sum(i[3] for i in plan),
        len(missing),
        cache_root,
        time.perf_counter() - start,
        len(plan) - len(missing),
    )
    return out


def _check_cap(plan: list, cap_bytes: int) -> None:
    cap_gib = cap_bytes / 2**30
    for _, remote, _, size, _, where in plan:
        if size > cap_bytes:
            raise ValueError(
                f"{where}: the remote file {redact_text(remote)} has {size} bytes, above "
                f"data.remote_cache_gib={cap_gib:g} ({cap_bytes} bytes); raise "
                "data.remote_cache_gib, or cut the file into smaller shards"
            )
    total = sum(item[3] for item in plan)
    if total > cap_bytes:
        raise ValueError(
            f"data.sources: the run's {len(plan)} remote files hold {total} bytes, above "
            f"data.remote_cache_gib={cap_gib:g} ({cap_bytes} bytes); raise data.remote_cache_gib "
            "(every shard of a run is kept while it trains)"
        )


def cache_folder(cache_dir: str | Path) -> Path:
    """The remote cache's folder: `remote/` in the token cache's folder `cache_dir` (the caller
    resolves the default, `lm.token_cache.default_cache_dir`: data/ does not import lm/)."""
    return Path(cache_dir).expanduser() / "remote"
