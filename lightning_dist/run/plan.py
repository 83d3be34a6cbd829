"""Stage 1, plan: `RunSpec` -> `RunPlan`, every check that needs no process.

It runs in every rank (Lightning's launcher re-runs `train.py` for ranks 1..N-1), so a bad config
stops all ranks with the same one-line message before any of them waits in a collective.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from lightning_dist.checkpoint.store import RunCheckpoints, step_folders
from lightning_dist.contract import contract_of
from lightning_dist.hardware import HardwareSpec
from lightning_dist.layout import Batch, Layout, batch_plan
from lightning_dist.run.spec import RunSpec
from lightning_dist.run.strategy_checks import build_strategy, check_built_strategy


@dataclass(frozen=True, kw_only=True)
class RunPlan:
    """Everything decided before any process starts, all checked."""

    spec: RunSpec
    strategy: Any
    devices: int
    num_nodes: int
    layout: Layout
    precision: str
    batch: Batch
    """The spec's batch, with the micro-batch size strategy=auto chose."""
    accumulate: int
    checkpoints: RunCheckpoints
    ckpt_path: str | None = None
    """The checkpoint to resume from: trainer.ckpt_path, or the one trainer.resume=auto found."""
    resume_note: str | None = None
    """What trainer.resume=auto found, in one line."""
    resume_step: int | None = None
    """The optimizer step of `ckpt_path` (None: a fresh start, or a step no file records)."""

    @property
    def world_size(self) -> int:
        return self.devices * self.num_nodes

    @property
    def hardware(self) -> HardwareSpec:
        return self.spec.hardware

    @property
    def model(self) -> Any:
        return self.spec.model


def plan_run(cfg: DictConfig) -> RunPlan:
    """The edge: check the composed config (keys, `_target_`s, schemas, numbers), convert it
    once into a `RunSpec`, and plan; raises ValueError (or FileNotFoundError) naming the bad
    value."""
    from lightning_dist.run.checks import check_config

    check_config(cfg)
    return make_plan(RunSpec.of(cfg))


def make_plan(spec: RunSpec) -> RunPlan:
    """Build the strategy, check it against the model, batch and machine, find the resume
    point and verify its checkpoint."""
    from lightning_dist.run.checks import resolve_precision

    hardware, trainer = spec.hardware, spec.trainer
    precision = resolve_precision(trainer.precision or hardware.precision, hardware.accelerator)
    if spec.strategy_name == "auto":
        strategy, batch = build_planned_strategy(spec)
    else:
        strategy = build_strategy(
            spec.strategy, hardware, collective_timeout_s=trainer.collective_timeout_s
        )
        batch = spec.batch
    devices, num_nodes = check_built_strategy(spec, strategy, batch, precision)
    contract = contract_of(strategy)
    checkpoints = RunCheckpoints.of(trainer, spec.run_dir)
    ckpt_path, resume_note = checkpoints.start_point()
    if ckpt_path and contract.heals_from_peer():
        ckpt_path, resume_note = (
            None,
            ("relaunched replica group: it heals from a running group, not from its checkpoint"),
        )
    resume_step = None
    if ckpt_path:
        checkpoints.verify_resume(ckpt_path, spec.model)
        resume_step = checkpoint_step(ckpt_path)
    layout = contract.layout_for(devices, num_nodes)
    shares = contract.data_shares(layout)
    _, accumulate = batch_plan(batch.global_batch_size, shares, batch.micro_batch_size)
    return RunPlan(
        spec=spec,
        strategy=strategy,
        devices=devices,
        num_nodes=num_nodes,
        layout=layout,
        precision=precision,
        batch=batch,
        accumulate=accumulate,
        checkpoints=checkpoints,
        ckpt_path=ckpt_path,
        resume_note=resume_note,
        resume_step=resume_step,
    )


