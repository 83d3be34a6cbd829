"""Which process a pid names: this machine's boot, its pid namespace and the process's start
time tell a process from a later one with its number (or one in another container). The hang
watchdog (callbacks/watchdog.py) uses them to know a peer rank's process has ended, and to kill
a stopped rank only when it is that rank."""

from __future__ import annotations

import os
from pathlib import Path


def stat_fields(pid: int) -> list[str]:
    """The fields of /proc/<pid>/stat after the command name (state first), or [] when there
    is no such process (or no /proc)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return []


def start_time(pid: int) -> str | None:
    """When process `pid` started (clock ticks since boot, field 22), or None."""
    fields = stat_fields(pid)
    return fields[19] if fields else None


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def _namespace() -> str:
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return ""


PROCESS_ID = {
    "boot": _read("/proc/sys/kernel/random/boot_id"),
    "pid_namespace": _namespace(),
    "start": start_time(os.getpid()),
}
"""What tells this process from another with its pid: the machine's boot, its pid namespace
(containers with the host's network share its hostname, not its pids) and its start time."""


def same_host(beat: dict) -> bool:
    """Whether the rank of this heartbeat runs where this process can see its pid: the same
    boot and pid namespace (known only where /proc tells)."""
    theirs, ours = beat.get("process") or {}, PROCESS_ID
    known = ours["boot"] and ours["pid_namespace"] and ours["start"]
    return bool(known) and all(theirs.get(k) == ours[k] for k in ("boot", "pid_namespace"))


def process_ended(beat: dict) -> bool:
    """Whether the rank of this heartbeat ran where this process sees its pid, and that process
    is gone (no such pid, another process with it, or a zombie: killed, its parent not yet
    told)."""
    if not same_host(beat) or beat["pid"] == os.getpid():
        return False
    fields = stat_fields(beat["pid"])
    return not fields or fields[19] != beat["process"]["start"] or fields[0] in ("Z", "X")
