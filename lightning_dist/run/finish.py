"""Stage 3, finish: `trainer.fit` ran; summary.json, the experiment logger's record and its
summary, the console's summary block, and every rank leaving its process group."""

from __future__ import annotations

import copy
import json
import math
from typing import Any

from lightning_dist.contract import contract_of
from lightning_dist.layout import Layout
from lightning_dist.run.build import BuiltRun
from lightning_dist.run.plan import RunPlan


def start_record(plan: RunPlan, run: BuiltRun) -> None:
    """Before fit, on rank 0: the logger's hyperparameters and the resume note."""
    if not run.trainer.is_global_zero:
        return
    if run.logger:
        record = plan.spec.record()
        # What ran: strategy=auto's micro-batch size, the W&B run id a resume continues.
        if "micro_batch_size" in (record.get("data") or {}):
            record["data"]["micro_batch_size"] = plan.batch.micro_batch_size
        if "id" in (record.get("logger") or {}):
            record["logger"]["id"] = getattr(run.logger, "version", None) or record["logger"]["id"]
        run.logger.log_hyperparams(run_config(record, plan.layout))
    if plan.resume_note:
        print(plan.resume_note, flush=True)


def finish_run(plan: RunPlan, run: BuiltRun, *, wall_seconds: float) -> dict[str, Any]:
    """The summary (written to <run dir>/summary.json and sent to the logger by rank 0, after
    every rank has left the job's process group, so that a multirun's next job starts anew)."""
    from lightning_dist.runtime.record import command_line
    from lightning_dist.runtime.redaction import redact_text
    from lightning_dist.strategies.launch import end_job

    trainer = run.trainer
    summary = build_summary(plan, run, world_size=trainer.world_size, wall_seconds=wall_seconds)
    # `losses` holds every step from 1 when the checkpoint resumed carried them (RunHistory).
    summary["steps"] = trainer.global_step
    summary.update(run.history.record(trainer.global_step))
    summary["status"] = "completed"
    summary["command"] = command_line()
    summary["precision"] = str(trainer.precision)  # what ran, after Lightning's own resolution
    summary["data"] = getattr(run.datamodule, "inputs", None)  # files, bytes, first paths
    skipped = getattr(run.datamodule, "skipped_records", None)  # streamed sources' bad records
    if skipped is not None and skipped():
        summary["skipped_records"] = skipped()
    mixture = getattr(run.datamodule, "mixture_summary", None)  # several sources: their shares
    if mixture is not None and mixture(trainer.global_step) is not None:
        summary["data_mixture"] = mixture(trainer.global_step)
        summary["val_losses_by_source"] = getattr(run.module, "val_losses_by_source", {})
    placement = contract_of(trainer.strategy).placement
    summary["nodes"] = placement.summary() if placement is not None else None
    for callback in run.callbacks:
        if hasattr(callback, "summary"):
            summary.update(callback.summary(trainer.world_size))
    summary.update(contract_of(trainer.strategy).summary_fields())
    summary = finite_or_none(summary)  # valid JSON: a NaN or Inf becomes null
    # The job's last collective is behind it: every rank meets and leaves (the others need not
    # wait out rank 0's writing below).
    end_job(trainer)
    if trainer.is_global_zero:
        removed = plan.checkpoints.prune()  # saves that completed in the background, preemption's
        if removed:
            names = ", ".join(p.name for p in removed)
            print(
                f"removed {names} (trainer.checkpoint.keep_last={plan.checkpoints.saving.keep_last})"
            )
        path = plan.spec.run_dir / "summary.json"
        path.write_text(redact_text(json.dumps(summary, indent=2, allow_nan=False)) + "\n")
        finish_logger(run.logger, summary)
        from lightning_dist.runtime.record import summary_block

        print(summary_block(summary, path), flush=True)
        if plan.spec.report:
            write_run_report(plan.spec.run_dir)
    return summary


