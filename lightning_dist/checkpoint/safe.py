"""Reading torch.distributed.checkpoint (DCP) folders without running anything they contain.

DCP as shipped unpickles two things with plain pickle: the folder's `.metadata` file
(`FileSystemReader.read_metadata`) and every non-tensor value (`DefaultLoadPlanner.load_bytes`
calls `torch.load(weights_only=False)`). A crafted checkpoint folder can therefore run any
command on the machine that resumes from it. Here both go through restricted readers:

- `.metadata` is read by an unpickler that builds only DCP's own metadata records, `torch.Size`,
  dtypes, layouts, memory formats and paths; any other global is refused with `CheckpointError`
  before it is looked up, so nothing named by the file is imported or called.
- non-tensor values (optimizer hyper-parameters, counters) are read with
  `torch.load(weights_only=True)`, like tensors already are.

Every DCP load in lightning_dist goes through `load` (or `SafeFileSystemReader` and
`SafeLoadPlanner`).
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint import load as dcp_load

from lightning_dist._compat import DCP_METADATA_RECORDS, dcp_metadata_path, dcp_set_element
from lightning_dist.checkpoint.pieces import PiecewiseLoadPlanner


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded safely: incomplete, damaged, or asking to build an
    object that no checkpoint needs. The message is one line naming the file."""


def _torch_constant(name: str) -> Any:
    """A dtype, layout or memory format named `torch.<name>`; None for anything else."""
    value = getattr(torch, name, None)
    if isinstance(value, torch.dtype | torch.layout | torch.memory_format):
        return value
    return None


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, file, source: Path):
        super().__init__(file)
        self._source = source

    def find_class(self, module: str, name: str) -> Any:
        if name in DCP_METADATA_RECORDS.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and _torch_constant(name) is not None:
            return _torch_constant(name)
        raise CheckpointError(
            f"{self._source} asks to build {module}.{name}, which no checkpoint metadata needs; "
            "refusing to load it (the file was not written by torch.distributed.checkpoint, "
            "or was altered)"
        )


def read_metadata_file(path: Path):
    """The DCP `Metadata` of one `.metadata` file, unpickled with the restricted unpickler."""
    with open(path, "rb") as file:
        try:
            metadata = _MetadataUnpickler(file, path).load()
        except CheckpointError:
            raise
        except Exception as e:  # truncated or garbage: one clear error, no traceback chain
            raise CheckpointError(
                f"{path} is not a readable checkpoint metadata file ({type(e).__name__}); "
                "the save was interrupted or the file is damaged"
            ) from None
    from torch.distributed.checkpoint.metadata import Metadata

    if not isinstance(metadata, Metadata):
        raise CheckpointError(f"{path} holds a {type(metadata).__name__}, not DCP metadata")
    return metadata


class SafeFileSystemReader(FileSystemReader):
    """DCP's file reader, with `.metadata` read by the restricted unpickler."""

    def read_metadata(self, *args: Any, **kwargs: Any):
        from torch.distributed.checkpoint.metadata import StorageMeta

        metadata = read_metadata_file(Path(dcp_metadata_path(self, kwargs.get("rank"))))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(PiecewiseLoadPlanner):
    """DCP's default load planner, with non-tensor values read by `torch.load(weights_only=True)`
    (and a fused projection's blocks read one by one, `checkpoint/pieces.py`)."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        try:
            loaded = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as e:
            raise CheckpointError(
                f"checkpoint entry {read_item.dest_index.fqn!r} is not plain data; refusing to "
                f"load it ({str(e).splitlines()[0]})"
            ) from None
        if self.flatten_state_dict:
            dcp_set_element()(
                self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded
            )
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


def load(state_dict: dict[str, Any], path: str | Path, *, process_group=None, no_dist=False):
    """`torch.distributed.checkpoint.load` of `path` into `state_dict`, in place, safely.

    The metadata is checked here first: DCP itself would swallow a refusal, log its traceback
    and retry with per-rank metadata files."""

    metadata = Path(path) / ".metadata"
    if not metadata.is_file():
        raise CheckpointError(f"{path} has no .metadata file: it is not a complete checkpoint")
    read_metadata_file(metadata)

    dcp_load(
        state_dict,
        storage_reader=SafeFileSystemReader(path),
        planner=SafeLoadPlanner(),
        process_group=process_group,
        no_dist=no_dist,
    )
