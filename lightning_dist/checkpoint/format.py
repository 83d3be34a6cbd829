"""Save and load the one checkpoint format of every strategy (docs/CHECKPOINTS.md, "Format").

A checkpoint is a folder `step<N>.ckpt/` holding:

- DCP files (`.metadata`, `*.distcp`): `state_dict.<name>` for each parameter and persistent
  buffer, and `optimizer_<i>.state.<name>.<key>` / `optimizer_<i>.param_groups.<name>.<key>`,
  where <name> is the name in the single-process LightningModule (no FSDP, checkpoint-wrapper,
  compile or pipeline-stage segments): the model's weights are `state_dict.model.<name>`
  (`WEIGHTS`), <name> being the single-device Transformer's parameter name. Tensors are stored by global shape and offset, so any
  layout reads the pieces it holds;
- `meta.pt`: Lightning's loops, callbacks, schedulers and datamodule state (read with
  `torch.load(weights_only=True)` only);
- `manifest.json`, written last (see `manifest.py`).
"""

from __future__ import annotations

import contextlib
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lightning_dist._compat import LIGHTNING_CHECKPOINT_METADATA, plain_optimizer
from lightning_dist.checkpoint.canonical import fused_tensors, single_device_state
from lightning_dist.checkpoint.manifest import (
    MANIFEST,
    CheckpointError,
    open_manifest,
    write_manifest,
)

MODEL_KEY = "state_dict"
WEIGHTS = MODEL_KEY + ".model."
"""The prefix of the model's weights in the files: the LightningModule holds it as `model`."""


@contextlib.contextmanager
def one_process_io():
    """Silence DCP's note that it reads or writes in one process: that is the point here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*assuming the intent is to (load|save)")
        yield


def storage_reader(path: Path):
    """The DCP reader of a checkpoint folder, its `.metadata` read by a restricted unpickler."""
    from lightning_dist.checkpoint.safe import SafeFileSystemReader

    return SafeFileSystemReader(str(path))


def _options(full: bool = False):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # Flattened optimizer state: one key per parameter and setting, so pipeline ranks (which
    # hold different parameters) each get their own param_groups entries.
    # A full state dict stays on every rank (cpu_offload would keep it on rank 0 only).
    return StateDictOptions(
        full_state_dict=full, cpu_offload=not full, flatten_optimizer_state_dict=True
    )


def _plain(optimizer):
    return plain_optimizer(optimizer)  # a LightningOptimizer's torch optimizer


def gather_state(module: nn.Module, optimizers: list, *, full: bool = False) -> dict[str, Any]:
    """{"state_dict": model state, "optimizer_<i>": flat optimizer state} of this rank, in the
    files' shapes (a fused projection held by parts as its single-device view, same memory)."""
    return single_device_state(_module_state(module, optimizers, full), fused_tensors(module))


def _module_state(module: nn.Module, optimizers: list, full: bool = False) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    state: dict[str, Any] = {MODEL_KEY: get_model_state_dict(module, options=_options(full))}
    for i, optimizer in enumerate(optimizers):
        state[f"optimizer_{i}"] = get_optimizer_state_dict(
            module, _plain(optimizer), options=_options(full)
        )
    return state


def prepare_folder(path: Path, *, rank0: bool, barrier=None) -> None:
    """An empty folder at `path`: an older checkpoint of the same name (a rewritten last.ckpt, a
    file of the old format) is removed first, so no stale shard survives beside the new ones.
    Rank 0 makes it; the others wait at `barrier` (None: the caller's `write_on_every_rank`
    is the meeting point)."""
    if rank0:
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
        path.mkdir(parents=True)
    if barrier is not None:
        barrier()


class CheckpointWriteError(Exception):
    """A checkpoint that could not be written (the folder became unwritable, the disk filled,
    the mount was lost): the same one-line message on every rank, which stops the run."""

    status = "checkpoint_failed"
    """summary.json's status of a run that stops on it (`train.py`)."""


def _os_error_text(error: BaseException) -> str | None:
    """`[Errno 28] No space left on device: 'path'` of an OSError, or of the first OSError a
    DCP `CheckpointException` carries for one of its ranks; None for anything else."""
    from torch.distributed.checkpoint import CheckpointException

    if isinstance(error, CheckpointException):
        for rank, (failure, _) in sorted(error.failures.items()):
            text = _os_error_text(failure)
            if text:
                return f"{text} (rank {rank})"
        return None
    if isinstance(error, OSError):
        return str(error)
    return None


