"""train(cfg): plan, build, fit, finish (the three stages of `lightning_dist/run/`).

Every check that can fail runs before the Trainer starts any process or collective, and it runs
in every rank (Lightning's launcher re-runs `train.py` for ranks 1..N-1), so a bad config stops
all ranks with the same one-line message instead of leaving some of them waiting in a collective.
"""

from __future__ import annotations

import time
from typing import Any

from omegaconf import DictConfig


def train(cfg: DictConfig) -> dict[str, Any]:
    """Train the configured model and return the summary (written to summary.json on rank 0)."""
    started = time.perf_counter()
    from lightning_dist.runtime.requeue_signal import hold_requeue_signal

    hold_requeue_signal()  # under Slurm, before anything slow: SIGUSR1 must not end the process
    # It records this process's parent while a launcher that started it is surely alive.
    import lightning_dist.strategies.launch  # noqa: F401
    from lightning_dist.runtime.quiet import quiet_known_warnings

    quiet_known_warnings()
    from lightning_dist.run.build import build_run
    from lightning_dist.run.errors import config_errors
    from lightning_dist.run.finish import finish_run, start_record
    from lightning_dist.run.plan import check_launch, plan_run
    from lightning_dist.run.preflight import print_prediction

    with config_errors():
        plan = plan_run(cfg)  # the composed config becomes a typed RunSpec here, and only here
        if plan.spec.plan.only:  # a prediction for any hardware, on any machine
            return {"plan_only": True, "fits": print_prediction(plan)}
        if plan.spec.plan.dry_run:  # the real code at full scale, in this one process
            return dry_run_and_print(plan)
        check_launch(plan)
    run = build_run(plan, started)
    start_record(plan, run)
    from lightning_dist.checkpoint.format import CheckpointWriteError
    from lightning_dist.parallel.replica_groups import LighthouseLost
    from lightning_dist.run.finish import write_stopped_summary

    try:
        fit(run, ckpt_path=plan.ckpt_path)
    except (CheckpointWriteError, LighthouseLost) as e:  # mid-run: keep the steps trained
        status = "checkpoint_failed" if isinstance(e, CheckpointWriteError) else "lighthouse_lost"
        saved = "" if status == "checkpoint_failed" else last_checkpoint_words(plan)
        saved += write_stopped_summary(plan, run, wall_seconds=time.perf_counter() - started,
                                       status=status, error=str(e))  # fmt: skip
        raise type(e)(f"rank {run.trainer.global_rank}: {e}{saved}") from None
    return finish_run(plan, run, wall_seconds=time.perf_counter() - started)


def last_checkpoint_words(plan: Any) -> str:
    """`; its last checkpoint is <path> (step N)`, or that there is none, for a run's line."""
    from lightning_dist.checkpoint.store import latest_checkpoint

    latest = latest_checkpoint(plan.checkpoints.dirpath)
    if latest.path is None:
        return f"; no checkpoint in {plan.checkpoints.dirpath}"
    return f"; its last checkpoint is {latest.path} (step {latest.step})"


def dry_run_and_print(plan: Any) -> dict[str, Any]:
    """`plan.dry_run=true`: the dry run's table (run/dry_run.py); returns its errors."""
    from lightning_dist.run.dry_run import dry_run, print_dry_run

    comparisons = dry_run(plan)
    print_dry_run(comparisons, f"strategy={plan.spec.strategy_name} {plan.layout}")
    return {
        "dry_run": True,
        "state_errors": [c.state_error() for c in comparisons],
        "traffic_errors": [c.traffic_errors() for c in comparisons],
    }


def fit(run: Any, ckpt_path: str | None) -> None:
    """`trainer.fit`; a node placement or checkpoint problem found as the ranks start (alike on
    every rank, before step 1) is a `ConfigError`: one line, exit status 2."""
    from lightning_dist.checkpoint.fence import FencedOut
    from lightning_dist.checkpoint.safe import CheckpointError
    from lightning_dist.parallel.nodes import NodePlacementError
    from lightning_dist.run.errors import ConfigError

    try:
        run.trainer.fit(run.module, datamodule=run.datamodule, ckpt_path=ckpt_path)
    except FencedOut:
        raise  # not a config error: train.py ends this world without a restart
    except (NodePlacementError, CheckpointError) as e:
        raise ConfigError(str(e)) from e
