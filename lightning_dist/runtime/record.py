"""One record of a run: what the console, summary.json, the metrics CSV and W&B agree on.

Steps are optimizer steps. The console's "step N" and summary.json's `losses[N - 1]` are the
N-th step: a resumed run's `losses` start at step 1 too (the checkpoint carried them,
`callbacks/run_history.py`). Lightning's loggers (the metrics CSV,
W&B's `trainer/global_step`) count the steps completed *before* a step, so their row
`step = N - 1` holds the N-th step: `LOGGER_STEP_OFFSET`. `python -m lightning_dist.report`
adds it back, so its plots use the console's numbering.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

LOGGER_STEP_OFFSET = 1
"""Optimizer step N is logged by Lightning's loggers at step N - 1."""

SMOOTHING_STEPS = 10
"""`final_loss_smoothed` averages at most this many of the last steps."""


def smoothing_window(steps: int) -> int:
    """How many final steps `final_loss_smoothed` averages: 10, or a quarter of a shorter run
    (at least one), so that a short run's early, much higher losses stay out."""
    return max(1, min(SMOOTHING_STEPS, steps // 4))


def smoothed_final_loss(losses: list[float]) -> float | None:
    """The mean loss of the last `smoothing_window(len(losses))` steps; None without steps."""
    if not losses:
        return None
    return statistics.fmean(losses[-smoothing_window(len(losses)) :])


def loss_record(
    losses: list[float], val_losses: list[float], val_steps: list[int]
) -> dict[str, Any]:
    """The loss keys of summary.json beside `losses` and `final_loss`."""
    return {
        "final_loss_smoothed": smoothed_final_loss(losses),
        "smoothing_steps": smoothing_window(len(losses)) if losses else 0,
        "final_val_loss": val_losses[-1] if val_losses else None,
        "val_steps": val_steps,
    }


def log_at_this_step(trainer: Any, metrics: dict[str, float]) -> None:
    """Write `metrics` to every logger of `trainer` at the optimizer step that just ended, once
    (for metrics measured only now and then, which `LightningModule.log` would repeat at every
    later logging step). Call it on rank 0 from `on_train_batch_end`."""
    step = trainer.global_step - LOGGER_STEP_OFFSET
    for logger in trainer.loggers:
        logger.log_metrics(metrics, step=step)


RESUME_OVERRIDES = ("trainer.resume", "trainer.ckpt_path", "trainer.init_from")
"""Overrides the command that continues a run replaces with `trainer.resume=auto`."""


def command_line(resume: bool = False) -> str:
    """This process's command as a user would type it (secrets redacted, as the run directory
    has redacted `sys.argv` already); with `resume`, the one that continues the run from its
    newest complete checkpoint."""
    import shlex
    import sys

    from lightning_dist.runtime.redaction import redact_text

    program = sys.argv[0]
    args = [redact_text(a) for a in sys.argv[1:]]
    if resume:
        args = [a for a in args if a.partition("=")[0].lstrip("+") not in RESUME_OVERRIDES]
        args.append("trainer.resume=auto")
    return shlex.join(["python", program, *args])


def _fmt(value: Any, spec: str, missing: str = "n/a") -> str:
    return missing if value is None else format(value, spec)


def summary_block(summary: dict[str, Any], path: Path | str | None = None) -> str:
    """The few lines the console ends a run with: what summary.json says, in words."""
    steps, ranks = summary.get("steps"), summary.get("world_size")
    wall = summary.get("wall_seconds")
    status = summary.get("status", "completed")
    ended = "run finished" if status == "completed" else f"run stopped ({status})"
    first = summary.get("first_step") or 0
    ran = f"{steps} steps" if not first else f"steps {first + 1}-{steps} (resumed at step {first})"
    segments = summary.get("segments") or []
    whole = ""
    if len(segments) > 1:
        whole = f", {len(segments)} attempts {_fmt(summary.get('total_wall_seconds'), '.0f')} s"
    head = (
        f"{ended}: {ran} in {_fmt(wall, '.0f')} s{whole} | {summary.get('model')} | "
        f"strategy={summary.get('strategy')} on {ranks} rank(s) of {summary.get('hardware')}"
    )
    window = summary.get("smoothing_steps") or 0
    final = _fmt(summary.get("final_loss"), ".4f")
    if window > 1:  # the mean first: one step's loss is noisy
        loss = (
            f"  loss {_fmt(summary['final_loss_smoothed'], '.4f')} (mean of the last "
            f"{window} steps; step {steps} alone {final})"
        )
    else:
        loss = f"  loss {final} at step {steps}"
    if summary.get("final_val_loss") is not None:
        at = (summary.get("val_steps") or [None])[-1]
        loss += f" | validation loss {summary['final_val_loss']:.4f}"
        loss += f" at step {at}" if at is not None else ""
    peaks = summary.get("peak_memory_bytes") or []
    rate = (
        f"  tokens/s {_fmt(summary.get('tokens_per_sec'), ',.0f')} | "
        f"MFU {_fmt(summary.get('mfu'), '.1%')} | peak memory "
        f"{_fmt(max(peaks) / 1024**3 if peaks else None, '.2f')} GiB (largest rank)"
    )
    lines = [head, loss, rate]
    for name, skipped in (summary.get("skipped_records") or {}).items():
        lines.append(
            f"  warning: source {name}: skipped {skipped['count']} bad record(s) "
            f"(data.skip_bad_records=true; the first: {skipped['first']})"
        )
    if path is not None:
        lines.append(f"  summary: {path}")
    return "\n".join(lines)