def checkpoint_step(path: str) -> int | None:
    """The optimizer step a checkpoint was saved at (None where nothing records it)."""
    from lightning_dist.checkpoint.weights import open_checkpoint

    try:
        return open_checkpoint(path).step
    except (OSError, ValueError):
        return None


def build_planned_strategy(spec: RunSpec) -> tuple[Any, Batch]:
    """`strategy=auto`: the planner's best layout, and the batch with its micro-batch size."""
    from lightning_dist.run.preflight import planned_strategy

    kwargs, micro, description = planned_strategy(
        spec.batch, spec.model, spec.hardware, spec.trainer.precision
    )
    if int(os.environ.get("LOCAL_RANK", "0")) == 0 and int(os.environ.get("NODE_RANK", "0")) == 0:
        print(f"strategy=auto: the planner chose {description}", flush=True)
    strategy = build_strategy(
        spec.strategy,
        spec.hardware,
        collective_timeout_s=spec.trainer.collective_timeout_s,
        **kwargs,
    )
    return strategy, replace(spec.batch, micro_batch_size=micro)


def resolve_layout(strategy: Any, world_size: int, num_nodes: int = 1) -> Layout:
    """The layout a strategy runs on `world_size` ranks over `num_nodes` nodes."""
    return contract_of(strategy).layout_for(world_size // num_nodes, num_nodes)


def check_launch(plan: RunPlan) -> None:
    """The checks a run that trains adds to the plan (`plan.only` and the Slurm launcher skip
    them, so they run on any machine): the planner's prediction against the hardware's memory
    (`plan.check`), this machine and its launcher, the experiment logger (W&B asked to log
    online has a key and a server), the checkpoint folder (a folder this user may write, with
    room for one checkpoint), a fresh start's records (no earlier run's to write over), then
    trainer.init_from's weights (last: it reads the checkpoint, which only the machines
    that train may see)."""
    from lightning_dist.planner.settings import checkpoint_bytes
    from lightning_dist.run.checks import check_machine
    from lightning_dist.run.loggers import check_logger
    from lightning_dist.run.preflight import check_fits

    if plan.spec.plan.check:
        check_fits(plan)
    check_machine(plan)
    check_logger(plan.spec.logger)
    plan.checkpoints.check_folder(
        checkpoint_bytes(plan.model.num_params(), plan.precision), num_nodes=plan.num_nodes
    )
    # A replica group relaunched into its own running job heals from a peer: the records there
    # are its own first attempt's, which it continues (without resume=auto it was refused and
    # torchrun's restart of a group that fell behind ended the group).
    relaunched = contract_of(plan.strategy).heals_from_peer()
    if not plan.ckpt_path and plan.checkpoints.resume != "auto" and not relaunched:
        check_fresh_start(plan.spec.run_dir, plan.checkpoints.dirpath, plan.spec.run_name)
    if plan.checkpoints.init_from and not plan.ckpt_path:
        plan.checkpoints.verify_init_from(plan.model)


def check_fresh_start(run_dir: Any, checkpoint_dir: Any, run_name: str | None) -> None:
    """A run that starts at step 0 (no trainer.resume=auto, no trainer.ckpt_path) must not write
    over an earlier run's records (summary.json, the metrics CSV, step checkpoints): ValueError
    naming what is there and the ways on (continue it, another name or folder, move it)."""
    from lightning_dist.run.loggers import METRICS_CSV

    run_dir = Path(run_dir)
    found = [str(f) for f in (run_dir / "summary.json", run_dir / METRICS_CSV) if f.is_file()]
    steps = step_folders(checkpoint_dir)
    if steps:
        found.append(f"checkpoints up to {steps[-1][1]}")
    if not found:
        return
    named = f" {run_name}" if run_name else ""
    raise ValueError(
        f"this run{named} would write over an earlier run ({', '.join(found)}); continue it "
        "with trainer.resume=auto, start a new one with another run_name=... (its own folder "
        "under outputs/) or hydra.run.dir=..., or move those files away"
    )
