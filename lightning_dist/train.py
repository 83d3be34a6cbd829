"""train(cfg): compose, validate, instantiate, Trainer.fit, summary.json.

Every check that can fail runs before the Trainer starts any process or collective, and it runs
in every rank (Lightning's launcher re-runs `train.py` for ranks 1..N-1), so a bad config stops
all ranks with the same one-line message instead of leaving some of them waiting in a collective.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from lightning_dist.callbacks.context import RunContext
from lightning_dist.config import hardware_spec, model_spec
from lightning_dist.config.targets import build
from lightning_dist.contract import contract_of
from lightning_dist.hardware import HardwareSpec
from lightning_dist.layout import Layout
from lightning_dist.parallel.nodes import NodePlacementError
from lightning_dist.run.checkpoints import (
    check_checkpoint,
    checkpoint_callbacks,
    continue_logger_run,
    init_from_callbacks,
    resilience_callbacks,
    resume_from,
)
from lightning_dist.run.checks import check_machine
from lightning_dist.run.errors import ConfigError, config_errors
from lightning_dist.run.finish import build_summary, finish_logger, finite_or_none, run_config
from lightning_dist.runtime.redaction import redact_text


def build_strategy(strategy_cfg: DictConfig, hardware: HardwareSpec, *,
                   collective_timeout_s: float | None = None, **overrides: Any):  # fmt: skip
    """Instantiate `conf/strategy/*.yaml` with Hydra. A distributed strategy (its schema
    declares `process_group_backend`) gets the hardware's backend when that is null, and
    `collective_timeout_s` as the timeout of its process groups."""
    if "process_group_backend" in strategy_cfg:
        if strategy_cfg.process_group_backend is None:
            overrides.setdefault("process_group_backend", hardware.backend)
        if collective_timeout_s is not None:
            overrides.setdefault("timeout", timedelta(seconds=collective_timeout_s))
    config = OmegaConf.masked_copy(strategy_cfg, [k for k in strategy_cfg if k != "name"])
    return build(config, "strategy", **overrides, _convert_="all")


def build_planned_strategy(cfg: DictConfig, spec: Any, hardware: HardwareSpec):
    """`strategy=auto`: the planner's best layout; sets `data.micro_batch_size` to match."""
    from lightning_dist.run.preflight import planned_strategy

    kwargs, micro, description = planned_strategy(cfg, spec, hardware)
    cfg.data.micro_batch_size = micro
    if int(os.environ.get("LOCAL_RANK", "0")) == 0 and int(os.environ.get("NODE_RANK", "0")) == 0:
        print(f"strategy=auto: the planner chose {description}", flush=True)
    return build_strategy(
        cfg.strategy, hardware, collective_timeout_s=cfg.trainer.collective_timeout_s, **kwargs
    )


