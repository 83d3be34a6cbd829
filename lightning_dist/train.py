"""train(cfg): plan, build, fit, finish (the three stages of `lightning_dist/run/`); and `main()`,
the command line that composes the config and calls it (`python train.py`, `python -m
lightning_dist`, the `lightning-dist-train` command).

Every check that can fail runs before the Trainer starts any process or collective, and it runs
in every rank (Lightning's launcher re-runs `train.py` for ranks 1..N-1), so a bad config stops
all ranks with the same one-line message instead of leaving some of them waiting in a collective.
"""

from __future__ import annotations

import time
from typing import Any

from omegaconf import DictConfig

from lightning_dist.runtime.process_end import end_barrier, end_torchrun_agent, run_then_end
from lightning_dist.runtime.quiet import quiet_known_warnings, quiet_native_logs

NON_FINITE_EXIT_CODE = 3
"""Exit status of a run that stopped at a non-finite loss (every rank stops at the same step)."""
CHECKPOINT_WRITE_EXIT_CODE = 2
"""A checkpoint that could not be written: like a configuration error, the user's to fix."""
REPLICA_GROUP_EXIT_CODE = 6
"""strategy=ft_hsdp: a group behind the others (torchrun relaunches it, and it heals from a
peer), relaunched with no peer left to heal from, or left without its Lighthouse."""


def train(cfg: DictConfig) -> dict[str, Any]:
    """Train the configured model and return the summary (written to summary.json on rank 0)."""
    started = time.perf_counter()
    from lightning_dist.runtime.requeue_signal import hold_requeue_signal

    hold_requeue_signal()  # under Slurm, before anything slow: SIGUSR1 must not end the process
    # It records this process's parent while a launcher that started it is surely alive.
    import lightning_dist.strategies.launch  # noqa: F401

    quiet_known_warnings()
    from lightning_dist.run.build import build_run
    from lightning_dist.run.errors import ConfigError, config_errors
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
    from lightning_dist.cluster.replica_groups import LighthouseLost, ReplicaGroupLeftBehind
    from lightning_dist.data.records import BadRecord

    try:
        fit(run, ckpt_path=plan.ckpt_path)
    except BadRecord as e:
        if run.trainer.global_step == 0:
            raise  # before step 1: a configuration error like any other
        # A streamed source reached it mid-run, on every rank at the same step (each reads the
        # whole stream): the steps trained are kept, then the run's one line and exit status 2.
        step = run.trainer.global_step
        saved = _stop_mid_run(plan, run, started, e, status="bad_record")
        raise ConfigError(f"{e} (reached after step {step}{saved})") from None
    except (CheckpointWriteError, LighthouseLost, ReplicaGroupLeftBehind) as e:
        # mid-run: keep the steps trained
        replicas = not isinstance(e, CheckpointWriteError)
        saved = _stop_mid_run(
            plan,
            run,
            started,
            e,
            status=e.status,
            name_checkpoint=replicas,
            timeout_s=plan.strategy.options.replicas.ft_timeout_s if replicas else None,
        )
        raise type(e)(f"rank {run.trainer.global_rank}: {e}{saved}") from None
    return finish_run(plan, run, wall_seconds=time.perf_counter() - started)


def _stop_mid_run(
    plan: Any,
    run: Any,
    started: float,
    error: BaseException,
    *,
    status: str,
    name_checkpoint: bool = True,
    timeout_s: float | None = None,
) -> str:
    """Keep what a run stopped mid-way trained: rank 0 writes summary.json with `status`, then
    every rank waits for the others (`timeout_s`, default the collective timeout). Every rank
    meets the same error (the same record of the same stream, the save's agreement, the group's
    quorum, give or take a moment): none ends before all have left training and summary.json is
    written, or a peer's watchdog, still running, names the ended rank as stalled. Returns the
    words for the run's line: its last checkpoint (with `name_checkpoint`) and summary.json."""
    from lightning_dist.run.finish import write_stopped_summary

    saved = last_checkpoint_words(plan) if name_checkpoint else ""
    saved += write_stopped_summary(
        plan, run, wall_seconds=time.perf_counter() - started, status=status, error=str(error)
    )
    end_barrier(plan.spec.trainer.collective_timeout_s if timeout_s is None else timeout_s)
    return saved


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
    """`trainer.fit`; a node placement, checkpoint or data split problem found as the
    ranks start (alike on every rank, before step 1) is a `ConfigError`: one line, exit status
    2."""
    from lightning_dist.checkpoint.fence import FencedOut
    from lightning_dist.checkpoint.safe import CheckpointError
    from lightning_dist.cluster.nodes import NodePlacementError
    from lightning_dist.lm.datasets import SplitTooSmall
    from lightning_dist.run.errors import ConfigError

    try:
        run.trainer.fit(run.module, datamodule=run.datamodule, ckpt_path=ckpt_path)
    except FencedOut:
        raise  # not a config error: train.py ends this world without a restart
    except (NodePlacementError, CheckpointError, SplitTooSmall) as e:
        raise ConfigError(str(e)) from e


