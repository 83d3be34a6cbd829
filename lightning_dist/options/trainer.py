"""The training loop's settings (`trainer.*`) and the planner's switches of a run (`plan.*`):
each declared once, with `knob()`. Their Hydra schemas (`TrainerSchema`, `PlanSchema`) are
generated from these classes (config/schemas.py); `run.spec.RunSpec` holds them. Plain Python.
Their ranges are checked with the rest of a composed config (`run.checks.check_numbers`)."""

from __future__ import annotations

from dataclasses import dataclass

from lightning_dist.options.knobs import knob
from lightning_dist.options.saving import SaveOptions


@dataclass(frozen=True, kw_only=True)
class TrainerOptions:
    """How long and how a run trains, validates, logs, saves and survives faults."""

    max_steps: int = knob(200, "Optimizer steps to train.")
    precision: str | None = knob(
        None, "Lightning precision (32-true, bf16-mixed, ...); null takes the hardware's default."
    )
    gradient_clip_val: float | None = knob(
        1.0,
        "Clip the gradients' global norm (over every shard and stage) to this; null: no clipping.",
    )
    val_check_interval: int | None = knob(
        100,
        "Validate every this many optimizer steps; null: no validation (and no validation "
        "split is needed).",
    )
    log_every_n_steps: int = knob(
        1,
        "Send the logged metrics to the loggers (the metrics CSV, W&B) every this many "
        "optimizer steps; 1: every step's loss, however short the run.",
    )
    num_sanity_val_steps: int = knob(0, "Lightning's validation batches before training.")
    enable_checkpointing: bool = knob(
        False,
        "Lightning's own checkpoint callback; our saving is trainer.checkpoint.*.",
    )
    checkpoint: SaveOptions = knob(SaveOptions(), "When and where checkpoints are saved.")
    ckpt_path: str | None = knob(
        None,
        "Resume from this checkpoint (a file, or a sharded checkpoint's folder).",
    )
    init_from: str | None = knob(
        None,
        "Start from this checkpoint folder's weights alone (written by any layout, or by "
        "`python -m lightning_dist.checkpoint import`); optimizer, step and data start fresh. "
        "Ignored when resuming (trainer.ckpt_path, or a checkpoint trainer.resume=auto found).",
    )
    resume: str | None = knob(
        None,
        "auto: resume from the newest complete step<N>.ckpt of the checkpoint folder, if "
        "any (partial ones are skipped and named); null: start fresh (or from "
        "trainer.ckpt_path).",
    )
    collective_timeout_s: float = knob(
        600.0,
        "Timeout of every collective; a rank that makes no progress for half of it stops "
        "the job with its rank, step and phase named (HangWatchdog).",
    )
    nan_policy: str = knob(
        "stop",
        "stop: a non-finite loss or gradient stops the run before the optimizer step; "
        "skip: the step is skipped (up to trainer.nan_max_skips in a row).",
    )
    nan_max_skips: int = knob(5, "Non-finite steps skipped in a row before the run stops.")
    gc_every_n_steps: int = knob(
        50,
        "Python's cyclic garbage collector runs every this many optimizer steps, on every "
        "rank at once, instead of whenever allocations trigger it (inside a step, on one rank, "
        "the others waiting); 0 leaves Python's automatic collection as it is.",
    )
    memory_by_category_step: int = knob(
        2,
        "The optimizer step whose memory per rank and category summary.json records "
        "(torch's MemTracker sees every op of that step, about a second of Python per rank on "
        "the debug model); 0 measures no step.",
    )
    deterministic: bool = knob(False, "Lightning's deterministic algorithms switch.")
    benchmark: bool = knob(False, "Lightning's cudnn.benchmark switch (GPU only).")


@dataclass(frozen=True, kw_only=True)
class PlanOptions:
    """What the planner does for a run before it starts."""

    only: bool = knob(
        False, "Print the planner's prediction for this run (and its best layout) and exit."
    )
    check: bool = knob(
        True, "Stop before launch when the planner predicts the layout does not fit in memory."
    )
    dry_run: bool = knob(
        False,
        "Build the planned run at its full world size in this one process (torch's fake "
        "process group, fake tensors), run one step, print each dry-run rank's bytes beside the "
        "planner's, and exit (lightning_dist/run/dry_run.py).",
    )