def resolve_layout(strategy: Any, world_size: int, num_nodes: int = 1) -> Layout:
    """The layout a strategy runs on `world_size` ranks over `num_nodes` nodes."""
    return contract_of(strategy).layout_for(world_size // num_nodes, num_nodes)


def check_strategy(strategy, spec, cfg: DictConfig, hardware: HardwareSpec, *, devices: int,
                   num_nodes: int, precision: str | None = None) -> None:  # fmt: skip
    """The strategy's own checks of the whole run: world size, precision, accelerator, batch
    split, and the model's classes (built on the meta device)."""
    import torch

    with torch.device("meta"):
        model = spec.build()
    contract_of(strategy).check_run(
        devices=devices, num_nodes=num_nodes, model=model,
        precision=precision or cfg.trainer.precision or hardware.precision,
        accelerator=hardware.accelerator,
        global_batch_size=cfg.data.global_batch_size, micro_batch_size=cfg.data.micro_batch_size,
    )  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class RunPlan:
    """Everything `train()` decided before any process starts, all checked."""

    spec: Any
    hardware: HardwareSpec
    strategy: Any
    devices: int
    num_nodes: int
    layout: Layout
    precision: str
    accumulate: int
    ckpt_path: str | None = None
    """The checkpoint to resume from: trainer.ckpt_path, or the one trainer.resume=auto found."""
    resume_note: str | None = None
    """What trainer.resume=auto found, in one line."""

    @property
    def world_size(self) -> int:
        return self.devices * self.num_nodes


def plan_run(cfg: DictConfig) -> RunPlan:
    """Compose the model, hardware and strategy and run every check that needs no process;
    raises ValueError (or FileNotFoundError) naming the bad value."""
    from lightning_dist.layout import batch_plan
    from lightning_dist.run.checks import check_config, check_cpu_capacity, resolve_precision

    check_config(cfg)  # keys, `_target_`s, schemas, numbers: before anything is built
    spec = model_spec(cfg)
    hardware = hardware_spec(cfg)
    precision = resolve_precision(cfg.trainer.precision or hardware.precision, hardware.accelerator)
    if cfg.strategy.name == "auto":
        strategy = build_planned_strategy(cfg, spec, hardware)
    else:
        strategy = build_strategy(
            cfg.strategy, hardware, collective_timeout_s=cfg.trainer.collective_timeout_s
        )
    contract = contract_of(strategy)
    if cfg.trainer.checkpoint.async_save:
        contract.enable_async_save()
    devices = 1 if contract.single_process else hardware.resolved_devices()
    num_nodes = 1 if contract.single_process else hardware.num_nodes
    if hardware.accelerator == "cpu" and not cfg.plan.only:
        check_cpu_capacity(devices, spec.num_params())
    check_strategy(strategy, spec, cfg, hardware, devices=devices, num_nodes=num_nodes,
                   precision=precision)  # fmt: skip
    ckpt_path, resume_note = resume_from(cfg)
    if ckpt_path:
        check_checkpoint(Path(ckpt_path), spec)
    layout = contract.layout_for(devices, num_nodes)
    _, accumulate = batch_plan(cfg.data.global_batch_size, layout.dp, cfg.data.micro_batch_size)
    return RunPlan(
        spec=spec, hardware=hardware, strategy=strategy, devices=devices, num_nodes=num_nodes,
        layout=layout, precision=precision, accumulate=accumulate, ckpt_path=ckpt_path,
        resume_note=resume_note,
    )  # fmt: skip


def _run_dir(cfg: DictConfig) -> Path:
    return Path(cfg.paths.output_dir)


def slurm_environment() -> list:
    """Under Slurm, Lightning's SLURMEnvironment without its own requeue handler: SIGUSR1 is
    the Preemption callback's (checkpoint, requeue, resume; lightning_dist/runtime/requeue_signal.py)."""
    from lightning.fabric.plugins.environments import SLURMEnvironment

    return [SLURMEnvironment(auto_requeue=False)] if SLURMEnvironment.detect() else []


def build_trainer(cfg: DictConfig, plan: RunPlan, run_dir: Path, callbacks: list, logger):
    """The Lightning Trainer of this run."""
    import lightning as L

    from lightning_dist.checkpoint.store import AtomicCheckpointIO
    from lightning_dist.run.loggers import metrics_logger

    t, accumulate = cfg.trainer, plan.accumulate
    plugins = [AtomicCheckpointIO(), *slurm_environment()]
    return L.Trainer(
        accelerator=plan.hardware.accelerator,
        devices=plan.devices,
        num_nodes=plan.num_nodes,
        strategy=plan.strategy,
        precision=plan.precision,
        max_steps=t.max_steps,
        accumulate_grad_batches=accumulate,
        gradient_clip_val=t.gradient_clip_val,
        val_check_interval=(t.val_check_interval * accumulate) if t.val_check_interval else None,
        check_val_every_n_epoch=None if t.val_check_interval else 1,
        log_every_n_steps=t.log_every_n_steps,
        num_sanity_val_steps=t.num_sanity_val_steps,
        enable_checkpointing=t.enable_checkpointing or bool(t.checkpoint.every_n_train_steps),
        deterministic=t.deterministic,
        benchmark=t.benchmark,
        use_distributed_sampler=False,  # our sampler keeps the global batch layout-independent
        logger=[lg for lg in (logger, metrics_logger(str(run_dir))) if lg is not None],
        callbacks=callbacks,
        plugins=plugins,
        default_root_dir=str(run_dir),
        enable_model_summary=False,
    )


def build_module(cfg: DictConfig, spec: Any):
    """The causal-LM LightningModule with the configured optimiser and schedule."""
    from lightning_dist.lm.module import CausalLM

    o = cfg.optim
    return CausalLM(
        spec, lr=o.lr, min_lr_ratio=o.min_lr_ratio, warmup_steps=o.warmup_steps,
        weight_decay=o.weight_decay, betas=tuple(o.betas), eps=o.eps, init_seed=cfg.seed,
    )  # fmt: skip


def train(cfg: DictConfig) -> dict[str, Any]:
    """Train the configured model and return the summary (written to summary.json on rank 0)."""
    started = time.perf_counter()
    from lightning_dist.runtime.requeue_signal import hold_requeue_signal

    hold_requeue_signal()  # under Slurm, before anything slow: SIGUSR1 must not end the process
    from lightning_dist.runtime.quiet import quiet_known_warnings

    quiet_known_warnings()
    import lightning as L

    from lightning_dist.callbacks.memory import MemoryByCategory
    from lightning_dist.callbacks.run_stats import RunStats
    from lightning_dist.run.preflight import check_fits, print_prediction
    from lightning_dist.strategies.launch import fix_hydra_child_command

    with config_errors():
        plan = plan_run(cfg)
        spec, hardware, strategy, layout = plan.spec, plan.hardware, plan.strategy, plan.layout
        if cfg.plan.only:  # a prediction for any hardware, on any machine
            fits = print_prediction(cfg, spec, hardware, strategy, layout, plan.precision)
            return {"plan_only": True, "fits": fits}
        if cfg.plan.check:
            check_fits(cfg, spec, hardware, strategy, layout, plan.precision)
        check_machine(cfg, plan)  # skipped by plan.only, which runs anywhere
        resilience = resilience_callbacks(cfg, plan) + init_from_callbacks(cfg, plan)
        datamodule = build(cfg.data, "data", vocab_size=spec.vocab_size)

    run_dir = _run_dir(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    fix_hydra_child_command()
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    module = build_module(cfg, spec)
    seq_len = cfg.data.seq_len
    precision = plan.precision
    stats = RunStats(tokens_per_step=cfg.data.global_batch_size * seq_len)
    callbacks = [build(c, "callbacks") for c in (cfg.callbacks or {}).values() if c is not None]
    callbacks += [stats]
    if cfg.trainer.gc_every_n_steps:
        from lightning_dist.callbacks.gc_control import GarbageCollection

        callbacks.append(GarbageCollection(cfg.trainer.gc_every_n_steps))
    callbacks += [MemoryByCategory(), *checkpoint_callbacks(cfg.trainer, run_dir), *resilience]
    context = RunContext(
        hardware=hardware, layout=layout, precision=precision, seq_len=seq_len,
        global_batch_size=cfg.data.global_batch_size,
        flops_per_token=spec.train_flops_per_token(seq_len),
    )  # fmt: skip
    for callback in callbacks:
        if hasattr(callback, "bind"):
            callback.bind(context)
    continue_logger_run(cfg, plan, run_dir)
    logger = build(cfg.logger, "logger") if cfg.logger else None
    with config_errors():  # Lightning's own checks of its arguments (e.g. the precision name)
        trainer = build_trainer(cfg, plan, run_dir, callbacks, logger)
    if trainer.is_global_zero and logger:
        logger.log_hyperparams(run_config(cfg, layout, hardware))
    if plan.resume_note and trainer.is_global_zero:
        print(plan.resume_note, flush=True)
    from lightning_dist.checkpoint.safe import CheckpointError

    try:
        trainer.fit(module, datamodule=datamodule, ckpt_path=plan.ckpt_path)
    except (NodePlacementError, CheckpointError) as e:  # alike on every rank, before step 1
        raise ConfigError(str(e)) from e

    summary = build_summary(
        cfg, module, stats, context, world_size=trainer.world_size,
        wall_seconds=time.perf_counter() - started,
    )  # fmt: skip
    # After a resume `losses` holds this run's steps only; `steps` counts every optimizer step.
    summary["first_step"] = trainer.global_step - len(module.step_losses)
    summary["steps"] = trainer.global_step
    summary["status"] = "completed"
    summary["precision"] = str(trainer.precision)  # what ran, after Lightning's own resolution
    summary["data"] = getattr(datamodule, "inputs", None)  # files, bytes, first paths, or None
    placement = contract_of(trainer.strategy).placement
    summary["nodes"] = placement.summary() if placement is not None else None
    for callback in callbacks:
        if hasattr(callback, "summary"):
            summary.update(callback.summary(trainer.world_size))
    summary = finite_or_none(summary)  # valid JSON: a NaN or Inf becomes null
    if trainer.is_global_zero:
        text = redact_text(json.dumps(summary, indent=2, allow_nan=False))
        (run_dir / "summary.json").write_text(text + "\n")
        finish_logger(logger, summary)
        from lightning_dist.runtime.record import summary_block

        print(summary_block(summary, run_dir / "summary.json"), flush=True)
    from lightning_dist.strategies.launch import end_job

    end_job(trainer)  # every rank leaves its process group; a multirun's next job starts anew
    return summary
