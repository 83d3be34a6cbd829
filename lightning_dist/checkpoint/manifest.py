"""`manifest.json`: what a checkpoint folder holds, written last, checked first.

The manifest names the format and its version, the step, the model's arguments, the layout and
strategy that wrote it, the data position, the precision, the library versions, and a SHA-256 of
every other file in the folder. Loading reads it before anything else: a missing or unreadable
manifest, a future version, or a file whose bytes differ from its hash stops the load with one
line, before any file is deserialised. Plain JSON; nothing here imports Lightning.
`CheckpointError` is checkpoint/safe.py's, one class for every refusal.

The writer hashes each file once (`write_manifest`). A reader hashes once per node: the outcome
is recorded in a private folder under the system's temporary directory, and the node's other
processes trust it while every file keeps the size and times it had then (`verify_files`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # not POSIX: no node record, every process hashes
    fcntl = None

from lightning_dist.checkpoint.safe import CheckpointError
from lightning_dist.runtime.hashing import file_sha256

__all__ = [
    "FORMAT",
    "MANIFEST",
    "VERSION",
    "CheckpointError",
    "open_manifest",
    "verify_files",
    "write_manifest",
]

FORMAT = "lightning_dist.checkpoint"
VERSION = 1
MANIFEST = "manifest.json"


def file_hashes(folder: Path) -> dict[str, str]:
    """{relative name: sha256} of every file in `folder` except the manifest."""
    return {
        str(p.relative_to(folder)): file_sha256(p)
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


PERMISSION_FIX = "fix the permissions, or run as the user who wrote it"


def cannot_read(folder: Path, error: PermissionError) -> CheckpointError:
    """The one line for a checkpoint file this user may not read."""
    return CheckpointError(
        f"checkpoint {folder} cannot be read ({error.strerror}: {error.filename}); {PERMISSION_FIX}"
    )


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
    except PermissionError as e:
        raise cannot_read(folder, e) from None
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


def verify_files(folder: Path, manifest: dict[str, Any]) -> bool:
    """Every file the manifest names is there with its recorded hash, and nothing else is;
    CheckpointError naming the first file that is missing, extra or changed.

    The listing is checked on every call; the hashes once per node. The first process on this
    node to verify `folder` with this manifest holds the node's lock for it while it hashes and
    records the outcome, a pass or the first file that failed (`_NodeRecord`); the others wait
    on the lock, then compare each file's size, modification and change times with the record
    instead of reading the bytes again, and pass or raise the same error as it did. True when
    this call hashed the files, False when this process or another on this node had hashed them
    as they are now."""
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
    resolved, digest = folder.resolve(), _manifest_digest(manifest)
    if _verified.get((resolved, digest)) == _file_stamps(folder, recorded):
        return False  # verified by this process already (train.py's check, then the load)
    with _node_record(resolved, digest) as record:
        stamps = _file_stamps(folder, recorded)  # before the bytes are read: a later change shows
        outcome = record.outcome(stamps) if record is not None else None
        hashed = outcome is None
        if hashed:
            outcome = _first_mismatch(folder, recorded) or ""
            if record is not None:
                record.write(stamps, outcome)
    if outcome:
        raise CheckpointError(
            f"checkpoint {folder}: {outcome} does not match its hash in {MANIFEST} "
            "(truncated or modified); resume from another checkpoint"
        )
    _verified[resolved, digest] = stamps
    return hashed


_verified: dict[tuple[Path, str], tuple] = {}
"""(folder, manifest digest) this process has verified, with each file's size and times then:
the check before launch and the load in the same process look at the node's record once, not
twice, and a rewritten manifest is checked again."""


def _first_mismatch(folder: Path, recorded: dict[str, str]) -> str | None:
    for name, expected in sorted(recorded.items()):
        if file_sha256(folder / name) != expected:
            return name
    return None


def _file_stamps(folder: Path, names) -> tuple:
    """(name, size, st_mtime_ns, st_ctime_ns, st_ino, st_dev) of each file. On a local
    filesystem the change time moves on every write, rename or `touch` and no call sets it back,
    so a file rewritten with its old size and modification time (`cp -p`, `touch -r`) differs
    here too, as does a file replaced by another (inode). A network or FUSE filesystem may report
    cached or synthetic times: there the record is only as good as the times it serves."""
    stamps = []
    for name in sorted(names):
        st = (folder / name).stat()
        stamps.append((name, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev))
    return tuple(stamps)


def _manifest_digest(manifest: dict[str, Any]) -> str:
    """SHA-256 of the manifest as verified (canonical JSON of the dict passed in, not the file
    read again, which a rewrite could have changed in between)."""
    text = json.dumps(manifest, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


LOCK_WAIT_S = 1800.0
"""How long a process waits for the node's verification lock before it hashes by itself: far
longer than hashing a large checkpoint takes, far shorter than forever."""


def _record_folder() -> Path:
    """This user's folder of verification records on this node,
    `<tempdir>/lightning_dist-<uid>/verified`, made with mode 0700; OSError if it (or its
    parent) is not a real folder owned by this user that only this user can write, since a
    record there lets a load skip the hashes."""
    uid = os.getuid()
    base = Path(tempfile.gettempdir()) / f"lightning_dist-{uid}"
    for folder in (base, base / "verified"):
        with contextlib.suppress(FileExistsError):
            folder.mkdir(mode=0o700)
        st = os.lstat(folder)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid or st.st_mode & 0o022:
            raise PermissionError(f"{folder} is not a folder only uid {uid} can write")
    return base / "verified"


class _NodeRecord:
    """This node's record of verifying one folder against one manifest, and the exclusive
    `flock` that makes the processes of the node verify it one at a time. The lock belongs to
    the open file, so the kernel releases it when the holder exits, however it exits."""

    def __init__(self, folder: Path, manifest_digest: str) -> None:
        if fcntl is None:
            raise OSError("no fcntl.flock on this platform")
        self.folder, self.manifest = str(folder), manifest_digest
        key = hashlib.sha256(f"{_RECORD_VERSION}\0{folder}\0{manifest_digest}".encode())
        records = _record_folder()
        self.path = records / f"{key.hexdigest()}.json"
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        self._lock = os.open(records / f"{key.hexdigest()}.lock", flags, 0o600)
        try:
            self._wait_for_lock()  # while another process of this node hashes
        except BaseException:
            os.close(self._lock)
            raise

    def _wait_for_lock(self) -> None:
        """Take the lock within `LOCK_WAIT_S` (a holder that is stopped or stuck on a hung
        filesystem must not stop this process too); OSError past it, so this process hashes."""
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    print(
                        f"warning: checkpoint {self.folder}: another process of this node has "
                        f"held its verification lock for {LOCK_WAIT_S:.0f} s; hashing here "
                        "instead",
                        file=sys.stderr,
                        flush=True,
                    )
                    raise OSError("verification lock not taken") from None
                time.sleep(0.05)

    def close(self) -> None:
        os.close(self._lock)

    def outcome(self, stamps: tuple) -> str | None:
        """What the record says of the files as they are now: "" verified, a file's name if it
        did not match its hash, None if there is no record of these exact sizes and times."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            with os.fdopen(fd, encoding="utf-8") as f:
                record = json.load(f)
        except (OSError, ValueError):
            return None
        if not isinstance(record, dict) or [
            record.get(k) for k in ("record", "folder", "manifest", "files")
        ] != [_RECORD_VERSION, self.folder, self.manifest, [list(s) for s in stamps]]:
            return None
        mismatch = record.get("mismatch")
        if isinstance(mismatch, str) and (mismatch == "" or mismatch in {s[0] for s in stamps}):
            return mismatch
        return None

    def write(self, stamps: tuple, mismatch: str) -> None:
        """Record the outcome (under a temporary name, then renamed); a record that cannot be
        written is skipped: the next process hashes again."""
        record = {
            "record": _RECORD_VERSION,
            "folder": self.folder,
            "manifest": self.manifest,
            "files": stamps,
            "mismatch": mismatch,
        }
        temporary = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            with os.fdopen(os.open(temporary, flags, 0o600), "w", encoding="utf-8") as f:
                json.dump(record, f)
            os.replace(temporary, self.path)
        except OSError:
            with contextlib.suppress(OSError):
                temporary.unlink()


_RECORD_VERSION = 2


@contextlib.contextmanager
def _node_record(folder: Path, manifest_digest: str) -> Iterator[_NodeRecord | None]:
    """The node's record of `folder`, locked; None where there is no private temporary folder
    or no lock to take (then this process hashes, as if it were alone)."""
    try:
        record = _NodeRecord(folder, manifest_digest)
    except OSError:
        record = None
    try:
        yield record
    finally:
        if record is not None:
            record.close()


def open_manifest(folder: Path) -> dict[str, Any]:
    """`read_manifest` then `verify_files`: the manifest of a checkpoint safe to deserialise."""
    manifest = read_manifest(folder)
    verify_files(folder, manifest)
    return manifest
