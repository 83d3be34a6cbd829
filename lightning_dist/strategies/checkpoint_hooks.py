"""Lightning's checkpoint hooks for every lightning_dist strategy: one format, any layout.

Each strategy saves the same folder (`lightning_dist/checkpoint/format.py`): DCP shards under
single-process names, Lightning's `meta.pt`, and `manifest.json` last. Loading needs the
optimizers to exist (model and optimizer state are read together, resharded to this layout), so
it runs after `setup()` for every strategy, DDP and single included.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn
from typing_extensions import override

from lightning_dist.checkpoint import format as ckpt
from lightning_dist.checkpoint.canonical import canonical_module

if TYPE_CHECKING:  # the class it is mixed into, for the type checker; no base at run time
    from lightning.pytorch.strategies import Strategy as MixedInto
else:
    MixedInto = object


class FormatCheckpointHooks(MixedInto):
    """Mixed into `LightningDistStrategy`; `self` is also a Lightning strategy."""

    _async_saves: Any = None
    """An `AsyncSaves` where checkpoints are written in the background (strategies/mesh.py)."""

    @property
    @override
    def restore_checkpoint_after_setup(self) -> bool:
        return True

    def checkpoint_module(self) -> nn.Module:
        """The module whose state-dict names are the single-process LightningModule's."""
        from torch.distributed.fsdp import FullyShardedDataParallel

        if isinstance(self.model, FullyShardedDataParallel):  # FSDP1 wraps the LightningModule
            return self.model
        return canonical_module(self.lightning_module, self.pipeline_part())

    def pipeline_part(self) -> nn.Module | None:
        """This rank's pipeline stages (a `PipelinedModel`), None without pipeline parallelism."""
        return None

    # Lightning's own collection would gather the state a second time: the format reads it
    # from the model in save_checkpoint (and writes it in load_checkpoint).
    @override
    def lightning_module_state_dict(self) -> dict[str, Any]:
        return {}

    @override
    def optimizer_state(self, optimizer: Any) -> dict[str, Any]:
        return {}

    @override
    def load_model_state_dict(self, checkpoint: Any, strict: bool = True) -> None:
        pass  # loaded in load_checkpoint

    @override
    def load_optimizer_state_dict(self, checkpoint: Any) -> None:
        pass  # loaded in load_checkpoint

    @override
    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None
    ) -> None:
        path = Path(self.broadcast(str(filepath)))
        checkpoint.pop("state_dict", None)
        optimizers = self.optimizers if checkpoint.pop("optimizer_states", None) is not None else []
        state = ckpt.gather_state(self.checkpoint_module(), optimizers)
        fields = self.manifest_fields(checkpoint)
        rank0 = self.global_rank == 0
        if self._async_saves is not None:
            self._async_saves.wait()  # the previous save finishes before its folder is reused
            ckpt.prepare_folder(path, rank0=rank0, barrier=self.barrier)
            self._async_saves.save(state, path, checkpoint, fields, rank0=rank0)
            return
        try:
            ckpt.write_folder(state, path, checkpoint, fields, rank0=rank0)
        except ckpt.CheckpointWriteError as e:
            # The steps trained since the last save are kept in a folder beside this one.
            raise ckpt.CheckpointWriteError(
                f"cannot write the checkpoint {path} ({e}); "
                + _save_fallback(state, path, checkpoint, fields, rank0=rank0)
            ) from None

    @override
    def load_checkpoint(
        self, checkpoint_path: Any, weights_only: bool | None = None
    ) -> dict[str, Any]:
        """Load a checkpoint of any strategy and layout into this one (see CHECKPOINTS.md)."""
        path = Path(self.broadcast(str(checkpoint_path)))
        pipelined = self.pipeline_part() is not None  # this rank's stages only
        meta = ckpt.load_state(
            self.checkpoint_module(), self.optimizers, path, whole_model=not pipelined
        )
        meta.setdefault("optimizer_states", [])  # loaded above; Lightning checks the key only
        return meta

    def manifest_fields(self, checkpoint: dict[str, Any]) -> dict[str, Any]:
        """What `manifest.json` says about this run, besides the format and the file hashes."""
        import lightning
        import torch

        import lightning_dist
        from lightning_dist.checkpoint.fence import WRITER_KEY

        trainer = self.lightning_module.trainer
        layout = self.layout_for(self.world_size, 1)  # the degrees, not the node split
        datamodule = getattr(trainer, "datamodule", None)
        data = {}
        if datamodule is not None and hasattr(datamodule, "global_batch_size"):
            data = {
                "global_batch_size": datamodule.global_batch_size,
                "seed": getattr(datamodule, "seed", None),
                "samples_seen": trainer.global_step * datamodule.global_batch_size,
            }
        layout_fields = {
            name: getattr(layout, name)
            for name in (
                "dp_replicate",
                "dp_shard",
                "cp",
                "tp",
                "ep",
                "pp",
                "schedule",
                "virtual_stages",
            )
        }
        return {
            "step": int(trainer.global_step),
            "writer": checkpoint.get(WRITER_KEY),  # the world that wrote it (checkpoint/fence.py)
            "model": _model_args(self.lightning_module),
            "layout": {**layout_fields, "world_size": layout.world_size},
            "strategy": getattr(self, "strategy_name", type(self).__name__),
            "data": data,
            "precision": str(trainer.precision),
            "versions": {
                "torch": torch.__version__,
                "lightning": lightning.__version__,
                "lightning_dist": lightning_dist.__version__,
            },
        }


FALLBACK_SUFFIX = ".fallback"
"""The folder beside an unwritable checkpoint folder that takes its last save."""


def _save_fallback(state: dict, path: Path, meta: dict, fields: dict, *, rank0: bool) -> str:
    """Save into `<checkpoint folder>.fallback/` instead; what was saved, as words for the
    run's one line."""
    fallback = path.parent.with_name(path.parent.name + FALLBACK_SUFFIX) / path.name
    try:
        ckpt.write_on_every_rank(lambda: rank0 and fallback.parent.mkdir(exist_ok=True))
        ckpt.write_folder(state, fallback, meta, fields, rank0=rank0)
    except ckpt.CheckpointWriteError as e:
        return f"the fallback save to {fallback} failed too ({e}); this step's state is lost"
    return f"saved it to {fallback} instead: resume with trainer.ckpt_path={fallback}"


def _model_args(module: nn.Module) -> dict[str, Any]:
    """The model's arguments as plain JSON values (ModelArgs or HFModelSpec), else {}."""
    spec = getattr(module, "model_spec", None)
    if spec is None or not dataclasses.is_dataclass(spec):
        return {}
    args = {
        k: v
        for k, v in dataclasses.asdict(spec).items()
        if v is None or isinstance(v, (bool, int, float, str, list, dict))
    }
    if hasattr(spec, "num_params"):
        args["parameters"] = int(spec.num_params())
    return args
