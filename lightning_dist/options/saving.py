"""When and where a run saves its checkpoints (`trainer.checkpoint.*`): each setting declared once,
with `knob()`. The Hydra schema `CheckpointSchema` is generated from this class
(config/schemas.py) and `checkpoint.store.RunCheckpoints` holds it whole. Plain Python."""

from __future__ import annotations

from dataclasses import dataclass

from lightning_dist.options.knobs import knob


@dataclass(frozen=True, kw_only=True)
class SaveOptions:
    """The checkpoint saving settings of a run (the format is the strategy's:
    `strategy.state_dict_type`)."""

    every_n_train_steps: int | None = knob(
        None,
        "Save a checkpoint every this many optimizer steps, as <dirpath>/step<N>.ckpt (a "
        "folder when the strategy saves sharded); null saves none.",
    )
    dirpath: str | None = knob(None, "Where checkpoints go; null means <run dir>/checkpoints.")
    save_last: bool = knob(False, "Also save <dirpath>/last.ckpt when training ends.")
    keep_last: int | None = knob(
        3,
        "Keep this many of the newest complete step<N>.ckpt; an older one is deleted only "
        "once a newer one is complete (null: keep every one).",
    )
    async_save: bool = knob(
        False,
        "Write sharded checkpoints in the background (fsdp2 and 3d); the next save and "
        "the end of training wait for the previous one.",
    )
