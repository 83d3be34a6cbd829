"""`python -m lightning_dist.launch slurm --dry-run`: the sbatch script of every hardware
profile, and the submitit launcher config sized the same way. One process, no Slurm needed; the
scripts run on a real Slurm in tests/cluster/test_slurm.py. The GPU lines (--gpus-per-node, NCCL
variables) are checked as text here: on this CPU machine no GPU job can run."""

from __future__ import annotations

import pytest

from lightning_dist.config import choice_names, compose_config, hardware_spec
from lightning_dist.launch.__main__ import main

BATCH = "data.global_batch_size=64"  # divisible by every profile's ranks (up to 2 x 8)


def _dry_run(capsys, *args: str) -> str:
    main(["slurm", "--dry-run", *args])
    return capsys.readouterr().out


@pytest.mark.parametrize("hardware", choice_names("hardware"))
def test_dry_run_script_follows_the_hardware_profile(hardware, capsys):
    spec = hardware_spec(compose_config([f"hardware={hardware}", "paths.output_dir=x"]))
    devices = spec.devices if spec.devices != -1 else 4  # `gpu` needs the count spelled out
    overrides = [f"hardware={hardware}", f"hardware.devices={devices}", "hardware.num_nodes=2",
                 "strategy=ddp", BATCH]  # fmt: skip
    lines = _dry_run(capsys, *overrides, "--time", "02:00:00").splitlines()
    assert lines[0] == "#!/bin/bash"
    assert "#SBATCH --nodes=2" in lines and f"#SBATCH --ntasks-per-node={devices}" in lines
    gpus = [line for line in lines if line.startswith("#SBATCH --gpus-per-node=")]
    assert gpus == ([f"#SBATCH --gpus-per-node={devices}"] if spec.accelerator == "gpu" else [])
    cpus = [line for line in lines if line.startswith("#SBATCH --cpus-per-task=")]
    share = spec.cpus_per_node and spec.cpus_per_node // devices  # the node's CPUs per rank
    assert cpus == ([f"#SBATCH --cpus-per-task={share}"] if share else [])
    assert "#SBATCH --time=02:00:00" in lines and "#SBATCH --signal=USR1@120" in lines
    assert "#SBATCH --requeue" in lines
    for name, value in spec.env.items():  # the NCCL settings of the profile
        assert f"export {name}={value}" in lines
    if spec.accelerator == "gpu":
        assert any(line.startswith("export NCCL_") for line in lines)
    (srun,) = [line for line in lines if line.startswith("srun ")]
    assert "/train.py " in srun and " ".join(overrides) in srun
    assert srun.endswith('"hydra.run.dir=$run_dir" trainer.resume=auto')
    assert 'scontrol requeue "$SLURM_JOB_ID"' in lines[-2]