def write_on_every_rank(write, *, group=None) -> None:
    """Run `write` (this rank's part of a save, collective or not) and meet the other ranks:
    if it failed with an OSError on any rank, every rank raises `CheckpointWriteError` with the
    first rank's error. Every rank reaches the one meeting collective (an all-gather) whether
    its part failed or not, so none waits in a collective for a rank that gave up."""
    import torch.distributed as dist
    from torch.distributed.checkpoint import CheckpointException

    error = None
    try:
        write()
    except (OSError, CheckpointException) as e:
        error = _os_error_text(e)
        if error is None:
            raise
    if dist.is_available() and dist.is_initialized():
        errors: list[str | None] = [None] * dist.get_world_size(group)
        dist.all_gather_object(errors, error, group=group)
        error = next((e for e in errors if e), None)
    if error:
        raise CheckpointWriteError(error)


def finish_folder(path: Path, meta: dict[str, Any], manifest_fields: dict[str, Any]) -> None:
    """Rank 0, once every rank's shards are written: Lightning's metadata, then the manifest."""
    torch.save(meta, path / LIGHTNING_CHECKPOINT_METADATA)
    write_manifest(path, manifest_fields)


def write_folder(
    state: dict[str, Any], path: Path, meta: dict[str, Any], fields: dict[str, Any], *, rank0: bool
) -> None:
    """One synchronous save of `state` (from `gather_state`) into `path` on every rank: the
    folder, the shards, then on rank 0 `meta` and the manifest with `fields`;
    `CheckpointWriteError` on every rank when a rank's part of it failed with an OSError."""
    write_on_every_rank(lambda: prepare_folder(path, rank0=rank0))
    write_on_every_rank(lambda: save_state(state, path))

    def finish() -> None:
        if rank0:
            finish_folder(path, meta, fields)

    write_on_every_rank(finish)


def save_state(state: dict[str, Any], path: Path, process_group=None) -> None:
    """Write `state` (from `gather_state`) as DCP files into `path` (collective)."""
    from torch.distributed.checkpoint import save

    from lightning_dist.checkpoint.pieces import PiecewiseSavePlanner

    save(
        flatten(state),
        checkpoint_id=str(path),
        process_group=process_group,
        planner=PiecewiseSavePlanner(),
    )


