"""summary.json and what goes to the experiment logger at the start and the end of a run."""

from __future__ import annotations

import math
from typing import Any

from omegaconf import DictConfig, OmegaConf

from lightning_dist.callbacks.context import RunContext
from lightning_dist.hardware import HardwareSpec
from lightning_dist.layout import Layout


def run_config(cfg: DictConfig, layout: Layout, hardware: HardwareSpec) -> dict[str, Any]:
    """The resolved config with secrets redacted, plus the layout, for the experiment logger."""
    from lightning_dist.run.loggers import redact

    resolved = OmegaConf.to_container(cfg, resolve=True)
    resolved["layout"] = layout.degrees()
    resolved["hardware"]["world_size"] = layout.world_size
    return redact(resolved)


def build_summary(cfg, module, stats, context: RunContext, *, world_size: int,
                  wall_seconds: float) -> dict[str, Any]:  # fmt: skip
    """The summary.json contract of DESIGN.md (keys are only ever added, never renamed).

    `tokens_per_sec` and `mfu` (here only, not repeated elsewhere in the summary) use the shared
    step clock's median step time over the optimizer steps after the first.
    """
    from lightning_dist.runtime.record import loss_record

    tokens_per_sec = stats.tokens_per_sec()
    losses = module.step_losses
    return {
        "losses": losses,
        "final_loss": losses[-1] if losses else None,
        "val_losses": module.val_losses,
        **loss_record(losses, module.val_losses, getattr(module, "val_steps", [])),
        "steps": len(losses),
        "tokens_per_sec": tokens_per_sec,
        "step_seconds": stats.step_seconds(),
        "world_size": world_size,
        "layout": context.layout.degrees(),
        "strategy": cfg.strategy.name,
        "hardware": context.hardware.name,
        "model": _config_choice("model") or module.model_spec.__class__.__name__,
        "parameters": module.model_spec.num_params(),
        "run_name": cfg.get("run_name"),
        "precision": context.precision,
        "global_batch_size": cfg.data.global_batch_size,
        "seq_len": cfg.data.seq_len,
        "peak_memory_bytes": stats.peak_memory_per_rank,
        "mfu": context.mfu(tokens_per_sec, world_size),
        "wall_seconds": wall_seconds,
    }


def _config_choice(group: str) -> str | None:
    """The config name chosen for a group (`model=tiny` -> 'tiny') when Hydra is running."""
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get().runtime.choices.get(group) if HydraConfig.initialized() else None


def finish_logger(logger: Any, summary: dict[str, Any]) -> None:
    """Send the summary to W&B and say where an offline run was saved."""
    from lightning.pytorch.loggers import WandbLogger

    from lightning_dist.run.loggers import offline_run_dir

    if not isinstance(logger, WandbLogger):
        return
    logger.experiment.summary.update(
        {f"summary/{k}": v for k, v in summary.items() if k != "losses" and v is not None}
    )
    offline = offline_run_dir(logger)
    logger.experiment.finish()
    if offline:
        print(
            f"W&B run saved offline in {offline}; upload it with `wandb sync {offline}`", flush=True
        )


def finite_or_none(value: Any) -> Any:
    """JSON-safe: non-finite floats (anywhere in lists and dicts) become None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_none(v) for v in value]
    return value
