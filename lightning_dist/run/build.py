"""Stage 2, build: `RunPlan` -> `BuiltRun`: the Trainer, the module, the data and the callbacks.

Each helper takes the parts of the plan it needs. Building the data and the Trainer can still
find a configuration problem (a missing data file, a precision Lightning does not know): those
are `ConfigError`s, one line on every rank, as in the plan stage.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import ProgressBar

from lightning_dist.callbacks.context import RunContext
from lightning_dist.callbacks.memory import MemoryByCategory
from lightning_dist.callbacks.progress import progress_bar
from lightning_dist.config.targets import build
from lightning_dist.run.errors import config_errors
from lightning_dist.run.plan import RunPlan


@dataclass(frozen=True, kw_only=True)
class BuiltRun:
    """What `trainer.fit` runs, and what the finish stage reads back."""

    trainer: Any
    module: Any
    datamodule: Any
    callbacks: list
    logger: Any
    stats: Any
    """The `RunStats` callback: the shared step clock of throughput and MFU."""
    history: Any
    """The `RunHistory` callback: the run's losses and segments across its attempts."""
    context: RunContext


def build_run(plan: RunPlan, started: float | None = None) -> BuiltRun:
    """Everything `trainer.fit` needs, in the order that keeps every rank's seeds and files
    alike: the data, the run directory, the seed, the module, the callbacks, the loggers.
    `started`: when this process started (`time.perf_counter()`), for the run's segments."""
    import lightning as L

    from lightning_dist.callbacks.run_history import RunHistory
    from lightning_dist.callbacks.run_stats import RunStats
    from lightning_dist.strategies.launch import fix_hydra_child_command

    spec = plan.spec
    # strategy=auto chose the micro-batch size; any other run's data config already holds it.
    chosen = {} if plan.batch == spec.batch else {"micro_batch_size": plan.batch.micro_batch_size}
    with config_errors():
        datamodule = build(spec.data, "data", vocab_size=spec.model.vocab_size, **chosen)
        if spec.trainer.val_check_interval:  # null: no validation, no validation split needed
            check_validation_split(plan, datamodule)
    spec.run_dir.mkdir(parents=True, exist_ok=True)
    fix_hydra_child_command()
    L.seed_everything(spec.seed, workers=True, verbose=False)
    module = build_module(plan)
    stats = RunStats(tokens_per_step=plan.batch.tokens_per_step)
    context = RunContext(
        hardware=plan.hardware,
        layout=plan.layout,
        precision=plan.precision,
        seq_len=plan.batch.seq_len,
        global_batch_size=plan.batch.global_batch_size,
        flops_per_token=spec.model.train_flops_per_token(plan.batch.seq_len),
    )
    history = RunHistory(started)
    callbacks = [*run_callbacks(plan, stats), history]
    for callback in callbacks:
        if hasattr(callback, "bind"):
            callback.bind(context)
    with config_errors():  # e.g. a WANDB_BASE_URL that wandb refuses
        logger = build(logger_config(plan), "logger") if spec.logger else None
    if logger is None and spec.choices.get("debug"):
        note_no_logger(spec.choices["debug"])
    with config_errors():  # Lightning's own checks of its arguments (e.g. the precision name)
        trainer = build_trainer(plan, callbacks, logger)
    return BuiltRun(
        trainer=trainer,
        module=module,
        datamodule=datamodule,
        callbacks=callbacks,
        logger=logger,
        stats=stats,
        history=history,
        context=context,
    )


def check_validation_split(plan: RunPlan, datamodule: Any) -> None:
    """Before launch: the validation split holds a micro-batch for every data-parallel rank
    (where its size is known before tokenizing; else the data loader checks it on every rank)."""
    from lightning_dist.contract import contract_of
    from lightning_dist.layout import batch_plan

    shares = contract_of(plan.strategy).data_shares(plan.layout)
    micro, _ = batch_plan(plan.batch.global_batch_size, shares, plan.batch.micro_batch_size)
    datamodule.check_validation(shares, micro)


def build_module(plan: RunPlan):
    """The causal-LM LightningModule with the configured optimiser and schedule."""
    from lightning_dist.lm.module import CausalLM

    return CausalLM(plan.model, optim=plan.spec.optim, init_seed=plan.spec.seed)