def main() -> None:
    """The command line: Hydra composes `conf/train.yaml` (found as `pkg://lightning_dist.conf`,
    so an installed wheel composes it too; a user's own config folder joins it with
    `hydra.searchpath=[file://...]` or `--config-dir`) with the overrides, and `train(cfg)` runs
    it. The process's exit status is the work's, never a C++ destructor's at teardown."""

    quiet_native_logs()  # before torch loads: c10 reads its log level once
    import hydra

    from lightning_dist.config import CONF_MODULE
    from lightning_dist.run.errors import guard_command_line

    guard_command_line()  # Hydra-level overrides that run code, and Hydra's errors in one line
    hydra_main = hydra.main(
        config_path=f"pkg://{CONF_MODULE}", config_name="train", version_base="1.3"
    )
    run_then_end(hydra_main(_train_and_exit))


def _train_and_exit(cfg: DictConfig) -> None:
    """`train(cfg)` with the project's exit statuses: 2 and one line for a bad config, the
    fence's, the non-finite loss's, the preemption's (see each constant)."""
    import os
    import sys

    from lightning_dist.run.checks import check_config_text
    from lightning_dist.run.errors import ConfigError, config_errors, report_config_error

    try:  # a typo is reported before torch and Lightning are imported (seconds on a busy box)
        with config_errors():
            check_config_text(cfg)
    except ConfigError as e:
        report_config_error(e)
    from lightning_dist.callbacks.nan_guard import NonFiniteError
    from lightning_dist.callbacks.preemption import (
        INTERRUPTED_EXIT_CODE,
        PREEMPTED_EXIT_CODE,
        REQUEUE_BY_SCRIPT,
    )
    from lightning_dist.checkpoint.fence import FENCED_OUT_EXIT_CODE, FencedOut
    from lightning_dist.checkpoint.format import CheckpointWriteError
    from lightning_dist.cluster.replica_groups import (
        LighthouseLost,
        ReplicaGroupAlone,
        ReplicaGroupFellBehind,
        ReplicaGroupLeftBehind,
        ReplicaGroupQuorumFailed,
    )

    try:
        result = train(cfg)
    except ConfigError as e:
        report_config_error(e)  # one line, secrets redacted, exit 2
    except (CheckpointWriteError, LighthouseLost, ReplicaGroupLeftBehind) as e:
        # mid-run; the line names the rank
        from lightning_dist.strategies.launch import rank_exit_code

        print(f"error: {e}", file=sys.stderr, flush=True)
        replicas = not isinstance(e, CheckpointWriteError)
        if replicas:  # a restart cannot reach the Lighthouse, or finds no peer, either
            end_torchrun_agent()
        code = REPLICA_GROUP_EXIT_CODE if replicas else CHECKPOINT_WRITE_EXIT_CODE
        sys.exit(rank_exit_code(code))
    except (ReplicaGroupAlone, ReplicaGroupFellBehind, ReplicaGroupQuorumFailed) as e:
        # ft_hsdp: torchrun relaunches the group, which heals from a running one; a relaunched
        # group that found none would find none again (the others have ended).
        print(f"error: {_rank_named()}{e}", file=sys.stderr, flush=True)
        if isinstance(e, ReplicaGroupAlone):
            end_torchrun_agent()
        sys.exit(REPLICA_GROUP_EXIT_CODE)
    except FencedOut as e:  # another world writes the checkpoint folder: this one stops
        from lightning_dist.strategies.launch import rank_exit_code

        print(f"error: {_rank_named()}{e}", file=sys.stderr, flush=True)
        sys.exit(rank_exit_code(FENCED_OUT_EXIT_CODE))
    except NonFiniteError as e:  # every rank stops at the same step; one of them says so
        from lightning_dist.strategies.launch import rank_exit_code

        if e.rank == 0:
            print(f"error: {e}", file=sys.stderr, flush=True)
        sys.exit(rank_exit_code(NON_FINITE_EXIT_CODE))
    if result.get("plan_only") and not result["fits"]:
        sys.exit(1)
    if result.get("status") == "preempted":
        from lightning_dist.strategies.launch import rank_exit_code

        if result.get("requeue") and os.environ.get(REQUEUE_BY_SCRIPT):
            sys.exit(0)  # the job script requeues (summary.json says so); srun sees no failure
        ctrl_c = result.get("signal") == "SIGINT"
        sys.exit(rank_exit_code(INTERRUPTED_EXIT_CODE if ctrl_c else PREEMPTED_EXIT_CODE))


def _rank_named() -> str:
    """`rank <r>: ` in a process of a multi-rank job (its line is one of several), else ''."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return f"rank {dist.get_rank()}: "
    return ""


if __name__ == "__main__":
    main()
