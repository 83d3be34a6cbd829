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


ONE_KIND = [h for h in choice_names("hardware") if not h.startswith("mixed_")]
"""The hardware specs of one kind of node (mixed ones: the heterogeneous-job test below)."""


@pytest.mark.parametrize("hardware", ONE_KIND)
def test_dry_run_script_follows_the_hardware_profile(hardware, capsys):
    spec = hardware_spec(compose_config([f"hardware={hardware}", "paths.output_dir=x"]))
    devices = spec.devices if spec.devices != -1 else 4  # `gpu` needs the count spelled out
    overrides = [
        f"hardware={hardware}",
        f"hardware.devices={devices}",
        "hardware.num_nodes=2",
        "strategy=ddp",
        BATCH,
    ]
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
    assert " -m lightning_dist " in srun and " ".join(overrides) in srun
    assert srun.endswith('"hydra.run.dir=$run_dir" trainer.resume=auto')
    assert 'scontrol requeue "$SLURM_JOB_ID"' in lines[-2]


def test_dry_run_single_process_strategy_is_one_task(capsys):
    lines = _dry_run(capsys, "strategy=single", "hardware.devices=2").splitlines()
    assert "#SBATCH --nodes=1" in lines and "#SBATCH --ntasks-per-node=1" in lines


def test_dry_run_keeps_a_given_run_dir_and_resume(capsys):
    text = _dry_run(capsys, "hydra.run.dir=/data/run7", "trainer.resume=auto")
    assert 'run_dir="/data/run7"' in text and text.count("trainer.resume=auto") == 1


@pytest.mark.parametrize(
    "args, message",
    [
        (["hardware=gpu"], "hardware=gpu has devices=-1"),
        (["hardware=dgx_h100", "data.global_batch_size=12"], "not divisible"),
        (["strategy=nope"], "Could not find 'strategy/nope'"),
        (["strategy"], "is not a KEY=VALUE override"),
    ],
    ids=["gpu_without_count", "batch_split", "unknown_strategy", "no_equals"],
)
def test_dry_run_refuses_a_bad_run_in_one_line(args, message, capsys):
    with pytest.raises(SystemExit) as stop:
        _dry_run(capsys, *args)
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and len(err.splitlines()) == 1 and message in err, err


@pytest.mark.filterwarnings(r"ignore:\s*'hydra/launcher/submitit_slurm' is validated")
def test_submitit_launcher_config_is_sized_from_the_hardware():
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from lightning_dist.config import CONF_DIR

    overrides = ["hydra/launcher=submitit_slurm", "hardware=dgx_h100", "hardware.num_nodes=2"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=overrides, return_hydra_config=True)
    launcher = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    assert launcher["_target_"].endswith("submitit_launcher.SlurmLauncher")
    assert (launcher["nodes"], launcher["tasks_per_node"], launcher["gpus_per_node"]) == (2, 8, 8)
    assert launcher["cpus_per_task"] == 224 // 8
    assert launcher["additional_parameters"] == {"signal": "USR1@120", "requeue": True}
    (setup,) = launcher["setup"]
    assert "export NCCL_IB_HCA=mlx5" in setup.splitlines()


def test_mixed_hardware_is_one_heterogeneous_job_in_the_groups_order(capsys):
    """hardware=mixed_h100_a100: a component per node group (H100s first, as the ranks map),
    each with its group's nodes and CPUs, the job's options in the first, the groups' shared
    NCCL settings, the rendezvous on the first component and one srun over both."""
    lines = _dry_run(
        capsys,
        "hardware=mixed_h100_a100",
        "model=llama3_70b",
        "strategy=3d",
        "strategy.tp=8",
        "strategy.pp=4",
    ).splitlines()
    het = lines.index("#SBATCH hetjob  # component 1: node group a100")
    first, second = lines[:het], lines[het:]
    assert "# A heterogeneous job: component 0 is node group h100" in first
    assert first.count("#SBATCH --nodes=2") == 1 and second.count("#SBATCH --nodes=2") == 1
    assert "#SBATCH --cpus-per-task=28" in first and "#SBATCH --cpus-per-task=32" in second
    assert "#SBATCH --requeue" in first and "#SBATCH --time=01:00:00" in first
    assert "#SBATCH --time=01:00:00" not in second
    assert any(line.startswith("export MASTER_ADDR=$(scontrol show hostnames") for line in lines)
    assert "export MASTER_PORT=$((10000 + SLURM_JOB_ID % 20000))" in lines
    assert not any(line.startswith("export SRUN_CPUS_PER_TASK") for line in lines)
    at = next(i for i, line in enumerate(lines) if line.startswith("srun "))
    first, second = lines[at], lines[at + 1]  # one step, a part per component
    assert first.startswith(
        "srun --het-group=0 --cpus-per-task=28 env SLURM_NTASKS=32 "
        "OMP_NUM_THREADS=28 NCCL_IB_DISABLE=0 NCCL_IB_HCA=mlx5"
    )
    assert second.startswith(
        "    : --het-group=1 --cpus-per-task=32 env SLURM_NTASKS=32 OMP_NUM_THREADS=32 "
    )
    assert first.rstrip(" \\").endswith("trainer.resume=auto")
    assert second.endswith('"hydra.run.dir=$run_dir" trainer.resume=auto')