def flatten(state: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """{"state_dict": {name: t}} -> {"state_dict.<name>": t}: the keys the files hold."""
    return {f"{top}.{key}": value for top, inner in state.items() for key, value in inner.items()}


def unflatten(flat: dict[str, Any], tops: list[str]) -> dict[str, dict[str, Any]]:
    state: dict[str, dict[str, Any]] = {top: {} for top in tops}
    for key, value in flat.items():
        top, inner = key.split(".", 1)
        state[top][inner] = value
    return state


def read_into(state: dict[str, dict[str, Any]], path: Path, process_group=None) -> None:
    """Fill `state` (from `gather_state`) from the checkpoint at `path` (collective): tensors
    in place, settings replaced."""
    from lightning_dist.checkpoint.safe import load

    flat = flatten(state)
    load(flat, path, process_group=process_group)  # settings with weights_only=True
    state.update(unflatten(flat, list(state)))


def tensor_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """{DCP key: global shape} of every tensor in the checkpoint."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = storage_reader(path).read_metadata()
    return {
        key: tuple(item.size)
        for key, item in metadata.state_dict_metadata.items()
        if isinstance(item, TensorStorageMetadata)
    }


def global_shape(tensor: Any) -> tuple[int, ...]:
    """The whole tensor's shape of a plain tensor, a DTensor or a ShardedTensor."""
    return tuple(tensor.size())


def check_model_shapes(
    path: Path, model_shapes: dict[str, tuple[int, ...]], *, whole_model: bool = True, saved=None
) -> None:
    """CheckpointError naming the first parameter whose shape differs, or that the checkpoint
    lacks; with `whole_model` (not a pipeline rank's stages) also one that the model lacks."""
    saved = tensor_shapes(path) if saved is None else saved
    prefix = MODEL_KEY + "."
    in_checkpoint = {k[len(prefix) :]: v for k, v in saved.items() if k.startswith(prefix)}
    for name, shape in model_shapes.items():
        if name not in in_checkpoint:
            raise CheckpointError(
                f"checkpoint {path} has no parameter {name} of this model (shape {list(shape)}); "
                "it was saved from another model: resume with the checkpoint's model config"
            )
        if tuple(in_checkpoint[name]) != tuple(shape):
            raise CheckpointError(
                f"checkpoint {path}: parameter {name} has shape {list(in_checkpoint[name])} in "
                f"the checkpoint but {list(shape)} in this model; resume with the checkpoint's "
                "model config (see its manifest.json 'model')"
            )
    extra = sorted(set(in_checkpoint) - set(model_shapes))
    if whole_model and extra:
        raise CheckpointError(
            f"checkpoint {path} holds parameter {extra[0]}, which this model lacks; resume with "
            "the checkpoint's model config (see its manifest.json 'model')"
        )


def load_state(
    module: nn.Module, optimizers: list, path: Path, *, whole_model: bool = True, process_group=None
) -> dict[str, Any]:
    """Check the manifest and hashes, then load model and optimizer state into this rank's
    shards from any layout's checkpoint; return Lightning's metadata (loops, schedulers...)."""
    from torch.distributed.checkpoint.state_dict import (
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    open_manifest(path)
    require_resumable(path)
    state = _module_state(module, optimizers)
    files = single_device_state(state, fused_tensors(module))
    shapes = {k: global_shape(v) for k, v in files[MODEL_KEY].items()}
    check_model_shapes(path, shapes, whole_model=whole_model)
    read_into(files, path, process_group=process_group)
    for top, values in files.items():  # tensors were filled in place, settings replaced
        state[top].update({k: v for k, v in values.items() if not isinstance(v, torch.Tensor)})
    set_model_state_dict(module, state[MODEL_KEY], options=_options())
    for i, optimizer in enumerate(optimizers):
        set_optimizer_state_dict(
            module, _plain(optimizer), state[f"optimizer_{i}"], options=_options()
        )
    return read_meta(path)


def read_meta(path: Path) -> dict[str, Any]:
    """Lightning's metadata file, never with plain pickle."""
    return torch.load(Path(path) / LIGHTNING_CHECKPOINT_METADATA, weights_only=True)


def read_full_state(path: Path, prefix: str = "") -> dict[str, Any]:
    """Every value whose DCP key starts with `prefix` (tensors whole, settings as saved), read in
    one process with no process group: for tests and tools. Verifies the manifest first."""
    open_manifest(path)
    return read_values(path, prefix)


def read_values(path: Path, prefix: str = "") -> dict[str, Any]:
    """`read_full_state` without the manifest check, for a caller that has made it (or reads a
    folder that has no manifest)."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from lightning_dist.checkpoint.safe import load

    metadata = storage_reader(path).read_metadata()
    state: dict[str, Any] = {}
    for key, item in metadata.state_dict_metadata.items():
        if key.startswith(prefix):
            tensor = isinstance(item, TensorStorageMetadata)
            state[key] = torch.empty(item.size, dtype=item.properties.dtype) if tensor else ""
    with one_process_io():
        load(state, path, no_dist=True)
    return state


def is_weights_only(path: Path) -> bool:
    """A folder with a manifest but no Lightning `meta.pt`: weights written by `import` (or
    another weights-only writer), a start for `trainer.init_from`, not a run to resume."""
    path = Path(path)
    return (
        path.is_dir()
        and (path / MANIFEST).is_file()
        and not (path / LIGHTNING_CHECKPOINT_METADATA).is_file()
    )


LIGHTNING_VERSION_KEY = "pytorch-lightning_version"
"""A key Lightning writes into every checkpoint's metadata; a plain loop's folder has none."""


def require_lightning_state(path: Path) -> None:
    """CheckpointError (one line) when `path` was written by a plain PyTorch loop over the mesh
    runtime (lightning_dist/mesh/): its weights and optimizer state are in the format, but not
    the Trainer's loop state, so a Trainer starts from its weights instead of resuming it."""
    if LIGHTNING_VERSION_KEY not in read_meta(path):
        raise CheckpointError(
            f"checkpoint {path} was written by a plain PyTorch loop (lightning_dist.mesh), "
            f"without the Trainer's loop state; start from its weights with "
            f"trainer.init_from={path}"
        )


def require_resumable(path: Path) -> None:
    """CheckpointError (one line) when `path` holds weights only."""
    if is_weights_only(path):
        raise CheckpointError(
            f"checkpoint {path} holds weights only; start from it with trainer.init_from={path} "
            f"(it has no {LIGHTNING_CHECKPOINT_METADATA}: no step, optimizer or data position)"
        )
