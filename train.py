"""Train a language model: `python train.py [model=...] [strategy=...] [hardware=...] [KEY=VALUE ...]`.

Thin on purpose: Hydra composes conf/train.yaml, `lightning_dist.train.train(cfg)` does the work.
"""

import os
import sys

import hydra

from lightning_dist.config import CONF_DIR
from lightning_dist.run.errors import (
    ConfigError,
    config_errors,
    guard_command_line,
    report_config_error,
)

NON_FINITE_EXIT_CODE = 3
CHECKPOINT_WRITE_EXIT_CODE = 2
REPLICA_GROUP_EXIT_CODE = 6
"""strategy=ft_hsdp: a group behind the others (torchrun relaunches it, and it heals from a
peer), relaunched with no peer left to heal from, or left without its Lighthouse."""
"""A checkpoint that could not be written: like a configuration error, the user's to fix."""

guard_command_line()  # Hydra-level overrides that run code, and Hydra's errors in one line


@hydra.main(config_path=str(CONF_DIR), config_name="train", version_base="1.3")
def main(cfg) -> None:
    from lightning_dist.run.checks import check_config_text

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
    from lightning_dist.parallel.replica_groups import (
        LighthouseLost,
        ReplicaGroupAlone,
        ReplicaGroupFellBehind,
    )
    from lightning_dist.train import train

    try:
        result = train(cfg)
    except ConfigError as e:
        report_config_error(e)  # one line, secrets redacted, exit 2
    except (CheckpointWriteError, LighthouseLost) as e:  # mid-run; the line names the rank
        from lightning_dist.strategies.launch import rank_exit_code

        print(f"error: {e}", file=sys.stderr, flush=True)
        lost = isinstance(e, LighthouseLost)
        sys.exit(rank_exit_code(REPLICA_GROUP_EXIT_CODE if lost else CHECKPOINT_WRITE_EXIT_CODE))
    except (ReplicaGroupAlone, ReplicaGroupFellBehind) as e:  # ft_hsdp: torchrun relaunches
        print(f"error: {_rank_named()}{e}", file=sys.stderr, flush=True)
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
    from lightning_dist.runtime.process_end import run_then_end

    run_then_end(main)  # its exit status is the work's, never a C++ destructor's at teardown
