"""Every private torch, Lightning and transformers API the project uses, in one place.

Each entry says the version it was checked on, why no public API serves, and what breaks if it
moves. `tests/test_compat.py` touches each one, so an upgrade that moves one fails there with its
name, not deep inside a training run. Nothing here is imported eagerly: the planner reads the
package on machines without Lightning.

Checked on torch 2.13.0, lightning 2.6.6, transformers 5.24.0.
"""

from __future__ import annotations

from typing import Any

LIGHTNING_CHECKPOINT_METADATA = "meta.pt"
"""Lightning's `lightning.fabric.utilities.load._METADATA_FILENAME`: the file beside the DCP shards
of a sharded checkpoint that holds loops, schedulers and callback states. Lightning writes it
and has no public constant; `tests/test_compat.py` checks the two agree."""

HF_INITIALIZED_FLAG = "_is_hf_initialized"
"""transformers marks modules and tensors it has initialised with this attribute and then skips
them in `init_weights`. After a meta-device build and `to_empty` the mark is stale, so the
adapter (models/hf.py) deletes it to have every weight drawn. No public switch exists."""


def checkpoint_wrapper_api() -> tuple[Any, Any]:
    """`(apply_activation_checkpointing, checkpoint_wrapper)` from
    `torch.distributed.algorithms._checkpoint.checkpoint_wrapper`.

    Why private: torch's only way to checkpoint existing submodules without editing the model's
    forward (models stay single-device code). FSDP's own documentation and torchtitan use it.
    """
    from torch.distributed.algorithms._checkpoint import checkpoint_wrapper as module

    return module.apply_activation_checkpointing, module.checkpoint_wrapper


def mem_tracker_class() -> type:
    """`torch.distributed._tools.mem_tracker.MemTracker`, the only tracker that splits memory
    into parameters, gradients, optimizer state and activations on any device (CPU included).

    parallel/memory.py subclasses it and overrides `_register_global_optimizer_hook`,
    `_update_peak_stats` and `_track_module_params_and_buffers`, sets `_mod_tracker` and
    `_in_opt`: the closure-style optimizer step of Lightning and the pipeline's repeated module
    calls need them (see MEM_TRACKER_INTERNALS).
    """
    from torch.distributed._tools.mem_tracker import MemTracker

    return MemTracker


def schedule_ops_api():
    """`torch.distributed.pipelining._schedule_visualizer.get_schedule_ops`: the action table
    (F, B, I, W per rank and time slot) of a pipeline schedule, built without processes.

    Why private: torch's only way to read a schedule's order without a process group;
    bench/schedules.py simulates each schedule's bubble from it.
    """
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

    return get_schedule_ops


MEM_TRACKER_INTERNALS = (
    "_register_global_optimizer_hook",
    "_update_peak_stats",
    "_track_module_params_and_buffers",
)
"""MemTracker methods parallel/memory.py overrides (attributes `_mod_tracker`, `_in_opt` too)."""


def in_backward() -> bool:
    """Whether autograd is running a backward pass on this thread.

    `torch._C._current_graph_task_id()` is -1 outside backward; torch has no public query.
    Used by the memory meter to call a tensor created in backward a temporary.
    """
    import torch

    return torch._C._current_graph_task_id() != -1


def saved_tensors_hooks_active() -> bool:
    """Whether saved-tensor hooks (activation checkpointing's, CPU offload's) are in force.

    `torch._C._autograd._top_saved_tensors_default_hooks` returns the innermost pair or None;
    torch has no public query. Sequence parallelism's shard saving installs hooks of its own
    only outside others, which would otherwise stop seeing the tensors saved inside.
    """
    import torch

    return torch._C._autograd._top_saved_tensors_default_hooks(False) is not None


def pipeline_action_types() -> Any:
    """`torch.distributed.pipelining.schedules._ComputationType`, the kinds of actions in a
    multi-stage schedule's `pipeline_order_with_comms`.

    Why: evaluating a ZBVZeroBubble schedule runs its backward actions too and asserts; keeping
    only the forward actions (parallel/pipeline.py) needs the action kinds. No public enum.
    """
    from torch.distributed.pipelining.schedules import _ComputationType

    return _ComputationType


def replace_hydra_child_command(child_command: Any) -> None:
    """Replace Lightning's `_hydra_subprocess_cmd` in both launcher modules.

    Lightning's own command for the ranks it starts under Hydra repeats `sys.argv`, which under
    a multirun starts the whole sweep in every child; it has no hook to change it.
    """
    from lightning.fabric.strategies.launchers import subprocess_script as fabric_launcher
    from lightning.pytorch.strategies.launchers import subprocess_script as trainer_launcher

    # The Trainer's launcher imports the function by name, so both modules need the fix.
    fabric_launcher._hydra_subprocess_cmd = child_command
    trainer_launcher._hydra_subprocess_cmd = child_command


