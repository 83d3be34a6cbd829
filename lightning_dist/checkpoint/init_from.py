"""`trainer.init_from=<checkpoint>`: start training from a checkpoint's weights, under any layout.

Only the weights are read: the optimizer, the step counter, the data position and the schedule
start fresh (use `trainer.ckpt_path` or `trainer.resume=auto` to continue a run). Every rank
reads the parts of the weights it holds, whatever layout wrote them: DCP reshards on load.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback

from lightning_dist.checkpoint.canonical import (
    WRAPPER_SEGMENTS,
    fused_tensors,
    single_device_state,
)
from lightning_dist.checkpoint.manifest import cannot_read
from lightning_dist.checkpoint.safe import load
from lightning_dist.checkpoint.weights import (
    WEIGHTS,
    CheckpointError,
    CheckpointInfo,
    architecture_difference,
    model_overrides,
    one_process_io,
    open_checkpoint,
)


def check_init_from(path: str, spec: Any) -> CheckpointInfo:
    """Before launch: the checkpoint exists and holds every weight of the configured model with
    the same shape; ValueError (one line, naming the model overrides to use) otherwise."""
    try:
        info = open_checkpoint(path)
    except CheckpointError as e:
        raise ValueError(f"trainer.init_from: {e}") from e
    except PermissionError as e:  # a shard or .metadata this user may not read
        raise ValueError(f"trainer.init_from: {cannot_read(Path(path), e)}") from e
    with torch.device("meta"):
        expected = {n: tuple(t.shape) for n, t in spec.build().state_dict().items()}
    problem = None
    for name, shape in expected.items():
        if name not in info.weight_names:
            problem = f"has no weight {name}"
        elif tuple(info.tensor_meta(name).size) != shape:
            have = tuple(info.tensor_meta(name).size)
            problem = f"holds {name} of shape {have}, the configured model {shape}"
        if problem:
            break
    problem = problem or architecture_difference(info.args, spec)
    if problem:
        hint = ""
        if info.args is not None:
            hint = f"; its model is {' '.join(model_overrides(info.args))}"
        raise ValueError(f"trainer.init_from={path} {problem}{hint}")
    return info


def canonical_name(name: str) -> str:
    """A parameter name without the wrappers' segments (FSDP1, checkpointing, compile) and a
    pipeline stage's `parts.<i>.` prefix: the single-device model's name."""
    return WRAPPER_SEGMENTS.sub("", name)


def load_weights(model: torch.nn.Module, path: Path, name_prefix: str = "") -> int:
    """Load the checkpoint's weights into `model` (this rank's part, sharded or not) in place;
    return the number of tensors loaded. `name_prefix` is what `model`'s parameter names have
    before the single-device ones. A collective when torch.distributed is initialised."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        set_model_state_dict,
    )

    info = open_checkpoint(path)  # the manifest's version and hashes, checked again here
    # FSDP1's flat parameters have no sharded view by parameter name: read whole tensors there
    # and let set_model_state_dict keep each rank's shard. DTensors (FSDP2, TP) and pipeline
    # stages read only their own parts.
    options = StateDictOptions(full_state_dict=_is_fsdp1(model))
    state = get_model_state_dict(model, options=options)

    def key(name: str) -> str:
        return WEIGHTS + canonical_name(name.removeprefix(name_prefix))

    # A fused projection held by parts is read through its single-device view (same memory).
    files = single_device_state({WEIGHTS: state}, fused_tensors(model))[WEIGHTS]
    keyed = {key(name): t for name, t in files.items()}
    single = not (dist.is_available() and dist.is_initialized())
    with one_process_io():
        load(keyed, info.path, no_dist=single)
    set_model_state_dict(model, state, options=options)  # tensors filled in place
    return len(state)


def _is_fsdp1(model: torch.nn.Module) -> bool:
    from torch.distributed.fsdp import FullyShardedDataParallel

    return isinstance(model, FullyShardedDataParallel)


class InitFromCheckpoint(Callback):
    """Loads the weights of `path` into the module's model once it is built and placed."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def on_fit_start(self, trainer, pl_module) -> None:
        root = trainer.strategy.model
        if _is_fsdp1(root):  # FSDP1 wraps the LightningModule: its root holds the flat shards
            count = load_weights(root, self.path, name_prefix="model.")
        else:
            count = load_weights(pl_module.model, self.path)
        if trainer.is_global_zero:
            print(f"trainer.init_from: {count} weights from {self.path}", flush=True)
