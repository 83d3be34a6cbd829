"""The sbatch script of a training run, from its composed config.

One Slurm task per rank: `--nodes` is `hardware.num_nodes`, `--ntasks-per-node` is
`hardware.devices` (1 for a one-process strategy), and on GPUs each task gets one GPU. Each task
gets `hardware.cpus_per_node / devices` CPUs when the spec knows the node's CPUs. The script
exports the hardware's `env` (NCCL and network settings), runs `srun python train.py` in a run
directory named after the job, with `trainer.resume=auto`, and asks for SIGUSR1 before the time
limit: the run checkpoints and requeues itself, and the requeued job resumes in the same run
directory and W&B run (docs/LAUNCH.md, "Requeue").

Mixed hardware (`hardware.groups`) becomes one heterogeneous job: one component per node
group, in the spec's order (`#SBATCH hetjob` between them), each with its group's nodes, CPUs
and `env`, and one `srun --het-group=...` step over all of them, whose tasks Slurm numbers
consecutively across the components (the first group's ranks first, as the planner maps them);
`MASTER_ADDR` is the first component's first node and `MASTER_PORT` follows the job id. Each
component's part of the step (`srun ... : ...`) sets its own `--cpus-per-task`, its threads and
its group's `env`, and tells every task the whole step's task count (`SLURM_NTASKS`, which
Lightning's Slurm environment reads as the world size). Never run on a cluster (the test Slurm
has one node; a heterogeneous job needs one per component).
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from lightning_dist.callbacks.preemption import PREEMPTED_EXIT_CODE, REQUEUE_BY_SCRIPT
from lightning_dist.hardware import HardwareSpec

SIGNAL_DEATH_STATUS = 128 + 10
"""srun's exit status when a task was ended by SIGUSR1 (signal 10 on Linux)."""


@dataclass(kw_only=True)
class SlurmJob:
    """What one sbatch script asks of Slurm, and the training command it runs."""

    job_name: str = "lightning_dist"
    nodes: int = 1
    tasks_per_node: int = 1
    """Ranks per node; Lightning's SLURMEnvironment wants exactly `--ntasks-per-node`."""
    gpus_per_node: int = 0
    cpus_per_task: int | None = None
    """None leaves Slurm's default (one CPU per task)."""
    time: str = "01:00:00"
    requeue_signal_s: int = 120
    """Seconds before the time limit at which Slurm sends SIGUSR1."""
    partition: str | None = None
    account: str | None = None
    log_dir: str = "outputs/slurm"
    env: dict[str, str] = field(default_factory=dict)
    hardware_name: str = "cpu"
    overrides: list[str] = field(default_factory=list)
    """train.py overrides, without `hydra.run.dir` (the script sets it)."""
    run_dir: str = "outputs/slurm/${SLURM_JOB_NAME}-${SLURM_JOB_ID}"
    """Expanded by the shell in the job: the same folder for every requeue of the job."""
    workdir: str = "."
    python: str = sys.executable
    extra_sbatch: list[str] = field(default_factory=list)
    components: list[tuple[str, int, int | None, dict[str, str]]] = field(default_factory=list)
    """Mixed hardware: (group name, nodes, CPUs per task, env) of each heterogeneous job
    component, in the spec's order; empty: one component of `nodes`."""


