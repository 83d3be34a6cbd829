"""OmegaConf resolvers: the run's name and home (`run_home`, used by conf/train.yaml's
`hydra.run.dir`), and those that size `conf/hydra/launcher/submitit_slurm.yaml` from the run's
hardware and strategy, the same way the sbatch script of `lightning_dist.launch.slurm` is sized:
one task per rank, one GPU per task on GPUs, the node's CPUs shared among its tasks, and the
hardware's `env` exported before srun.

The launcher is built once per sweep from the command's own config, so these follow the
hardware and strategy given on the command line, not values swept over (`strategy=ddp,fsdp2`
is fine; sweeping `hardware.devices` is not).
"""

from __future__ import annotations

import re
from typing import Any

from omegaconf import OmegaConf

SINGLE_PROCESS_STRATEGIES = ("single",)
"""Strategies that run one process (the `single_process` of lightning_dist.contract)."""


def tasks_per_node(strategy: str, devices: int) -> int:
    return 1 if strategy in SINGLE_PROCESS_STRATEGIES else int(devices)


def gpus_per_node(accelerator: str, strategy: str, devices: int) -> int | None:
    return tasks_per_node(strategy, devices) if accelerator == "gpu" else None


def cpus_per_task(cpus_per_node: int | None, strategy: str, devices: int) -> int:
    if not cpus_per_node:
        return 1
    return max(int(cpus_per_node) // tasks_per_node(strategy, devices), 1)


def setup_lines(env: Any) -> str:
    """`export` lines: the hardware's environment, and one OpenMP thread per CPU of the task.
    One string, the lines joined: Hydra resolves a list-typed key too early for the hardware."""
    import shlex

    values = OmegaConf.to_container(env) if OmegaConf.is_config(env) else dict(env or {})
    lines = [f"export {k}={shlex.quote(str(v))}" for k, v in values.items()]
    # `$X`, not `${X}`: OmegaConf would read the braces as an interpolation of its own.
    return "\n".join([*lines, "export OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK"])


RUN_NAME_CHARACTERS = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=+-]{0,127}$")
RUNS_FOLDER = "outputs"
"""Where a run's home is made, relative to the working directory, unless `hydra.run.dir` is given."""


def run_name(name: str | None, model: str, strategy: str, hardware: str) -> str:
    """The run's name: `run_name` when set, else `<model>-<strategy>-<hardware>` from the
    config choices (`tiny-ddp-cpu`). ValueError for a name that is not one folder name."""
    if name is None or name == "":
        return f"{model}-{strategy}-{hardware}".replace("/", "_")
    name = str(name)
    if not RUN_NAME_CHARACTERS.match(name):
        raise ValueError(
            f"run_name={name!r} must be one folder name: letters, digits and . _ = + - (128 at "
            "most, not starting with a dot or dash); for example run_name=llama8b-fsdp-try2"
        )
    return name


def run_home(name: str | None, model: str, strategy: str, hardware: str) -> str:
    """`outputs/<run name>`: the folder every attempt of the run writes (conf/train.yaml)."""
    return f"{RUNS_FOLDER}/{run_name(name, model, strategy, hardware)}"


RESOLVERS = {
    "run_home": run_home,
    "slurm_tasks_per_node": tasks_per_node,
    "slurm_gpus_per_node": gpus_per_node,
    "slurm_cpus_per_task": cpus_per_task,
    "slurm_setup": setup_lines,
}


def register_resolvers() -> None:
    """Register the resolvers; idempotent."""
    import warnings

    # submitit_slurm.yaml is complete by itself; Hydra's note that it is also checked against the
    # plugin's schema of the same name asks nothing of the user.
    warnings.filterwarnings("ignore", message=r"\s*'hydra/launcher/submitit_slurm' is validated")
    for name, function in RESOLVERS.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, function)
