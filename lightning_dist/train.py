"""train(cfg): compose, validate, instantiate, Trainer.fit, summary.json.

Every check that can fail runs before the Trainer starts any process or collective, and it runs
in every rank (Lightning's launcher re-runs `train.py` for ranks 1..N-1), so a bad config stops
all ranks with the same one-line message instead of leaving some of them waiting in a collective.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
import warnings
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from lightning_dist.builder import build
from lightning_dist.callbacks.context import RunContext
from lightning_dist.config import hardware_spec, model_spec
from lightning_dist.contract import contract_of
from lightning_dist.hardware import HardwareSpec
from lightning_dist.layout import Layout
from lightning_dist.parallel.nodes import NodePlacementError
from lightning_dist.redaction import redact_text


class ConfigError(ValueError):
    """A configuration or machine problem, reported as one line before training starts."""


@contextlib.contextmanager
def config_errors():
    """Turn the errors of building from config into `ConfigError`, unwrapping Hydra's wrapper."""
    from hydra.errors import InstantiationException

    try:
        yield
    except InstantiationException as e:
        cause = e.__cause__ or e
        raise ConfigError(str(cause).splitlines()[0]) from e
    except (ValueError, FileNotFoundError, ImportError) as e:
        raise ConfigError(str(e)) from e
    except Exception as e:  # Lightning's MisconfigurationException, e.g. from the Trainer
        if type(e).__name__ != "MisconfigurationException":
            raise
        raise ConfigError(str(e).splitlines()[0]) from e


_DETAIL_LINES = ("full_key:", "object_type=", "reference_type=", "To append to your config")


def one_line(text: str) -> str:
    """A multi-line message (Hydra's, with its option lists) as one line, without OmegaConf's
    `full_key:`/`object_type=` detail lines."""
    out = ""
    # Hydra's search path is noise here, and its "+key=value" hint is wrong for typed groups.
    for raw in str(text).split("\nConfig search path:")[0].splitlines():
        line = raw.strip()
        if not line or line.startswith(_DETAIL_LINES):
            continue
        if raw.startswith("\t") and out:  # an option of a list such as "Available options"
            out += (" " if out.endswith(":") else ", ") + line
        else:
            out += (" " if out.endswith((".", ":", ";")) else "; ") + line if out else line
    return out


def report_config_error(error: BaseException | str) -> None:
    """Print `error: <one line>` on stderr, with secrets redacted, and exit with status 2."""
    from omegaconf.errors import OmegaConfBaseException

    text = str(error)
    cause = getattr(error, "__cause__", None)
    if isinstance(cause, OmegaConfBaseException) and str(cause) not in text:
        text += "\n" + str(cause)  # Hydra's compose errors keep the details in their cause
    print(f"error: {redact_text(one_line(text))}", file=sys.stderr, flush=True)
    sys.exit(2)


def guard_command_line(args: list[str] | None = None) -> None:
    """For `train.py`, before Hydra starts: refuse overrides that have Hydra itself run code,
    and report Hydra's configuration errors (unknown keys and config names) in one line."""
    from lightning_dist._compat import wrap_hydra_errors
    from lightning_dist.builder import check_hydra_overrides

    try:
        check_hydra_overrides(sys.argv[1:] if args is None else args)
    except ValueError as e:
        report_config_error(e)
    wrap_hydra_errors(report_config_error)


def _cluster_launch() -> bool:
    """True when an external launcher (torchrun, SLURM) started this process."""
    return "TORCHELASTIC_RUN_ID" in os.environ or "SLURM_NTASKS" in os.environ


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
    from lightning_dist.preflight import planned_strategy

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
    from lightning_dist.checks import check_config, check_cpu_capacity, resolve_precision
    from lightning_dist.layout import batch_plan

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


def checkpoint_dir(cfg: DictConfig) -> Path:
    """Where `step<N>.ckpt` checkpoints go: trainer.checkpoint.dirpath or <run dir>/checkpoints."""
    return Path(cfg.trainer.checkpoint.dirpath or _run_dir(cfg) / "checkpoints")


def resume_from(cfg: DictConfig) -> tuple[str | None, str | None]:
    """The checkpoint to start from and, for trainer.resume=auto, one line saying what it found."""
    from lightning_dist.resume import latest_checkpoint

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


