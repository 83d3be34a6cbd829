"""A resumed run's place in its epoch, counted in this layout's micro-batches.

Lightning restores the epoch loop's batch counters from the checkpoint, in the micro-batches of
the layout that wrote it, and closes a gradient-accumulation window when the count is a
multiple of this run's accumulation. When the layout changes the accumulation (an elastic job
that shrank from 4 ranks to 2: accumulation 1 becomes 2), the counts disagree: resumed at
step 5, the first step would take one micro-batch instead of two, and every later step would
straddle two global batches. `GlobalBatchSampler` already restarts at the right sample (it
counts optimizer steps), so this callback moves Lightning's counters to the same place:
(steps taken) x (this run's accumulation), keeping Lightning's own offsets between them.
"""

from __future__ import annotations

import logging
import math

from lightning.pytorch.callbacks import Callback

log = logging.getLogger(__name__)


class ResumePosition(Callback):
    """Added by the build stage when the run resumes from a checkpoint."""

    def on_train_start(self, trainer, pl_module) -> None:
        accumulate = trainer.accumulate_grad_batches
        progress = trainer.fit_loop.epoch_loop.batch_progress
        batches = trainer.num_training_batches
        if math.isfinite(batches):
            steps_per_epoch = max(int(batches) // accumulate, 1)
            in_epoch = max(trainer.global_step - trainer.current_epoch * steps_per_epoch, 0)
        else:  # a stream (`lm/streaming.py`): one endless epoch
            in_epoch = trainer.global_step
        shifts = {
            "current": in_epoch * accumulate - progress.current.ready,
            "total": trainer.global_step * accumulate - progress.total.ready,
        }
        for name, shift in shifts.items():
            counts = getattr(progress, name)
            for field in ("ready", "started", "processed", "completed"):
                # No clamp at 0: at an epoch's end Lightning's own `completed` is ready - 1, and
                # its restart adds the 1 back (training_epoch_loop.reset).
                setattr(counts, field, getattr(counts, field) + shift)
        if shifts["current"] and trainer.is_global_zero:
            log.info(
                "Resumed at step %d with gradient accumulation %d, unlike the checkpoint's "
                "layout: the epoch continues at micro-batch %d",
                trainer.global_step,
                accumulate,
                progress.current.ready,
            )
