"""How Lightning's launcher re-runs `train.py` for ranks 1..N-1 under Hydra.

Lightning's own command for Hydra children repeats `sys.argv`, which under `-m` (multirun)
starts a whole sweep in every child, and points children at `hydra.run.dir`, which under a
sweep is not the job's directory. We give each child exactly this job's overrides and this
job's output directory, so a multi-process run writes one run directory.

A multirun runs its jobs one after another in the process that is rank 0 of each. Lightning
leaves that process with the finished job's process group and the launcher's variables
(`LOCAL_RANK` above all, which tells the next launcher that someone else started the ranks), so
the next job would start no processes and talk to the previous job's exited ranks.
`end_job` undoes both once a job is over: every job starts its own ranks.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
from typing import Any

LAUNCHER_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE")
"""What Lightning's subprocess launcher writes into the launching process's environment."""

_before_launch: dict[str, str | None] = {}


def _child_command(local_rank: int) -> tuple[list[str], str]:
    from hydra.core.hydra_config import HydraConfig
    from hydra.utils import get_original_cwd, to_absolute_path

    import __main__

    hydra_cfg = HydraConfig.get()
    if __main__.__spec__ is None:
        command = [sys.executable, to_absolute_path(sys.argv[0])]
    else:
        command = [sys.executable, "-m", __main__.__spec__.name]
    command += list(hydra_cfg.overrides.task)
    command += [
        f"hydra.run.dir={hydra_cfg.runtime.output_dir}",
        f"hydra.job.name={hydra_cfg.job.name}_rank{local_rank}",
        "hydra.output_subdir=null",
    ]
    return command, get_original_cwd()


def fix_hydra_child_command() -> None:
    """Make Lightning's subprocess launcher start children with this job's own overrides, and
    remember the launcher variables as they are before it runs (see `end_job`)."""
    from lightning_dist._compat import replace_hydra_child_command

    _before_launch.clear()
    _before_launch.update({name: os.environ.get(name) for name in LAUNCHER_VARIABLES})
    if not started_by_rank_zero():  # a rank Lightning started keeps its launcher's pid
        os.environ[LAUNCHER_PID] = str(os.getpid())
    replace_hydra_child_command(_child_command)


def end_job(trainer: Any, timeout: float = 300.0) -> None:
    """Once a job has finished without error: every rank waits for the others at a bounded
    barrier (`lightning_dist.runtime.process_end.end_barrier`). Then, in the process that
    launched the ranks (or ran a one-rank job): wait for the other ranks, destroy the process
    group and restore the launcher variables, so that a multirun's next job starts its own
    ranks. Every other rank (started by Lightning, torchrun or Slurm) keeps its group: a process
    that ends through `end_process` leaves it to `os._exit`, and in a user's script, which Python
    ends, an `atexit` handler destroys it while Python is still whole; a torchrun- or
    Slurm-started process that runs several jobs keeps its group until then. Only called after success: a rank that destroys the group while another
    still waits in a collective would hang it."""
    import torch.distributed as dist

    from lightning_dist._compat import process_group_timeout
    from lightning_dist.runtime.process_end import end_barrier

    # Every rank of the job meets once more (bounded), so none leaves while a peer still works.
    end_barrier(process_group_timeout(trainer.strategy).total_seconds())
    children = getattr(getattr(trainer.strategy, "launcher", None), "procs", None) or []
    # A one-rank job (ddp with hardware.devices=1) starts no children but leaves a process group
    # of one and the launcher's variables just the same; the next job would reuse both.
    launched_here = bool(children) or (trainer.world_size == 1 and dist.is_initialized())
    if not launched_here:
        if dist.is_initialized():
            _destroy_group_at_exit()
        return
    for rank, child in enumerate(children, start=1):
        try:
            code = child.wait(timeout)
        except subprocess.TimeoutExpired:  # a rank that outlives its job must not block the next
            child.kill()
            code = child.wait()
        if code:
            print(f"warning: rank {rank} of this job exited with status {code}", file=sys.stderr)
    if dist.is_initialized():
        dist.destroy_process_group()
        from lightning_dist._compat import clear_dtensor_caches

        clear_dtensor_caches()  # the next job's meshes must not meet this job's in torch's caches
    for name, value in _before_launch.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


LAUNCHER_PID = "LIGHTNING_DIST_LAUNCHER_PID"
"""Set by `fix_hydra_child_command` in the process that may launch ranks; inherited by them."""


_PARENT_AT_START = os.getppid()
"""This process's parent when the module was imported (`train()` imports it first thing): a
rank whose launcher has exited since has been handed to init, and its parent is no longer
rank 0, but it was still started by it."""


def started_by_rank_zero() -> bool:
    """True in a rank that Lightning's own launcher started: a child of the process that set
    `LAUNCHER_PID` (rank 0), not of torchrun, srun or a shell. Rank 0 carries its job's status."""
    launcher = os.environ.get(LAUNCHER_PID)
    return launcher is not None and launcher.isdigit() and _PARENT_AT_START == int(launcher)


def rank_exit_code(code: int) -> int:
    """The exit status of this rank for a job that preempted (75) or stopped on a NaN (3). A
    child of Lightning's launcher exits 0: the launcher kills every rank, rank 0 included, as
    soon as it sees a child exit non-zero, and rank 0 must be left to finish its summary and
    exit with `code` itself."""
    return 0 if code and started_by_rank_zero() else code


_exit_hook: list[bool] = []


def _destroy_group_at_exit() -> None:
    """Register, once per process, the destruction of the default process group at exit."""
    if _exit_hook:
        return
    _exit_hook.append(True)

    def destroy() -> None:
        import torch.distributed as dist

        from lightning_dist.runtime.process_end import ending

        if dist.is_initialized() and not ending():  # end_process: no teardown follows
            dist.destroy_process_group()

    atexit.register(destroy)
