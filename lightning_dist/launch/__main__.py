"""`python -m lightning_dist.launch slurm [options] <train.py overrides>`: write the sbatch script
of a training run and submit it (`--dry-run` prints it instead). Every override train.py takes
works here; the run is checked (config, layout, batch split) before anything is submitted.

    python -m lightning_dist.launch slurm strategy=fsdp2 hardware=dgx_h100 hardware.num_nodes=4 \\
        model=llama3_8b --time 12:00:00 --partition gpu

Exit status: 0 when written (and submitted), 2 for a bad config or option, sbatch's own status
when it refuses the job.

`python -m lightning_dist.launch torchrun <torchrun arguments>` is torchrun with the settings
elastic jobs need (lightning_dist/launch/torchrun.py; docs/MULTINODE.md, "Elastic jobs").

`python -m lightning_dist.launch replicas --groups N --nproc-per-group M <overrides>` starts a
`strategy=ft_hsdp` job whose replica groups heal live (lightning_dist/launch/replicas.py).
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import time
from pathlib import Path


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m lightning_dist.launch",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    slurm = parser  # one cluster so far; its name comes first, as in `launch slurm ...`
    slurm.add_argument(
        "cluster", choices=["slurm"], help="slurm: write an sbatch script (for torchrun: see below)"
    )
    slurm.add_argument("overrides", nargs="*", help="train.py overrides, e.g. strategy=fsdp2")
    slurm.add_argument("--dry-run", action="store_true", help="print the script; submit nothing")
    slurm.add_argument("--job-name", default="lightning_dist")
    slurm.add_argument("--time", default="01:00:00", help="time limit (sbatch --time)")
    slurm.add_argument(
        "--signal-s",
        type=int,
        default=120,
        dest="requeue_signal_s",
        help="send SIGUSR1 this many seconds before the time limit",
    )
    slurm.add_argument("--partition")
    slurm.add_argument("--account")
    slurm.add_argument("--cpus-per-task", type=int, help="default: the node's CPUs / tasks")
    slurm.add_argument("--log-dir", default="outputs/slurm", help="scripts and job logs")
    slurm.add_argument(
        "--sbatch-arg",
        action="append",
        default=[],
        dest="extra_sbatch",
        metavar="ARG",
        help="one more #SBATCH line, e.g. --sbatch-arg=--exclusive",
    )
    return parser


def _job(args: argparse.Namespace):
    """The checked run, as a SlurmJob; config errors end with `error: ...` and status 2."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from lightning_dist.config import compose_config
    from lightning_dist.contract import contract_of
    from lightning_dist.launch.slurm import job_for
    from lightning_dist.run.errors import config_errors, report_config_error
    from lightning_dist.run.plan import plan_run

    options = {
        k: getattr(args, k)
        for k in (
            "job_name",
            "time",
            "requeue_signal_s",
            "partition",
            "account",
            "log_dir",
            "extra_sbatch",
        )
    }
    try:
        with config_errors():
            # The run directory is the job's; any placeholder lets the config be checked here.
            cfg = compose_config([*args.overrides, "paths.output_dir=outputs/slurm/check"])
            plan = plan_run(cfg)
            return job_for(
                plan.hardware,
                single_process=contract_of(plan.strategy).single_process,
                overrides=list(args.overrides),
                workdir=".",
                cpus_per_task=args.cpus_per_task,
                **options,
            )
    except (ValueError, HydraException, OmegaConfBaseException) as e:  # ConfigError is a ValueError
        report_config_error(e)


def _submit(script: str, log_dir: Path, job_name: str) -> None:
    log_dir.mkdir(parents=True, exist_ok=True)
    path = log_dir / f"{job_name}-{time.strftime('%Y%m%d-%H%M%S')}.sbatch"
    path.write_text(script)
    result = subprocess.run(["sbatch", "--parsable", str(path)], capture_output=True, text=True)
    if result.returncode:
        print(f"error: sbatch {path} failed: {result.stderr.strip()}", file=sys.stderr)
        sys.exit(result.returncode)
    job_id = result.stdout.strip().split(";")[0]
    print(f"submitted Slurm job {job_id}: script {path}, log {log_dir}/{job_name}-{job_id}.out")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["replicas"]:
        from lightning_dist.launch.replicas import main as run_replicas

        run_replicas(argv[1:])
        return
    if argv[:1] == ["torchrun"]:
        from lightning_dist.launch.torchrun import run_torchrun

        run_torchrun(argv[1:])
        return
    args = _parser().parse_intermixed_args(argv)
    bad = [o for o in args.overrides if "=" not in o]
    if bad:
        print(f"error: {shlex.join(bad)} is not a KEY=VALUE override of train.py", file=sys.stderr)
        sys.exit(2)
    job = _job(args)
    from lightning_dist.launch.slurm import sbatch_script

    script = sbatch_script(job)
    if args.dry_run:
        print(script, end="")
    else:
        _submit(script, Path(args.log_dir), args.job_name)


if __name__ == "__main__":
    main()
