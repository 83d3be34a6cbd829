"""A run's history across its attempts: what each checkpoint carries so that a resumed run's
records (summary.json, the console summary) cover the whole run, not only its last attempt.

Every checkpoint this callback sees saved holds, under `run_history`, the global train loss of
each step so far, the validation losses and their steps, and the run's segments: one entry per
attempt (process) with its first and last optimizer step and its wall seconds, the last one
as of the save. Resuming from it restores the losses into the module and continues the list.
A checkpoint written before this existed has none: the records then start at the resume step.
"""

from __future__ import annotations

import time
from typing import Any

from lightning.pytorch.callbacks import Callback

HISTORY_KEY = "run_history"


class RunHistory(Callback):
    """See the module doc. `started`: this process's start (`time.perf_counter()`), the zero
    of its segment's wall seconds."""

    def __init__(self, started: float | None = None) -> None:
        self.started = time.perf_counter() if started is None else started
        self.earlier: list[dict[str, Any]] = []
        """The segments of the attempts before this one (from the checkpoint resumed)."""
        self.first_step = 0
        """The optimizer step this attempt started after (its resume step; 0 for a fresh run)."""

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.first_step = int(trainer.global_step)

    def segments(self, last_step: int) -> list[dict[str, Any]]:
        """Every attempt's steps and wall seconds, this one's up to `last_step` and now."""
        here = {
            "first_step": self.first_step + 1,
            "last_step": int(last_step),
            "wall_seconds": round(time.perf_counter() - self.started, 3),
        }
        return [*self.earlier, here]

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict) -> None:
        checkpoint[HISTORY_KEY] = {
            "losses": [float(v) for v in getattr(pl_module, "step_losses", [])],
            "val_losses": [float(v) for v in getattr(pl_module, "val_losses", [])],
            "val_steps": [int(v) for v in getattr(pl_module, "val_steps", [])],
            "segments": self.segments(trainer.global_step),
        }

    def on_load_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict) -> None:
        history = checkpoint.get(HISTORY_KEY) or {}
        step = int(checkpoint.get("global_step", 0))
        self.earlier = list(history.get("segments", []))
        for name in ("step_losses", "val_losses", "val_steps"):
            saved = history.get(name.removeprefix("step_"))
            if saved is not None and isinstance(getattr(pl_module, name, None), list):
                setattr(pl_module, name, list(saved))
        if len(getattr(pl_module, "step_losses", [])) != step:
            pl_module.step_losses = []  # not the whole run: keep the records of this attempt only

    def record(self, last_step: int) -> dict[str, Any]:
        """summary.json's `first_step` (this attempt's resume step), `segments` and
        `total_wall_seconds` (every attempt's wall seconds added)."""
        segments = self.segments(last_step)
        return {
            "first_step": self.first_step,
            "segments": segments,
            "total_wall_seconds": round(sum(s["wall_seconds"] for s in segments), 3),
        }