def check_machine(cfg: DictConfig, plan: RunPlan) -> None:
    """Checks against this machine and launch (skipped by `plan.only`, which runs anywhere)."""
    plan.hardware.check_machine()
    if plan.hardware.num_nodes > 1 and not _cluster_launch():
        raise ValueError(
            f"hardware.num_nodes={plan.hardware.num_nodes} needs every node started by torchrun "
            "or SLURM (see README, 'Many nodes'); on one machine use hardware.num_nodes=1."
        )
    if cfg.data.seq_len > plan.spec.max_seq_len:
        raise ValueError(
            f"data.seq_len={cfg.data.seq_len} is above the model's maximum "
            f"{plan.spec.max_seq_len}; lower data.seq_len or raise model.max_seq_len."
        )


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
    from lightning_dist.loggers import WANDB_RUN_ID_FILE

    saved = run_dir / WANDB_RUN_ID_FILE
    if plan.ckpt_path and cfg.logger and "id" in cfg.logger and not cfg.logger.id:
        if saved.is_file():
            cfg.logger.id = saved.read_text().strip()


def resilience_callbacks(cfg: DictConfig, plan: RunPlan) -> list:
    """The NaN guard and preemption handling always; the hang watchdog with several ranks."""
    from lightning_dist.callbacks.nan_guard import NonFiniteGuard
    from lightning_dist.callbacks.preemption import Preemption
    from lightning_dist.callbacks.watchdog import HangWatchdog
    from lightning_dist.launch.requeue_signal import hand_over

    t = cfg.trainer
    preemption = Preemption(checkpoint_dir(cfg))
    hand_over(preemption)  # a SIGUSR1 that came before training starts is acted on at step 1
    callbacks = [NonFiniteGuard(t.nan_policy, t.nan_max_skips), preemption]
    if plan.world_size > 1:
        callbacks.append(HangWatchdog(stall_seconds=t.collective_timeout_s / 2))
    return callbacks


def quiet_known_warnings() -> None:
    """Silence deprecation notices raised inside Lightning itself, which users cannot act on."""
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\).*")
    warnings.filterwarnings("ignore", message=r".*all_gather is deprecated.*")
    # Lightning asks for a resumable dataloader mid-epoch, but resume is exact without one: the
    # sampler restarts from the datamodule's saved step (the resume tests compare bit for bit).
    warnings.filterwarnings("ignore", message=r".*your dataloader is not resumable.*")
    from lightning_dist.quiet import quiet_third_party

    quiet_third_party()  # profiler USDT lines and repeated third-party tips, with or without callbacks


def _run_dir(cfg: DictConfig) -> Path:
    return Path(cfg.paths.output_dir)


def slurm_environment() -> list:
    """Under Slurm, Lightning's SLURMEnvironment without its own requeue handler: SIGUSR1 is
    the Preemption callback's (checkpoint, requeue, resume; lightning_dist/launch/requeue_signal.py)."""
    from lightning.fabric.plugins.environments import SLURMEnvironment

    return [SLURMEnvironment(auto_requeue=False)] if SLURMEnvironment.detect() else []


def build_trainer(cfg: DictConfig, plan: RunPlan, run_dir: Path, callbacks: list, logger):
    """The Lightning Trainer of this run."""
    import lightning as L

    from lightning_dist.loggers import metrics_logger
    from lightning_dist.resume import AtomicCheckpointIO

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
    from lightning_dist.launch.requeue_signal import hold_requeue_signal

    hold_requeue_signal()  # under Slurm, before anything slow: SIGUSR1 must not end the process
    quiet_known_warnings()
    import lightning as L

    from lightning_dist.callbacks.memory import MemoryByCategory
    from lightning_dist.callbacks.run_stats import RunStats
    from lightning_dist.preflight import check_fits, print_prediction
    from lightning_dist.strategies import fix_hydra_child_command

    with config_errors():
        plan = plan_run(cfg)
        spec, hardware, strategy, layout = plan.spec, plan.hardware, plan.strategy, plan.layout
        if cfg.plan.only:  # a prediction for any hardware, on any machine
            fits = print_prediction(cfg, spec, hardware, strategy, layout, plan.precision)
            return {"plan_only": True, "fits": fits}
        if cfg.plan.check:
            check_fits(cfg, spec, hardware, strategy, layout, plan.precision)
        check_machine(cfg, plan)
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
        from lightning_dist.record import summary_block

        print(summary_block(summary, run_dir / "summary.json"), flush=True)
    from lightning_dist.strategies.launch import end_job

    end_job(trainer)  # every rank leaves its process group; a multirun's next job starts anew
    return summary


def run_config(cfg: DictConfig, layout: Layout, hardware: HardwareSpec) -> dict[str, Any]:
    """The resolved config with secrets redacted, plus the layout, for the experiment logger."""
    from lightning_dist.loggers import redact

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
    from lightning_dist.record import loss_record

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

    from lightning_dist.loggers import offline_run_dir

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