def run_callbacks(plan: RunPlan, stats: Any) -> list:
    """The configured callbacks, then the run's own: a progress display where none is
    configured, the step clock, garbage collection, memory by category (unless
    trainer.memory_by_category_step=0), checkpoint saving, resilience, and the start from a
    checkpoint (resumed, or trainer.init_from's weights)."""
    callbacks = [build(c, "callbacks") for c in plan.spec.callbacks]
    if not any(isinstance(c, ProgressBar) for c in callbacks):
        # Else Lightning adds its own: a Rich bar whenever rich is installed, also when stdout
        # is no terminal, where nobody sees it but its thread still renders it every second,
        # taking the GIL from the training step (bench/overhead.py, callbacks off).
        callbacks.append(progress_bar())
    callbacks.append(stats)
    gc_every = plan.spec.trainer.gc_every_n_steps
    if gc_every:
        from lightning_dist.callbacks.gc_control import GarbageCollection

        callbacks.append(GarbageCollection(gc_every))
    memory_step = plan.spec.trainer.memory_by_category_step
    checkpoints = plan.checkpoints
    return [
        *callbacks,
        *([MemoryByCategory(memory_step)] if memory_step else []),
        *checkpoints.save_callbacks(),
        *resilience_callbacks(plan.spec.trainer, checkpoints.dirpath, plan.world_size),
        *checkpoints.start_callbacks(resuming=bool(plan.ckpt_path)),
    ]


def resilience_callbacks(trainer: Any, checkpoint_dir: Path, world_size: int) -> list:
    """The NaN guard and preemption handling always; the hang watchdog with several ranks.
    `trainer` is the `TrainerSchema`."""
    from lightning_dist.callbacks.nan_guard import NonFiniteGuard
    from lightning_dist.callbacks.preemption import Preemption
    from lightning_dist.callbacks.watchdog import HangWatchdog
    from lightning_dist.runtime.requeue_signal import hand_over

    preemption = Preemption(checkpoint_dir)
    hand_over(preemption)  # a SIGUSR1 that came before training starts is acted on at step 1
    callbacks = [NonFiniteGuard(trainer.nan_policy, trainer.nan_max_skips), preemption]
    if world_size > 1:
        callbacks.append(HangWatchdog(stall_seconds=trainer.collective_timeout_s / 2))
    return callbacks


def logger_config(plan: RunPlan):
    """The logger's config. A logger that declares a `name` left null gets the run's name;
    resuming in the same run directory, one that declares an `id` gets the run id it saved
    there (W&B: `wandb_run_id`), so the resumed run continues the same logged run."""
    from omegaconf import OmegaConf

    from lightning_dist.run.loggers import WANDB_RUN_ID_FILE

    node = plan.spec.logger
    saved = plan.spec.run_dir / WANDB_RUN_ID_FILE
    if plan.ckpt_path and "id" in node and not node.id and saved.is_file():
        node = OmegaConf.merge(node, {"id": saved.read_text().strip()})
    if "name" in node and node.name is None and plan.spec.run_name:
        node = OmegaConf.merge(node, {"name": plan.spec.run_name})
    return node


def note_no_logger(debug: str) -> None:
    """One line, from the first process: a debug config's run logs to no experiment logger.
    `debug=fast` sets `logger=none`: its runs are checks of a setup, seconds long, which would
    otherwise each add a W&B run (online when logged in) and W&B's start-up to their time."""
    from lightning_dist.runtime.console import launch_rank_zero

    if launch_rank_zero():
        print(
            f"debug={debug}: no experiment logger, W&B is off; add logger=wandb to log this run",
            flush=True,
        )


def slurm_environment() -> list:
    """Under Slurm, Lightning's SLURMEnvironment without its own requeue handler: SIGUSR1 is
    the Preemption callback's (checkpoint, requeue, resume; lightning_dist/runtime/requeue_signal.py)."""
    from lightning.fabric.plugins.environments import SLURMEnvironment

    return [SLURMEnvironment(auto_requeue=False)] if SLURMEnvironment.detect() else []


def build_trainer(plan: RunPlan, callbacks: list, logger: Any):
    """The Lightning Trainer of this run."""
    import lightning as L

    from lightning_dist.checkpoint.store import AtomicCheckpointIO
    from lightning_dist.run.loggers import metrics_logger

    t, accumulate, run_dir = plan.spec.trainer, plan.accumulate, plan.spec.run_dir
    metrics = metrics_logger(str(run_dir), plan.resume_step)
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
        limit_val_batches=None if t.val_check_interval else 0,  # null: no validation at all
        log_every_n_steps=t.log_every_n_steps,
        num_sanity_val_steps=t.num_sanity_val_steps,
        enable_checkpointing=t.enable_checkpointing or bool(t.checkpoint.every_n_train_steps),
        deterministic=t.deterministic,
        benchmark=t.benchmark,
        use_distributed_sampler=False,  # our sampler keeps the global batch layout-independent
        logger=[lg for lg in (logger, metrics) if lg is not None],
        callbacks=callbacks,
        plugins=[AtomicCheckpointIO(), *slurm_environment()],
        default_root_dir=str(run_dir),
        enable_model_summary=False,
    )
