"""Read the history of an offline W&B run from its transaction log (`run-*.wandb`), for tests.

The log is a 7-byte header (":W&B", a magic number, a version) followed by LevelDB-style
32 KiB blocks of chunks, each with a 7-byte header (CRC32, length, type: 1 whole, 2 first,
3 middle, 4 last); whole or reassembled chunks are `wandb_internal_pb2.Record` messages.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

BLOCK = 32 * 1024
HEADER = 7
FULL, LAST = 1, 4


def records(path: Path):
    """Every Record message in the log, in order."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    pos, pending = HEADER, b""
    while pos + HEADER <= len(data):
        if BLOCK - pos % BLOCK < HEADER:  # a block's tail too short for a header is padding
            pos += BLOCK - pos % BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        pos += HEADER
        if kind == 0:  # zero fill
            continue
        pending += data[pos : pos + length]
        pos += length
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def history(path: Path) -> list[dict]:
    """The logged rows: one dict per `wandb.log` call, keys as logged."""
    rows = []
    for record in records(path):
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in record.history.item
                }
            )
    return rows


def run_metadata(path: Path) -> dict:
    """What the run was started with: entity, project, group, job type, notes and tags."""
    for record in records(path):
        if record.WhichOneof("record_type") == "run":
            run = record.run
            return {
                "entity": run.entity,
                "project": run.project,
                "group": run.run_group,
                "job_type": run.job_type,
                "notes": run.notes,
                "tags": list(run.tags),
            }
    raise AssertionError(f"{path} holds no run record")