def set_module_device_mesh(module: Any, mesh: Any) -> None:
    """Give a LightningModule its `device_mesh` property's value.

    Lightning's ModelParallelStrategy does exactly this (`lightning_module._device_mesh = ...`)
    in its `setup_environment`, which ours replace; the property has no public setter.
    """
    module._device_mesh = mesh


def drop_wandb_anonymous(logger: Any) -> None:
    """Leave `anonymous` out of the arguments a WandbLogger passes to `wandb.init`.

    Lightning always passes `anonymous=None`, and wandb (0.31) prints "The anonymous setting has
    no effect" for any value but its own unset marker. The arguments live in
    `WandbLogger._wandb_init`; the constructor has no way to leave one out.
    """
    logger._wandb_init.pop("anonymous", None)


def wrap_hydra_errors(handler: Any) -> None:
    """Send Hydra's own configuration errors (an unknown key or config name, a bad override) to
    `handler(exception)` instead of Hydra's several lines and exit status 1.

    Hydra prints them in `hydra._internal.utils.run_and_report`, which `_run_hydra` looks up in
    its module on each call; Hydra has no hook for it. Errors of other kinds, and every error
    under `HYDRA_FULL_ERROR=1`, keep Hydra's report. Idempotent.
    """
    import os

    from hydra._internal import utils
    from hydra.errors import CompactHydraException

    original = utils.run_and_report
    if getattr(original, "_wraps_hydra_errors", False):
        return

    def run_and_report(func: Any) -> Any:
        def guarded() -> Any:
            try:
                return func()
            except CompactHydraException as e:
                if os.environ.get("HYDRA_FULL_ERROR") == "1":
                    raise
                handler(e)
                raise

        return original(guarded)

    run_and_report._wraps_hydra_errors = True  # type: ignore[attr-defined]
    utils.run_and_report = run_and_report


def process_group_settings(strategy: Any) -> tuple[str, Any]:
    """`(backend, timeout)` a Lightning parallel strategy will initialise its process group with.

    Lightning keeps them in `_process_group_backend` (None: the device's default) and `_timeout`,
    with no public accessor; strategies/base.py joins the group itself under torchrun restarts
    (see parallel/elastic.py) and must use the same settings.
    """
    from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout

    backend = getattr(strategy, "_process_group_backend", None)
    if backend is None:
        backend = "nccl" if strategy.root_device.type == "cuda" else "gloo"
    return backend, getattr(strategy, "_timeout", None) or default_pg_timeout


def wandb_run_started(logger: Any) -> bool:
    """Whether a WandbLogger has created its run; reading `logger.experiment` would create one.

    Lightning keeps the run in `WandbLogger._experiment` and offers no public query.
    """
    return getattr(logger, "_experiment", None) is not None


DCP_METADATA_RECORDS = {
    "torch.distributed.checkpoint.metadata": (
        "Metadata",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "TensorProperties",
        "StorageMeta",
        "MetadataIndex",
        "_MEM_FORMAT_ENCODING",
    ),
    "torch.distributed.checkpoint.filesystem": ("_StorageInfo",),
    "torch.serialization": ("_get_layout",),
    "torch": ("Size",),
    "pathlib": ("Path", "PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"),
    "collections": ("OrderedDict",),
}
"""The classes and functions a DCP `.metadata` pickle names (found by reading the pickles torch
2.13 writes for model, DTensor and flattened optimizer states). checkpoint/safe.py builds only
these (plus torch dtypes, layouts and memory formats); `_StorageInfo`, `_MEM_FORMAT_ENCODING`
and `_get_layout` are private, so if torch renames one, loading refuses every checkpoint with
that name in its message, and tests/test_compat.py fails first."""


def dcp_metadata_path(reader: Any, rank: Any) -> Any:
    """`FileSystemReader._get_metadata_path(rank)`: the `.metadata` file a reader would open
    (`__<rank>.metadata` for per-rank metadata). Private; no public accessor exists."""
    return reader._get_metadata_path(rank)


def dcp_set_element() -> Any:
    """`torch.distributed.checkpoint._traverse.set_element`: puts a value at a flattened key's
    path in a nested state dict, as DCP's default load planner does for non-tensor values.
    checkpoint/safe.py replaces that planner's `load_bytes` (which unpickles with
    `weights_only=False`) and needs the same placement."""
    from torch.distributed.checkpoint._traverse import set_element

    return set_element