def job_for(
    hardware: HardwareSpec,
    *,
    single_process: bool,
    overrides: list[str],
    workdir: str,
    cpus_per_task: int | None = None,
    **options,
) -> SlurmJob:
    """The job of a run on `hardware`: one task per rank. Raises ValueError for a GPU count
    Slurm cannot be asked for (`hardware.devices=-1`)."""
    if hardware.devices == -1:
        raise ValueError(
            f"hardware={hardware.name} has devices=-1 (every GPU of this machine); a Slurm job "
            "needs the GPUs per node: add hardware.devices=<GPUs per node>"
        )
    tasks = 1 if single_process else hardware.devices
    nodes = 1 if single_process else hardware.num_nodes
    if cpus_per_task is None and hardware.cpus_per_node:
        cpus_per_task = max(hardware.cpus_per_node // tasks, 1)
    run_dirs = [o.split("=", 1)[1] for o in overrides if o.startswith("hydra.run.dir=")]
    if run_dirs:
        options["run_dir"] = run_dirs[-1]
    components = []
    if hardware.mixed and not single_process:
        for name, group in hardware.groups.items():
            cpus = max(group.cpus_per_node // tasks, 1) if group.cpus_per_node else None
            components.append((name, group.num_nodes, cpus, dict(group.env)))
    options.setdefault("components", components)
    return SlurmJob(
        nodes=nodes,
        tasks_per_node=tasks,
        gpus_per_node=tasks if hardware.accelerator == "gpu" else 0,
        cpus_per_task=cpus_per_task,
        env=dict(hardware.env),
        hardware_name=hardware.name,
        overrides=[o for o in overrides if not o.startswith("hydra.run.dir=")],
        workdir=str(Path(workdir).resolve()),
        **options,
    )


def _resume_overrides(overrides: list[str]) -> list[str]:
    """`trainer.resume=auto`, unless the command already says where to start from."""
    keys = {o.lstrip("+~").split("=", 1)[0] for o in overrides}
    return [] if keys & {"trainer.resume", "trainer.ckpt_path"} else ["trainer.resume=auto"]


def sbatch_script(job: SlurmJob) -> str:
    """The text of the sbatch script."""
    ranks = job.nodes * job.tasks_per_node
    lines = [
        "#!/bin/bash",
        "# Written by `python -m lightning_dist.launch slurm`: "
        f"{job.nodes} node(s) x {job.tasks_per_node} task(s) = {ranks} rank(s), one per task.",
        f"#SBATCH --job-name={job.job_name}",
    ]
    components = job.components or [("", job.nodes, job.cpus_per_task, {})]
    account = [
        f"#SBATCH --{name}={value}"
        for name, value in (("partition", job.partition), ("account", job.account))
        if value
    ]
    for i, (name, nodes, cpus, _) in enumerate(components):
        if i:
            lines.append(f"#SBATCH hetjob  # component {i}: node group {name}")
        elif name:
            lines.append(f"# A heterogeneous job: component 0 is node group {name}")
        lines += [f"#SBATCH --nodes={nodes}", f"#SBATCH --ntasks-per-node={job.tasks_per_node}"]
        if job.gpus_per_node:
            lines.append(f"#SBATCH --gpus-per-node={job.gpus_per_node}")
        if cpus:
            lines.append(f"#SBATCH --cpus-per-task={cpus}")
        lines += account
        if i == 0:  # the job's own options go with its first component
            lines += [
                f"#SBATCH --time={job.time}",
                f"#SBATCH --signal=USR1@{job.requeue_signal_s}",
                "#SBATCH --requeue",
                "#SBATCH --open-mode=append",
                f"#SBATCH --output={job.log_dir}/%x-%j.out",
                f"#SBATCH --chdir={job.workdir}",
            ]
            lines += [f"#SBATCH {arg}" for arg in job.extra_sbatch]
    lines.append("")
    if job.env:
        lines.append(f"# NCCL and network settings of hardware={job.hardware_name}")
        lines += [f"export {name}={shlex.quote(str(v))}" for name, v in job.env.items()]
    if job.components:
        total = job.nodes * job.tasks_per_node
        lines += [
            "# A heterogeneous step: the rendezvous on the first component's first node, a port",
            "# from the job id, and every task told the whole step's task count (each",
            "# component's command below sets its own threads and its group's settings).",
            'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST_HET_GROUP_0" | '
            "head -n 1)",
            "export MASTER_PORT=$((10000 + SLURM_JOB_ID % 20000))",
        ]
    else:
        lines += [
            "# One thread per CPU Slurm gave the task; Slurm 22.05's srun does not take the CPUs",
            "# per task from sbatch by itself.",
            "export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}",
            "export SRUN_CPUS_PER_TASK=${SLURM_CPUS_PER_TASK:-1}",
        ]
    lines += [
        f'run_dir="{job.run_dir}"',
        "",
        "# SIGUSR1 (the --signal above, or scancel --signal=USR1): every rank checkpoints at the",
        "# next step boundary and exits 0 with summary.json saying requeue (75 from code that",
        "# predates this); this script then requeues the job, and the requeued job resumes here.",
        "# No --kill-on-bad-exit: a rank that fails while the others wait is ended by the",
        "# watchdog (trainer.collective_timeout_s).",
        f"export {REQUEUE_BY_SCRIPT}=1",
    ]
    train = [job.python, "-m", "lightning_dist", *job.overrides]  # = train.py, installed or not
    command = " ".join(shlex.quote(a) for a in train)
    resume = " ".join(_resume_overrides(job.overrides))
    step = f'{command} "hydra.run.dir=$run_dir" {resume}'.rstrip()
    if job.components:  # one srun over the components, each with its CPUs, threads and env
        parts = []
        for i, (_, _, cpus, env) in enumerate(job.components):
            settings = {
                "SLURM_NTASKS": str(total),
                **({"OMP_NUM_THREADS": str(cpus)} if cpus else {}),
                **env,
            }
            prefix = " ".join(f"{k}={shlex.quote(str(v))}" for k, v in settings.items())
            cpu = f" --cpus-per-task={cpus}" if cpus else ""
            parts.append(f"--het-group={i}{cpu} env {prefix} {step}")
        launch = "srun " + " \\\n    : ".join(parts)
    else:
        launch = f"srun {step}"
    lines += [
        launch,
        "status=$?",
        f"# {SIGNAL_DEATH_STATUS} = 128 + SIGUSR1: the signal came while Python started or exited,",
        "# where train.py cannot catch it; requeue unless the run had finished.",
        "requeue=0",
        f'if {{ [ "$status" -eq 0 ] || [ "$status" -eq {PREEMPTED_EXIT_CODE} ]; }} \\',
        '    && grep -qs \'"requeue": true\' "$run_dir/summary.json"',
        "then requeue=1; fi",
        f'if [ "$status" -eq {SIGNAL_DEATH_STATUS} ] && ! grep -qs \'"status": "completed"\' \\',
        '    "$run_dir/summary.json"; then requeue=1; fi',
        'if [ "$requeue" -eq 1 ]; then',
        '    echo "requeueing SLURM job $SLURM_JOB_ID"; scontrol requeue "$SLURM_JOB_ID"; fi',
        'exit "$status"',
    ]
    return "\n".join(lines) + "\n"