def write_stopped_summary(
    plan: RunPlan, run: BuiltRun, *, wall_seconds: float, status: str, error: str
) -> str:
    """A run that stopped on an error after training steps (a checkpoint it could not write):
    rank 0 writes summary.json with every step trained so far, `status` and `error`, and no
    collective runs (the ranks may not meet again). Returns words for the run's one line."""
    trainer = run.trainer
    if not trainer.is_global_zero:
        return ""
    from lightning_dist.runtime.record import command_line
    from lightning_dist.runtime.redaction import redact_text

    summary = build_summary(plan, run, world_size=trainer.world_size, wall_seconds=wall_seconds)
    summary.update(run.history.record(trainer.global_step))
    summary.update(steps=trainer.global_step, status=status, error=error, command=command_line())
    summary.update(contract_of(trainer.strategy).summary_fields())  # ft_hsdp: groups per step
    path = plan.spec.run_dir / "summary.json"
    try:
        if path.is_file() and json.loads(path.read_text()).get("steps", 0) >= trainer.global_step:
            return f"; {path} (an earlier attempt's) holds more steps and is kept"
        text = json.dumps(finite_or_none(summary), indent=2, allow_nan=False)
        path.write_text(redact_text(text) + "\n")
    except (OSError, ValueError) as e:
        return f"; summary.json not written either ({e})"
    return f"; the losses of steps 1-{trainer.global_step} are in {path}"


def write_run_report(run_dir) -> None:
    """`python -m lightning_dist.report <run dir>` at the end of the run (`report=true`); one
    line instead where matplotlib is not installed."""
    import importlib.util

    from lightning_dist.run.report_pages import write_report

    if importlib.util.find_spec("matplotlib") is None:
        print("  report: skipped (matplotlib is not installed; report=false hides this)")
        return

    written = write_report(run_dir, run_dir / "report")
    print(f"  report: {run_dir / 'report'} ({len(written)} plots)", flush=True)


def run_config(resolved: dict[str, Any], layout: Layout) -> dict[str, Any]:
    """The resolved config (`RunSpec.record()`) with secrets redacted, plus the layout, for the
    experiment logger."""
    from lightning_dist.run.loggers import redact

    record = copy.deepcopy(resolved)
    record["layout"] = layout.describe()
    record["hardware"]["world_size"] = layout.world_size
    return redact(record)


def build_summary(
    plan: RunPlan, run: BuiltRun, *, world_size: int, wall_seconds: float
) -> dict[str, Any]:
    """The summary.json contract of DESIGN.md (keys are only ever added, never renamed).

    `tokens_per_sec` and `mfu` (here only, not repeated elsewhere in the summary) use the shared
    step clock's median step time over the optimizer steps after the first.
    """
    from lightning_dist.runtime.record import loss_record

    module, stats, context, spec = run.module, run.stats, run.context, plan.spec
    tokens_per_sec = stats.tokens_per_sec()
    losses = module.step_losses
    experts = getattr(module, "expert_stats", None)  # a mixture of experts: its loads
    moe = {"moe": experts.summary(plan.batch.tokens_per_step)} if experts is not None else {}
    return {
        "losses": losses,
        "final_loss": losses[-1] if losses else None,
        "val_losses": module.val_losses,
        **loss_record(losses, module.val_losses, getattr(module, "val_steps", [])),
        "steps": len(losses),
        "tokens_per_sec": tokens_per_sec,
        "step_seconds": stats.step_seconds(),
        "world_size": world_size,
        "layout": context.layout.describe(),
        "strategy": spec.strategy_name,
        "hardware": context.hardware.name,
        "model": spec.choices.get("model") or module.model_spec.__class__.__name__,
        "parameters": module.model_spec.num_params(),
        "run_name": spec.run_name,
        "precision": context.precision,
        "global_batch_size": spec.batch.global_batch_size,
        "seq_len": spec.batch.seq_len,
        "peak_memory_bytes": stats.peak_memory_per_rank,
        "mfu": context.mfu(tokens_per_sec, world_size),
        "wall_seconds": wall_seconds,
        **moe,
    }


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
