"""A run's checkpoints and resilience: where checkpoints go, what to resume or start from (each
checked before any process starts), and the callbacks that save, guard and hand over."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig

if TYPE_CHECKING:
    from lightning_dist.train import RunPlan


def checkpoint_dir(cfg: DictConfig) -> Path:
    """Where `step<N>.ckpt` checkpoints go: trainer.checkpoint.dirpath or <run dir>/checkpoints."""
    return Path(cfg.trainer.checkpoint.dirpath or Path(cfg.paths.output_dir) / "checkpoints")


def resume_from(cfg: DictConfig) -> tuple[str | None, str | None]:
    """The checkpoint to start from and, for trainer.resume=auto, one line saying what it found."""
    from lightning_dist.checkpoint.store import latest_checkpoint

    t = cfg.trainer
    if t.resume not in (None, "auto"):
        raise ValueError(f"trainer.resume={t.resume!r} must be auto or null")
    if t.resume == "auto":
        if t.ckpt_path:
            raise ValueError(
                "trainer.resume=auto and trainer.ckpt_path are both set; keep one of them"
            )
        point = latest_checkpoint(checkpoint_dir(cfg))
        return (str(point.path) if point.path else None), point.describe()
    if t.init_from and t.ckpt_path:
        raise ValueError(
            "trainer.init_from and trainer.ckpt_path are both set; init_from starts from "
            "weights, ckpt_path resumes a run: keep one of them"
        )
    if t.ckpt_path and not Path(t.ckpt_path).exists():
        raise FileNotFoundError(f"trainer.ckpt_path={t.ckpt_path} does not exist")
    return t.ckpt_path, None


def init_from_callbacks(cfg: DictConfig, plan: RunPlan) -> list:
    """trainer.init_from: the checkpoint is checked now and loaded once the model is built;
    nothing when resuming, since a resumed run has its own weights."""
    path = cfg.trainer.init_from
    if not path or plan.ckpt_path:
        return []
    from lightning_dist.checkpoint.init_from import InitFromCheckpoint, check_init_from

    check_init_from(path, plan.spec)
    return [InitFromCheckpoint(path)]


def check_checkpoint(path: Path, spec: Any) -> None:
    """The checkpoint to resume from is complete, unchanged since it was written, of a format
    version this code reads, and of this model's shapes; CheckpointError (a ValueError) naming
    the problem otherwise. Runs on every rank before any process group exists."""
    import torch

    from lightning_dist.checkpoint.format import check_model_shapes, require_resumable
    from lightning_dist.checkpoint.manifest import open_manifest

    open_manifest(path)
    require_resumable(path)  # an imported weights-only folder: trainer.init_from, not a resume
    with torch.device("meta"):
        model = spec.build()
    # CausalLM holds the model as `self.model`, so its state-dict names start with "model.".
    shapes = {f"model.{name}": tuple(t.shape) for name, t in model.state_dict().items()}
    check_model_shapes(path, shapes)


def checkpoint_callbacks(trainer_cfg: DictConfig, run_dir: Path) -> list:
    """A ModelCheckpoint saving every `trainer.checkpoint.every_n_train_steps` steps, if set.

    The file (or, for sharded strategies, folder) is `step<N>.ckpt`; resume with
    `trainer.ckpt_path=<it>`. Each is kept, so a run can be resumed from any of them.
    """
    from lightning.pytorch.callbacks import ModelCheckpoint

    every = trainer_cfg.checkpoint.every_n_train_steps
    save_last = trainer_cfg.checkpoint.save_last
    if not (every or save_last):
        return []
    dirpath = trainer_cfg.checkpoint.dirpath or run_dir / "checkpoints"
    return [
        ModelCheckpoint(
            dirpath=dirpath,
            filename="step{step}",
            auto_insert_metric_name=False,
            every_n_train_steps=every or None,
            save_top_k=-1 if every else 0,
            save_last=save_last,
            # A resumed or restarted run rewrites step<N>.ckpt and last.ckpt, never `-v1` copies.
            enable_version_counter=False,
        )
    ]


def continue_logger_run(cfg: DictConfig, plan: RunPlan, run_dir: Path) -> None:
    """Resuming in the same run directory: a logger that declares an `id` gets the run id it
    saved there (W&B: `wandb_run_id`), so the resumed run continues the same logged run."""
    from lightning_dist.run.loggers import WANDB_RUN_ID_FILE

    saved = run_dir / WANDB_RUN_ID_FILE
    if plan.ckpt_path and cfg.logger and "id" in cfg.logger and not cfg.logger.id:
        if saved.is_file():
            cfg.logger.id = saved.read_text().strip()


def resilience_callbacks(cfg: DictConfig, plan: RunPlan) -> list:
    """The NaN guard and preemption handling always; the hang watchdog with several ranks."""
    from lightning_dist.callbacks.nan_guard import NonFiniteGuard
    from lightning_dist.callbacks.preemption import Preemption
    from lightning_dist.callbacks.watchdog import HangWatchdog
    from lightning_dist.runtime.requeue_signal import hand_over

    t = cfg.trainer
    preemption = Preemption(checkpoint_dir(cfg))
    hand_over(preemption)  # a SIGUSR1 that came before training starts is acted on at step 1
    callbacks = [NonFiniteGuard(t.nan_policy, t.nan_max_skips), preemption]
    if plan.world_size > 1:
        callbacks.append(HangWatchdog(stall_seconds=t.collective_timeout_s / 2))
    return callbacks
