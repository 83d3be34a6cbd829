"""The run spec: the composed config converted once, at the edge, into typed parts.

`RunSpec.of(cfg)` is the only place a training run reads the raw `DictConfig`. The plain
sections become their option classes (`options.trainer.TrainerOptions` with its
`options.saving.SaveOptions`, `options.optim.OptimOptions`, `options.trainer.PlanOptions`: each
setting declared once there, the Hydra schemas generated from them), the model and hardware their specs, the batch a `Batch`; the
sections that name a class to build (`strategy`, `data`, `logger`, `callbacks`) stay `_target_`
nodes, which the build stage hands to `config.targets.build` (the allow-list) and nothing else.
This module imports neither torch nor Lightning (the strategy built from the spec does).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from lightning_dist.config import hardware_spec, model_spec
from lightning_dist.hardware import HardwareSpec
from lightning_dist.layout import Batch
from lightning_dist.options.knobs import options_of
from lightning_dist.options.optim import OptimOptions
from lightning_dist.options.trainer import PlanOptions, TrainerOptions


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    """What one training run was asked to do, typed; see the module doc."""

    model: Any
    """`ModelArgs`, or `HFModelSpec` for a Hugging Face model (models/protocol.py)."""
    hardware: HardwareSpec
    """The configured hardware, with this round's node count in an elastic job."""
    node_counts: tuple[int, ...] = ()
    """Every node count the run may have (hardware.min_nodes to hardware.num_nodes as
    configured, in every round of an elastic job); empty: just `hardware.num_nodes`."""
    batch: Batch
    strategy: DictConfig
    """conf/strategy/*: the strategy's `_target_` node; `name` is the preset's name."""
    data: DictConfig
    """conf/data/*: the datamodule's `_target_` node."""
    trainer: TrainerOptions
    optim: OptimOptions
    plan: PlanOptions
    run_dir: Path
    """`paths.output_dir`: summary.json, logs and (by default) checkpoints go here."""
    seed: int
    run_name: str | None = None
    """`run_name`, or its default from the config choices (`config/resolvers.run_name`); None
    outside `@hydra.main` when not set."""
    logger: DictConfig | None = None
    report: bool = False
    """Write the run's report (plots, README.md) into its run directory at the end."""
    callbacks: tuple[DictConfig, ...] = ()
    """The configured callbacks that are not null, in the config's order."""
    choices: dict[str, str] = field(default_factory=dict)
    """Hydra's group choices (`model=tiny` -> {"model": "tiny"}), empty outside `@hydra.main`."""
    source: DictConfig | None = field(default=None, repr=False, compare=False)
    """The composed config itself, read only by `record()`: what the experiment logger keeps."""

    @property
    def strategy_name(self) -> str:
        return str(self.strategy.name)

    def record(self) -> dict[str, Any]:
        """The whole config resolved to plain values, for the experiment logger (resolved only
        when a logger asks: `plan.only` and the launcher never do)."""
        return {} if self.source is None else OmegaConf.to_container(self.source, resolve=True)

    @classmethod
    def of(cls, cfg: DictConfig, choices: dict[str, str] | None = None) -> RunSpec:
        """Convert a composed, checked `conf/train.yaml` (`run.checks.check_config`)."""
        data, hardware = cfg.data, hardware_spec(cfg)
        choices = dict(_hydra_choices() if choices is None else choices)
        return cls(
            model=model_spec(cfg),
            hardware=hardware.this_round(),  # an elastic round: its own node count
            node_counts=tuple(hardware.node_counts()),
            batch=Batch.of_config(data),
            strategy=cfg.strategy,
            data=data,
            trainer=options_of(TrainerOptions, cfg.trainer),
            optim=options_of(OptimOptions, cfg.optim),
            plan=options_of(PlanOptions, cfg.plan),
            run_dir=Path(cfg.paths.output_dir),
            seed=int(cfg.seed),
            run_name=_run_name(cfg.get("run_name"), choices),
            logger=cfg.logger or None,
            report=bool(cfg.get("report", False)),
            callbacks=tuple(c for c in (cfg.callbacks or {}).values() if c is not None),
            choices=choices,
            source=cfg,
        )


def _hydra_choices() -> dict[str, str]:
    from hydra.core.hydra_config import HydraConfig

    return dict(HydraConfig.get().runtime.choices) if HydraConfig.initialized() else {}


def _run_name(name: str | None, choices: dict[str, str]) -> str | None:
    from lightning_dist.config.resolvers import run_name

    groups = [choices.get(group) for group in ("model", "strategy", "hardware")]
    if name is None and not all(groups):
        return None
    return run_name(name, *(g or "" for g in groups))
